package e2e

import (
	"context"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/computeql/computeql/auth"
)

// eventSourceScript asks for a stream ticket with the token, opens an EventSource on the
// operation with it, and resolves with the kinds of instance events received up to SYNCED, or
// with "complete" once a complete event fires.
const eventSourceScript = `(async () => {
  const r = await fetch('/graphql', {method: 'POST', headers: {'Content-Type': 'application/json', 'Authorization': 'Bearer ' + TOKEN},
    body: JSON.stringify({query: 'mutation { createStreamTicket { ticket } }'})});
  const ticket = (await r.json()).data.createStreamTicket.ticket;
  return await new Promise((resolve, reject) => {
    const es = new EventSource('/graphql?query=' + encodeURIComponent(QUERY) + '&ticket=' + encodeURIComponent(ticket));
    const kinds = [];
    es.addEventListener('next', (e) => {
      const ev = JSON.parse(e.data).data;
      if (ev && ev.instanceEvents) {
        kinds.push(ev.instanceEvents.kind);
        if (ev.instanceEvents.kind === 'SYNCED') { es.close(); resolve(kinds.join(',')); }
      }
    });
    es.addEventListener('complete', () => { es.close(); resolve(kinds.concat('complete').join(',')); });
    es.onerror = () => { es.close(); reject(new Error('EventSource failed')); };
  });
})()`

// TestEventSourceWithAStreamTicket: a browser's own EventSource, which can set no header,
// subscribes with a stream ticket and gets the snapshot and SYNCED; a query's stream fires its
// complete event, which needs a data line to be dispatched at all.
func TestEventSourceWithAStreamTicket(t *testing.T) {
	sys := startSystem(t)
	b := newBrowser(t, sys.URL)
	tok := sys.token(t, "carol", auth.Grant{OrganizationID: "acme", ProjectID: "web", Role: auth.RoleMember})
	sys.createInstance(t, tok, "web-1", "g1.small")
	b.do(t, "open the dashboard", chromedp.Navigate(sys.URL+"/"))
	run := func(query string) string {
		t.Helper()
		script := strings.NewReplacer("TOKEN", jsString(tok), "QUERY", jsString(query)).Replace(eventSourceScript)
		ctx, cancel := context.WithTimeout(b.ctx, pageTimeout)
		defer cancel()
		got, err := chromedp.Run(ctx, chromedp.Evaluate[string](script, chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatalf("EventSource on %s: %v", query, err)
		}
		return got
	}
	if got := run(`subscription { instanceEvents(organizationId: "acme", projectId: "web") { kind } }`); got != "SNAPSHOT,SYNCED" {
		t.Errorf("subscription over EventSource: %s, want SNAPSHOT,SYNCED", got)
	}
	if got := run(`{ me { subject } }`); got != "complete" {
		t.Errorf("query over EventSource: %s, want its complete event", got)
	}
}

// jsString quotes s as a JavaScript string literal.
func jsString(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`, "\n", `\n`).Replace(s) + "'"
}
