package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/sshtest"
)

// signIn opens the dashboard and signs in through its form, waiting until the instance table
// is live.
func signIn(t *testing.T, b *browser, sys *system, token string) {
	t.Helper()
	b.do(t, "sign in",
		chromedp.Navigate(sys.URL+"/"),
		chromedp.SendKeys(chromedp.ID("signin-token"), token),
		click(`#signin-form button[type="submit"]`),
		visible(`#live[data-state="live"]`),
	)
}

// TestDashboardFollowsAnInstanceLive: a member signs in, sees the instances that exist, creates
// one through the form and watches its row go from BUILDING to RUNNING, stops it, reads its
// history and deletes it, all without the page reloading.
func TestDashboardFollowsAnInstanceLive(t *testing.T) {
	sys := startSystem(t)
	b := newBrowser(t, sys.URL)
	tok := sys.token(t, "alice", auth.Grant{OrganizationID: "acme", ProjectID: "web", Role: auth.RoleMember})
	sys.createInstance(t, tok, "api-1", "g1.small")
	stopped := sys.createInstance(t, tok, "api-2", "g1.medium")
	sys.graphql(t, tok, `mutation($id: ID!) { stopInstance(input: {id: $id}) { userErrors { field code message } } }`, map[string]any{"id": stopped})

	signIn(t, b, sys, tok)
	if who := b.text(t, "#whoami"); who != "alice" {
		t.Errorf("signed in as %q, want alice", who)
	}
	b.do(t, "instances from the snapshot", visible(row("api-1")), visible(row("api-2")))
	// A property of the page's global object lives exactly as long as the page: a reload or a
	// navigation would drop it.
	eval[chromedp.Void](t, b, `window.sameDocument = true`)

	b.do(t, "create web-1 through the form",
		click("#new-instance"),
		visible(`#c-sgs input[value="sg-acme-web-eu-ssh"]`),
		chromedp.SendKeys(chromedp.ID("c-name"), "web-1"),
		chromedp.SetValue(chromedp.ID("c-flavor"), "g1.small"),
		chromedp.SetValue(chromedp.ID("c-image"), "ubuntu-24.04"),
		click(`#c-sgs input[value="sg-acme-web-eu-ssh"]`),
		click(`#c-publicip`),
		click(`#create button[type="submit"]`),
		chromedp.WaitNotVisible(chromedp.ID("create")),
	)
	b.do(t, "web-1 building", visible(cell("web-1", "power", "BUILDING")))
	b.screenshot(t, "dashboard-building")
	b.do(t, "web-1 running",
		visible(cell("web-1", "power", "RUNNING")),
		visible(cell("web-1", "provisioning", "PROVISIONED")),
		visible(cell("api-1", "power", "RUNNING")),
		visible(cell("api-2", "power", "STOPPED")),
	)
	if ips := b.text(t, row("web-1")+` td[data-col="ips"]`); strings.Count(ips, ".") != 6 {
		t.Errorf("web-1 shows IPs %q, want a private and a public IPv4 address", ips)
	}
	b.screenshot(t, "dashboard")

	b.do(t, "stop web-1",
		click(row("web-1")+` button[data-action="stop"]`),
		visible(cell("web-1", "power", "STOPPED")),
	)
	b.do(t, "open web-1's history",
		click(row("web-1")+` td[data-col="name"] a`),
		visible("#history"),
	)
	for _, want := range []string{"CREATED", "STATUS_CHANGED", "ACTION STOP"} {
		b.do(t, "history shows "+want, chromedp.Poll[chromedp.Void](fmt.Sprintf(`document.querySelector('#history').textContent.includes(%q)`, want)))
	}
	if by := b.text(t, `#detail dd[data-key="Desired power"]`); by != "STOPPED" {
		t.Errorf("detail shows desired power %q, want STOPPED", by)
	}
	b.screenshot(t, "dashboard-detail")

	b.do(t, "delete web-1",
		click(row("web-1")+` button[data-action="delete"]`),
		click(row("web-1")+` button[data-action="confirm-delete"]`),
		gone(row("web-1")),
	)
	if !eval[bool](t, b, `window.sameDocument === true`) {
		t.Error("the page reloaded")
	}
	if n := eval[int](t, b, `document.querySelectorAll('#instances tbody tr').length`); n != 2 {
		t.Errorf("%d rows left, want api-1 and api-2", n)
	}
}

// TestDashboardShowsEveryErrorByItsField: the create form shows each userError of the API
// next to the field it names, all of them at once, and nothing besides.
func TestDashboardShowsEveryErrorByItsField(t *testing.T) {
	sys := startSystem(t)
	b := newBrowser(t, sys.URL)
	tok := sys.token(t, "alice", auth.Grant{OrganizationID: "acme", ProjectID: "web", Role: auth.RoleMember})
	sys.createInstance(t, tok, "taken", "g1.small")
	signIn(t, b, sys, tok)

	tests := []struct {
		name                string
		instance            string
		flavor, image       string
		sg                  bool
		want                map[string]string // field -> code
		wantMessageContains string
		screenshot          string
	}{
		{name: "malformed name", instance: "-web-", flavor: "g1.small", image: "ubuntu-24.04",
			want: map[string]string{"name": "BAD_USER_INPUT"}, wantMessageContains: "starting and ending with a letter or digit"},
		{name: "name taken", instance: "taken", flavor: "g1.small", image: "ubuntu-24.04",
			want: map[string]string{"name": "CONFLICT"}},
		{name: "image too large for the flavor", instance: "win-1", flavor: "g1.small", image: "windows-2022",
			want: map[string]string{"imageId": "UNPROCESSABLE"}, wantMessageContains: "disk"},
		{name: "architectures differ", instance: "arm-1", flavor: "a1.medium", image: "ubuntu-24.04",
			want: map[string]string{"imageId": "UNPROCESSABLE"}, wantMessageContains: "aarch64"},
		{name: "several at once", instance: "-x", flavor: "g1.small", image: "fedora-41", sg: true,
			want: map[string]string{"name": "BAD_USER_INPUT", "imageId": "UNPROCESSABLE"}, screenshot: "dashboard-create-errors"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			steps := []chromedp.Action[chromedp.Void]{
				click("#new-instance"),
				visible(`#c-sgs input[value="sg-acme-web-eu-ssh"]`),
				chromedp.SendKeys(chromedp.ID("c-name"), tt.instance),
				chromedp.SetValue(chromedp.ID("c-flavor"), tt.flavor),
				chromedp.SetValue(chromedp.ID("c-image"), tt.image),
			}
			if tt.sg {
				steps = append(steps, click(`#c-sgs input[value="sg-acme-web-eu-web"]`))
			}
			steps = append(steps, click(`#create button[type="submit"]`))
			for field, code := range tt.want {
				steps = append(steps, visible(fmt.Sprintf(`#create .field.invalid[data-field=%q] .field-error[data-code=%q]`, field, code)))
			}
			b.do(t, "submit the form", steps...)
			if n := eval[int](t, b, `document.querySelectorAll('#create .field-error, #create-errors li').length`); n != len(tt.want) {
				t.Errorf("%d errors shown, want %d", n, len(tt.want))
			}
			if msg := b.text(t, "#create .field-error"); !strings.Contains(msg, tt.wantMessageContains) {
				t.Errorf("error %q does not mention %q", msg, tt.wantMessageContains)
			}
			if tt.screenshot != "" {
				b.screenshot(t, tt.screenshot)
			}
			b.do(t, "close the form", click("#create-cancel"), chromedp.WaitNotVisible(chromedp.ID("create")))
		})
	}
	if rows := eval[[]string](t, b, `Array.from(document.querySelectorAll('#instances tbody tr'), r => r.dataset.name)`); len(rows) != 1 || rows[0] != "taken" {
		t.Errorf("table shows %v, want only the instance made before: a refused create made one", rows)
	}
}

// TestDashboardRebuildNeedsConsent: changing a running instance's flavor in its detail view is
// refused with the API's warning until the user confirms the rebuild; confirmed, the instance
// gets the new flavor, its history records the rebuild and its server runs again.
func TestDashboardRebuildNeedsConsent(t *testing.T) {
	sys := startSystem(t)
	b := newBrowser(t, sys.URL)
	tok := sys.token(t, "alice", auth.Grant{OrganizationID: "acme", ProjectID: "web", Role: auth.RoleMember})
	id := sys.createInstance(t, tok, "rb-1", "g1.small")
	signIn(t, b, sys, tok)
	flavor := func() string {
		data := sys.graphql(t, tok, `query($id: ID!) { instance(id: $id) { flavorId } }`, map[string]any{"id": id})
		return data["instance"].(map[string]any)["flavorId"].(string)
	}

	b.do(t, "open rb-1 once running",
		visible(cell("rb-1", "power", "RUNNING")),
		click(row("rb-1")+` td[data-col="name"] a`),
		present(`#e-flavor option[value="g1.medium"]`),
	)
	b.do(t, "ask for a bigger flavor",
		chromedp.Evaluate[chromedp.Void](`(() => { const s = document.querySelector('#e-flavor'); s.value = 'g1.medium'; s.dispatchEvent(new Event('change')); })()`),
		click("#edit-save"),
		visible("#rebuild-warning"),
	)
	if w := b.text(t, "#rebuild-warning"); !strings.Contains(w, "IP addresses and MAC address are lost") {
		t.Errorf("warning %q does not say what a rebuild loses", w)
	}
	if f := flavor(); f != "g1.small" {
		t.Fatalf("flavor is %s before the rebuild was confirmed", f)
	}

	b.do(t, "confirm the rebuild",
		click("#rebuild-confirm"),
		gone("#rebuild-warning"),
		chromedp.Poll[chromedp.Void](`document.querySelector('#history').textContent.includes('REBUILD_STARTED')`),
		visible(`#detail dd[data-key="Flavor"]`),
		chromedp.Poll[chromedp.Void](`(() => { const dd = k => document.querySelector('#detail dd[data-key="' + k + '"]').textContent;
			return dd('Flavor') === 'g1.medium' && dd('Power') === 'RUNNING' && dd('Generation') === '2 of 2 realised'; })()`),
		chromedp.Poll[chromedp.Void](`document.querySelector('#instances tr[data-name="rb-1"] td[data-col="flavor"]').textContent === 'g1.medium'`),
	)
	if f := flavor(); f != "g1.medium" {
		t.Errorf("flavor is %s after the rebuild, want g1.medium", f)
	}
}

// TestDashboardFirstLook: a member of two projects who never used the dashboard sees the
// instances of all of them at once, the pages name an icon that is served (and so is
// /favicon.ico, which browsers ask for anyway), and at 400 px wide every row still shows its
// name, power, IPs and actions without the page scrolling sideways.
func TestDashboardFirstLook(t *testing.T) {
	sys := startSystem(t)
	b := newBrowser(t, sys.URL)
	tok := sys.token(t, "carol",
		auth.Grant{OrganizationID: "acme", ProjectID: "web", Role: auth.RoleMember},
		auth.Grant{OrganizationID: "acme", ProjectID: "data", Role: auth.RoleMember})
	sys.createInstance(t, tok, "web-1", "g1.small")
	sys.graphql(t, tok, `mutation($in: CreateInstanceInput!) { createInstance(input: $in) { userErrors { field code message } } }`,
		map[string]any{"in": map[string]any{"organizationId": "acme", "projectId": "data", "networkId": "net-acme-data-eu",
			"name": "etl-1", "flavorId": "g1.small", "imageId": "ubuntu-24.04"}})

	signIn(t, b, sys, tok)
	b.do(t, "both projects' instances", visible(row("web-1")), visible(row("etl-1")))
	if p := eval[string](t, b, `document.getElementById('project').value`); p != "" {
		t.Errorf("project selector on %q, want all projects", p)
	}

	icon := eval[string](t, b, `document.querySelector('link[rel="icon"]').href`)
	for _, u := range []string{icon, sys.URL + "/favicon.ico"} {
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "image/svg+xml" {
			t.Errorf("GET %s: %s %q, want 200 image/svg+xml", u, resp.Status, resp.Header.Get("Content-Type"))
		}
	}

	b.do(t, "a 400 px wide window", chromedp.EmulateViewport(400, 800), visible(row("web-1")+` button[data-action="stop"]`))
	if w := eval[int](t, b, `document.documentElement.scrollWidth - window.innerWidth`); w > 0 {
		t.Errorf("the page is %d px wider than the window", w)
	}
	for _, col := range []string{"name", "power", "ips", "actions"} {
		sel := row("web-1") + fmt.Sprintf(` td[data-col=%q]`, col)
		if right := eval[float64](t, b, `(function(){var r=document.querySelector('`+sel+`').getBoundingClientRect(); return r.width > 0 ? r.right : -1})()`); right < 0 || right > 400 {
			t.Errorf("column %s ends at %.0f px, want it shown within the 400 px window", col, right)
		}
	}
	b.screenshot(t, "dashboard-narrow")
}

// TestDashboardDeletionProtection: Protect turns deletion protection on, after which the row's
// Delete is disabled, the detail says so and the API refuses a delete; Unprotect turns it off,
// and Delete deletes again.
func TestDashboardDeletionProtection(t *testing.T) {
	sys := startSystem(t)
	b := newBrowser(t, sys.URL)
	tok := sys.token(t, "alice", auth.Grant{OrganizationID: "acme", ProjectID: "web", Role: auth.RoleMember})
	id := sys.createInstance(t, tok, "keep-1", "g1.small")
	signIn(t, b, sys, tok)
	// The refusal is read under an alias: the helper fails on any userErrors.
	const del = `mutation($id: ID!) { deleteInstance(input: {id: $id}) { instance { id } refusals: userErrors { code } } }`

	b.do(t, "protect keep-1",
		click(row("keep-1")+` button[data-action="protect"]`),
		present(row("keep-1")+` button[data-action="unprotect"]`),
		present(row("keep-1")+` button[data-action="delete"][disabled]`),
		click(row("keep-1")+` td[data-col="name"] a`),
		chromedp.Poll[chromedp.Void](`document.querySelector('#detail dd[data-key="Deletion protection"]')?.textContent === 'on'`),
	)
	data := sys.graphql(t, tok, del, map[string]any{"id": id})
	if got := fmt.Sprint(data["deleteInstance"]); got != "map[instance:<nil> refusals:[map[code:UNPROCESSABLE]]]" {
		t.Fatalf("delete of the protected instance: %s, want UNPROCESSABLE", got)
	}

	b.do(t, "unprotect keep-1",
		click(row("keep-1")+` button[data-action="unprotect"]`),
		present(row("keep-1")+` button[data-action="protect"]`),
		chromedp.Poll[chromedp.Void](`document.querySelector('#detail dd[data-key="Deletion protection"]')?.textContent === 'off'`),
	)
	b.do(t, "delete keep-1",
		click(row("keep-1")+` button[data-action="delete"]:not([disabled])`),
		click(row("keep-1")+` button[data-action="confirm-delete"]`),
		// Deleting, or already gone from the list.
		chromedp.Poll[chromedp.Void](`(() => { const r = document.querySelector('#instances tr[data-name="keep-1"]'); return !r || r.classList.contains('deleting'); })()`),
	)
}

// TestDashboardShowsTheLease: an instance's detail shows its lease: the action, when it ends
// and the time left.
func TestDashboardShowsTheLease(t *testing.T) {
	sys := startSystem(t)
	b := newBrowser(t, sys.URL)
	tok := sys.token(t, "alice", auth.Grant{OrganizationID: "acme", ProjectID: "web", Role: auth.RoleMember})
	id := sys.createInstance(t, tok, "leased-1", "g1.small")
	end := time.Now().Add(2*time.Hour + 30*time.Minute).UTC().Truncate(time.Second)
	sys.graphql(t, tok, `mutation($id: ID!, $at: Time) { updateInstance(input: {id: $id, expiresAt: $at, expiryAction: DELETE}) { userErrors { code } } }`,
		map[string]any{"id": id, "at": end.Format(time.RFC3339)})
	signIn(t, b, sys, tok)
	b.do(t, "open leased-1",
		click(row("leased-1")+` td[data-col="name"] a`),
		chromedp.Poll[chromedp.Void](`(document.querySelector('#detail dd[data-key="Lease"]')?.textContent || '').includes('DELETE')`),
	)
	got := b.text(t, `#detail dd[data-key="Lease"]`)
	want := "DELETE at " + end.Format("2006-01-02 15:04:05") + ".000 UTC, 2 h 2"
	if !strings.HasPrefix(got, want) || !strings.HasSuffix(got, "min left") {
		t.Errorf("lease shown as %q, want %q… min left", got, want)
	}
}

// TestDashboardResize: resizing a running instance from its detail view first shows the dry
// run's plan (the quota it takes, the restart) and changes nothing; confirmed, the history
// records the ACTION RESIZE and the instance runs with the new flavor, its addresses kept.
func TestDashboardResize(t *testing.T) {
	sys := startSystem(t)
	b := newBrowser(t, sys.URL)
	tok := sys.token(t, "alice", auth.Grant{OrganizationID: "acme", ProjectID: "web", Role: auth.RoleMember})
	id := sys.createInstance(t, tok, "grow-1", "g1.small")
	signIn(t, b, sys, tok)
	flavor := func() string {
		data := sys.graphql(t, tok, `query($id: ID!) { instance(id: $id) { flavorId } }`, map[string]any{"id": id})
		return data["instance"].(map[string]any)["flavorId"].(string)
	}

	b.do(t, "open grow-1 once running",
		visible(cell("grow-1", "power", "RUNNING")),
		click(row("grow-1")+` td[data-col="name"] a`),
		present(`#r-flavor option[value="g1.medium"]`),
	)
	if small := eval[int](t, b, `document.querySelectorAll('#r-flavor option[value="g1.small"]').length`); small != 0 {
		t.Error("the resize form offers the flavor the instance has")
	}
	ip := b.text(t, `#detail dd[data-key="Private IP"]`)
	b.do(t, "check a resize to g1.medium",
		chromedp.Evaluate[chromedp.Void](`(() => { const s = document.querySelector('#r-flavor'); s.value = 'g1.medium'; s.dispatchEvent(new Event('change')); })()`),
		click("#resize-check"),
		visible("#resize-plan"),
	)
	if p := b.text(t, "#resize-plan"); !strings.Contains(p, "cpus +2") || !strings.Contains(p, "started again") {
		t.Errorf("plan %q, want the quota it takes and the restart", p)
	}
	b.screenshot(t, "dashboard-resize-plan")
	if f := flavor(); f != "g1.small" {
		t.Fatalf("flavor is %s after the dry run", f)
	}
	b.do(t, "confirm the resize",
		click("#resize-confirm"),
		gone("#resize-plan"),
		chromedp.Poll[chromedp.Void](`document.querySelector('#history').textContent.includes('ACTION RESIZE')`),
		chromedp.Poll[chromedp.Void](`(() => { const dd = k => document.querySelector('#detail dd[data-key="' + k + '"]').textContent;
			return dd('Flavor') === 'g1.medium' && dd('Power') === 'RUNNING' && dd('Generation') === '2 of 2 realised'; })()`),
	)
	if got := b.text(t, `#detail dd[data-key="Private IP"]`); got != ip {
		t.Errorf("private IP %s after the resize, want %s kept", got, ip)
	}
}

// TestDashboardSSHKeysAndConsole: SSH public keys given in the create form reach the
// instance, a bad one is shown on its field; the detail view shows the keys and, on a click,
// the end of the server's console output; the serial console opens in a terminal that shows
// the boot text and echoes what is typed, and the history records who opened it.
func TestDashboardSSHKeysAndConsole(t *testing.T) {
	sys := startSystem(t)
	b := newBrowser(t, sys.URL)
	tok := sys.token(t, "alice", auth.Grant{OrganizationID: "acme", ProjectID: "web", Role: auth.RoleMember})
	signIn(t, b, sys, tok)
	line := sshtest.PublicKey(t) + " alice@laptop"

	b.do(t, "create keyed-1 with a bad key",
		click("#new-instance"),
		visible(`#c-sgs input[value="sg-acme-web-eu-ssh"]`),
		chromedp.SendKeys(chromedp.ID("c-name"), "keyed-1"),
		chromedp.SetValue(chromedp.ID("c-flavor"), "g1.small"),
		chromedp.SetValue(chromedp.ID("c-image"), "ubuntu-24.04"),
		chromedp.SetValue(chromedp.ID("c-sshkeys"), line+"\nssh-dss AAAA broken"),
		click(`#create button[type="submit"]`),
		visible(`#create .field.invalid[data-field="sshPublicKeys"] .field-error[data-code="BAD_USER_INPUT"]`),
	)
	b.do(t, "create keyed-1 with the good key",
		chromedp.SetValue(chromedp.ID("c-sshkeys"), line),
		click(`#create button[type="submit"]`),
		chromedp.WaitNotVisible(chromedp.ID("create")),
		visible(cell("keyed-1", "power", "RUNNING")),
		click(row("keyed-1")+` td[data-col="name"] a`),
		chromedp.Poll[chromedp.Void](`(document.querySelector('#detail dd[data-key="SSH keys"]')?.textContent || '') === 'ssh-ed25519 alice@laptop'`),
		click("#console-read"),
		chromedp.Poll[chromedp.Void](`(document.querySelector('#console-output')?.textContent || '').includes('keyed-1 login:')`),
	)
	b.screenshot(t, "dashboard-console")
	b.do(t, "open the serial console and type into it",
		click("#terminal-open"),
		chromedp.Poll[chromedp.Void](`(document.querySelector('#terminal-screen .xterm-rows')?.textContent || '').includes('keyed-1 login:')`),
		chromedp.Poll[chromedp.Void](`(document.querySelector('#terminal-status')?.textContent || '').startsWith('Connected until')`),
		// Typed as text input: SendKeys's key events each type their character twice into a
		// terminal, which takes both the key press and the input event.
		chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
			_, err := chromedp.Call(ctx, input.InsertText, input.InsertTextParams{Text: "alice"})
			return err
		}),
		chromedp.Poll[chromedp.Void](`(document.querySelector('#terminal-screen .xterm-rows')?.textContent || '').includes('keyed-1 login: alice')`),
		chromedp.Poll[chromedp.Void](`[...document.querySelectorAll('#detail table td')].some(td => td.textContent.includes('CONSOLE'))`),
	)
	b.screenshot(t, "dashboard-terminal")
	b.do(t, "close the serial console",
		click("#terminal-close"),
		visible("#terminal-open"),
	)
}
