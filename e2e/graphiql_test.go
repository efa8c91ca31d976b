package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/computeql/computeql/auth"
)

// setQuery replaces the text of GraphiQL's query editor (a CodeMirror 5 instance).
func setQuery(q string) chromedp.Action[chromedp.Void] {
	return chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`document.querySelector('.graphiql-query-editor .CodeMirror').CodeMirror.setValue(%s)`, strconv.Quote(q)))
}

// responseContains waits until GraphiQL's response pane shows s.
func responseContains(s string) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](fmt.Sprintf(
		`(() => { const cm = document.querySelector('.graphiql-response .CodeMirror'); return !!cm && cm.CodeMirror.getValue().includes(%s); })()`,
		strconv.Quote(s)))
}

// TestGraphiQLRunsQueriesAndSubscriptionsOffline: the GraphiQL page, every file of which the
// binary serves (the browser resolves no host but loopback and the test fails on any request
// to another origin), signs in from its link, runs a query, and runs a subscription over a
// WebSocket that shows a change made after it started.
func TestGraphiQLRunsQueriesAndSubscriptionsOffline(t *testing.T) {
	sys := startSystem(t)
	b := newBrowser(t, sys.URL)
	tok := sys.token(t, "grace", auth.Grant{OrganizationID: "acme", Role: auth.RoleAdmin})
	id := sys.createInstance(t, tok, "gq-1", "g1.small")

	b.do(t, "open GraphiQL from a sign-in link",
		chromedp.Navigate(signInLink(sys.URL, "/graphiql", tok)),
		visible(".graphiql-execute-button"),
		visible(".graphiql-query-editor .CodeMirror"),
	)
	if hash := eval[string](t, b, `window.location.hash`); hash != "" {
		t.Errorf("the token stayed in the address bar: %q", hash)
	}

	b.do(t, "run a query",
		setQuery(`{ me { subject grants { organizationId role } } }`),
		click(".graphiql-execute-button"),
		responseContains(`"subject": "grace"`),
	)

	b.do(t, "run a subscription",
		setQuery(`subscription { instanceEvents(organizationId: "acme") { kind instance { name description } } }`),
		click(".graphiql-execute-button"),
		responseContains(`"name": "gq-1"`),
	)
	// The change is made only once the stream shows the snapshot, so seeing it proves the
	// subscription delivers live events, not just a first read.
	sys.graphql(t, tok, `mutation($id: ID!) { updateInstance(input: {id: $id, description: "changed while watched"}) { userErrors { field code message } } }`,
		map[string]any{"id": id})
	b.do(t, "see the live change", responseContains(`"description": "changed while watched"`))
	b.screenshot(t, "graphiql-subscription")
	b.do(t, "stop the subscription", click(".graphiql-execute-button"))
}

// TestGraphiQLOpensOnAnExample: the first time, the editor holds a commented example that
// runs as it is and lists the caller's instances.
func TestGraphiQLOpensOnAnExample(t *testing.T) {
	sys := startSystem(t)
	b := newBrowser(t, sys.URL)
	tok := sys.token(t, "ivan", auth.Grant{OrganizationID: "acme", Role: auth.RoleAdmin})
	sys.createInstance(t, tok, "ex-1", "g1.small")

	b.do(t, "open GraphiQL",
		chromedp.Navigate(signInLink(sys.URL, "/graphiql", tok)),
		visible(".graphiql-query-editor .CodeMirror"),
	)
	doc := eval[string](t, b, `document.querySelector('.graphiql-query-editor .CodeMirror').CodeMirror.getValue()`)
	if !strings.HasPrefix(doc, "# Welcome to ComputeQL.") || !strings.Contains(doc, "instances(organizationId: \"acme\"") {
		t.Fatalf("the editor opens on %q, want the commented example", doc)
	}
	b.do(t, "run the example", click(".graphiql-execute-button"), responseContains(`"name": "ex-1"`))
}
