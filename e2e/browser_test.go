package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// pageTimeout bounds every browser step: Chromium under -race on two shared cores is slow to
// start, but no step should take longer.
const pageTimeout = 60 * time.Second

// chromium returns the browser binary, skipping the test where there is none, but failing it
// under CI, which installs one.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("COMPUTEQL_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no chromium on the PATH: CI must install it (apt-get install -y chromium)")
	}
	t.Skip("no chromium on the PATH (apt-get install -y chromium): browser tests skipped")
	return ""
}

// browser is one headless Chromium tab, watched for what a page must never do: run into a
// JavaScript error, log one, or contact any origin but the system's own.
type browser struct {
	ctx    context.Context
	origin string

	mu      sync.Mutex
	foreign []string // requests to other origins
	errs    []string // exceptions and console errors
}

func newBrowser(t *testing.T, origin string) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.WindowSize(1400, 900),
		// CI runs as root, where Chromium's sandbox cannot start.
		chromedp.NoSandbox,
		chromedp.Flag("disable-dev-shm-usage", true),
		// Any host but loopback fails to resolve: the pages must work air-gapped, and this
		// makes sure a stray request could not succeed even where a network is reachable.
		chromedp.Flag("host-resolver-rules", "MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(allocCtx)
	t.Cleanup(func() { cancelCtx(); cancelAlloc() })

	b := &browser{ctx: ctx, origin: origin}
	// The first action starts the browser, bound to ctx, which must carry no timeout.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	wsOrigin := "ws" + strings.TrimPrefix(origin, "http")
	err := chromedp.Listen(ctx, func(ev any) {
		b.mu.Lock()
		defer b.mu.Unlock()
		switch ev := ev.(type) {
		case *network.EventRequestWillBeSent:
			if u := ev.Request.URL; !strings.HasPrefix(u, origin+"/") && !strings.HasPrefix(u, "data:") {
				b.foreign = append(b.foreign, u)
			}
		case *network.EventWebSocketCreated:
			if !strings.HasPrefix(ev.URL, wsOrigin+"/") {
				b.foreign = append(b.foreign, ev.URL)
			}
		case *runtime.EventExceptionThrown:
			d := ev.ExceptionDetails
			msg := d.Text
			if d.Exception != nil {
				msg += " " + d.Exception.Description
			}
			b.errs = append(b.errs, "exception: "+msg)
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError {
				var args []string
				for _, a := range ev.Args {
					args = append(args, string(a.Value)+a.Description)
				}
				b.errs = append(b.errs, "console.error: "+strings.Join(args, " "))
			}
		}
	})
	if err != nil {
		t.Fatalf("listen to chromium: %v", err)
	}
	t.Cleanup(func() { b.checkClean(t) })
	return b
}

// checkClean fails the test for any error the page raised or any request it sent elsewhere.
func (b *browser) checkClean(t *testing.T) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, u := range b.foreign {
		t.Errorf("the page contacted another origin: %s", u)
	}
	for _, e := range b.errs {
		t.Errorf("the page raised %s", e)
	}
}

// do performs browser actions within pageTimeout, failing the test with what it was doing
// and the page as it was.
func (b *browser) do(t *testing.T, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, pageTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		html, _ := chromedp.Run(b.ctx, chromedp.OuterHTML(chromedp.CSS("body")))
		t.Fatalf("%s: %v\npage:\n%s", what, err, html)
	}
}

// text returns the visible text of the first element matching the CSS selector, once there
// is one. The page finds the element and reads it in one step: the dashboard renders afresh
// what its subscription changes, and an element found by one call may be gone by the next.
func (b *browser) text(t *testing.T, sel string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, pageTimeout)
	defer cancel()
	quoted, err := json.Marshal(sel)
	if err != nil {
		t.Fatal(err)
	}
	expr := fmt.Sprintf(`(() => { const e = document.querySelector(%s); return e ? {text: e.innerText} : null; })()`, quoted)
	found, err := chromedp.Run(ctx, chromedp.Poll[struct {
		Text string `json:"text"`
	}](expr))
	if err != nil {
		t.Fatalf("read %s: %v", sel, err)
	}
	return found.Text
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](t *testing.T, b *browser, expr string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, pageTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// screenshot saves a full-page PNG as a test artifact.
func (b *browser) screenshot(t *testing.T, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, pageTimeout)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	dir := os.Getenv("COMPUTEQL_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "computeql-artifacts")
	}
	dir = filepath.Join(dir, "browser")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}

// visible waits until an element matching the CSS selector is visible.
func visible(sel string) chromedp.Action[chromedp.Void] {
	return chromedp.WaitVisible(chromedp.CSS(sel))
}

// present waits until an element matching the CSS selector is in the document, visible or not
// (an option of a closed select is never visible).
func present(sel string) chromedp.Action[chromedp.Void] {
	return chromedp.WaitReady(chromedp.CSS(sel))
}

// gone waits until no element matches the CSS selector.
func gone(sel string) chromedp.Action[chromedp.Void] {
	return chromedp.WaitNotPresent(chromedp.CSS(sel))
}

func click(sel string) chromedp.Action[chromedp.Void] {
	return chromedp.Click(chromedp.CSS(sel))
}

// signInLink is the address that signs the page at path in with token, as `make run` prints it.
func signInLink(origin, path, token string) string {
	return origin + path + "#token=" + url.QueryEscape(token)
}

// row selects the table row of the instance named name; cell selects one of its cells.
func row(name string) string { return fmt.Sprintf(`#instances tr[data-name=%q]`, name) }

func cell(name, col, value string) string {
	return fmt.Sprintf(`%s td[data-col=%q][data-value=%q]`, row(name), col, value)
}
