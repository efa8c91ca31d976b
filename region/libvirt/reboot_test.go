package libvirt_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/libvirt"
	"github.com/computeql/computeql/virttest"
)

// rebootTimeout is the lab region's stop timeout here: how long a soft reboot waits for the
// guest to power off.
const rebootTimeout = 8 * time.Second

// bootIDScript has the busybox guest serve the kernel's id of its boot, a new one each boot.
const bootIDScript = "#!/bin/sh\ncat /proc/sys/kernel/random/boot_id >/www/boot.tmp && mv /www/boot.tmp /www/boot-id.txt\n"

// A soft reboot presses the power button and starts the guest again once it has powered off:
// the server is REBOOTING until then, never STOPPED. A guest that ignores the button (the
// busybox guest without its acpid) is reset once the stop timeout has passed, and not before;
// a hard reboot during the wait resets it at once. While a soft reboot waits, the other power
// verbs are refused. Boots are told apart by the id the guest serves over HTTP.
func TestLibvirtSoftReboot(t *testing.T) {
	kernel, initrd := busybox(t)
	host := virttest.Start(t, virttest.Options{})
	cat := labCatalog(t, host, kernel, initrd, more{stopTimeout: rebootTimeout.String(), images: []string{`{"id": "deaf", "name": "deaf",
		"architecture": "x86_64", "sizeGiB": 1, "virtualization": "virtualized", "state": "ready", "regions": ["lab"],
		"kernel": "` + kernel + `", "initrd": "` + initrd + `", "cmdline": "console=ttyS0 computeql.noacpi"}`}})
	d := startDriver(t, cat)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g := guests{ctx: ctx, d: d, host: host}

	t.Run("a guest that powers off is started again", func(t *testing.T) {
		srv, boot := g.boot(t, "polite", "busybox")
		// Every state the server shows until the guest is up again, read on each of its events.
		events := make(chan struct{}, 1)
		go func() {
			_ = d.Watch(ctx, "", func(ev region.Event) error {
				if ev.ServerID == srv.ID {
					select {
					case events <- struct{}{}:
					default:
					}
				}
				return nil
			})
		}()
		got, err := d.RebootServer(ctx, srv.ID, false)
		if err != nil || got.State != region.ServerRebooting {
			t.Fatalf("RebootServer: %s, %v; want REBOOTING", got.State, err)
		}
		seen := map[region.ServerState]bool{}
		limit := time.After(2 * time.Minute)
		for again := boot; again == boot || again == ""; again = g.bootID(srv.PrivateIP) {
			seen[g.state(t, srv.ID)] = true
			select {
			case <-events:
			case <-time.After(time.Second): // a boot has no event of its own
			case <-limit:
				t.Fatalf("the guest did not boot again; states seen %v", seen)
			}
		}
		if seen[region.ServerStopped] {
			t.Errorf("states seen during the reboot %v: STOPPED is not one", seen)
		}
		eventually.Holds(t, time.Minute, func() bool { return g.state(t, srv.ID) == region.ServerRunning }, "server RUNNING again")
		out, err := d.ConsoleOutput(ctx, srv.ID, int(region.ConsoleOutputMax))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.Text, "computeql-guest: power button: powering off") {
			t.Errorf("the guest booted again without powering off first:\n%s", out.Text)
		}
	})

	t.Run("a guest that ignores the button is reset at the timeout", func(t *testing.T) {
		srv, boot := g.boot(t, "deaf", "deaf")
		pressed := time.Now()
		if got, err := d.RebootServer(ctx, srv.ID, false); err != nil || got.State != region.ServerRebooting {
			t.Fatalf("RebootServer: %s, %v; want REBOOTING", got.State, err)
		}
		for verb, call := range map[string]func() error{
			"StopServer":                 func() error { _, err := d.StopServer(ctx, srv.ID); return err },
			"StartServer":                func() error { _, err := d.StartServer(ctx, srv.ID); return err },
			"a second soft RebootServer": func() error { _, err := d.RebootServer(ctx, srv.ID, false); return err },
		} {
			if err := call(); !errors.Is(err, region.ErrRefused) {
				t.Errorf("%s during a soft reboot: %v, want ErrRefused", verb, err)
			}
		}
		if got := g.state(t, srv.ID); got != region.ServerRebooting {
			t.Errorf("the server while its guest ignores the button: %s, want REBOOTING", got)
		}
		boot = g.nextBoot(t, srv.PrivateIP, boot)
		if waited := time.Since(pressed); waited < rebootTimeout {
			t.Errorf("the guest was reset %s after the button, before the timeout of %s", waited, rebootTimeout)
		}
		eventually.Holds(t, time.Minute, func() bool { return g.state(t, srv.ID) == region.ServerRunning }, "the reboot over")

		// A hard reboot ends the wait of a soft one at once.
		if _, err := d.RebootServer(ctx, srv.ID, false); err != nil {
			t.Fatal(err)
		}
		if _, err := d.RebootServer(ctx, srv.ID, true); err != nil {
			t.Fatalf("a hard RebootServer during a soft one: %v", err)
		}
		if got := g.state(t, srv.ID); got == region.ServerRebooting {
			t.Errorf("the server after a hard reboot ended the soft one: %s", got)
		}
		g.nextBoot(t, srv.PrivateIP, boot)
	})
}

// guests makes busybox guests that serve their boot id, and reads their servers.
type guests struct {
	ctx  context.Context
	d    *libvirt.Driver
	host *virttest.Host
}

// boot makes a server of the image, deleted when the test ends, and returns it RUNNING with
// the id of its guest's first boot.
func (g guests) boot(t *testing.T, name, image string) (region.Server, string) {
	t.Helper()
	spec := labSpec(name)
	spec.ImageID, spec.UserData = image, []byte(bootIDScript)
	srv, err := g.d.CreateServer(g.ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.d.DeleteServer(context.Background(), srv.ID) })
	eventually.Holds(t, 2*time.Minute, func() bool {
		srv, err = g.d.GetServer(g.ctx, srv.ID)
		return err == nil && srv.State == region.ServerRunning
	}, "server %s RUNNING", name)
	return srv, g.nextBoot(t, srv.PrivateIP, "")
}

// nextBoot waits until the guest serves a boot id other than after's, and returns it.
func (g guests) nextBoot(t *testing.T, ip, after string) string {
	t.Helper()
	var id string
	eventually.Holds(t, 2*time.Minute, func() bool {
		id = g.bootID(ip)
		return id != "" && id != after
	}, "the guest at %s in a boot after %q", ip, after)
	return id
}

// bootID is the id of the guest's boot, or "" while it does not answer.
func (g guests) bootID(ip string) string {
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: g.host.Dial, DisableKeepAlives: true}}
	res, err := client.Get("http://" + net.JoinHostPort(ip, "80") + "/boot-id.txt")
	if err != nil {
		return ""
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK {
		return ""
	}
	return strings.TrimSpace(string(body))
}

func (g guests) state(t *testing.T, id string) region.ServerState {
	t.Helper()
	srv, err := g.d.GetServer(g.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return srv.State
}
