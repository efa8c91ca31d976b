package virt

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"
	"github.com/gorilla/websocket"

	"github.com/computeql/computeql/e2e/harness"
	"github.com/computeql/computeql/virttest"
)

// Limits far above what a step takes on a loaded two-core machine (a busybox guest answers
// about 6 s after it starts under TCG), so that a failure means the step did not happen.
const (
	bootLimit = 2 * time.Minute
	// stepLimit covers a graceful stop too: the guest powers off on the ACPI button at once,
	// and the region forces it off only after stopTimeout (30 s).
	stepLimit = 90 * time.Second
	// pollEvery paces polls of a guest over the network and of the API.
	pollEvery = 250 * time.Millisecond
)

// TestLibvirtLifecycle follows one busybox instance through its whole life, as a user drives
// it through GraphQL and one subscriber sees it, and checks at every step what really
// happened: the guest answers HTTP with its identity and its user data's work, each boot is a
// new one (the user data records the kernel's boot id), a stop powers the guest off through
// its ACPI button, a libvirtd outage is waited out (the instance says so, verbs answer
// UNAVAILABLE, the guest runs on untouched), a server destroyed behind the region's back is
// recreated, and a delete
// leaves nothing on the host and no quota in use.
func TestLibvirtLifecycle(t *testing.T) {
	t.Parallel()
	cat := busyboxCatalogue(t)
	host := virttest.Start(t, virttest.Options{})
	catalog := writeCatalog(t, host, cat)
	lab := deploy(t, catalog)
	lv := inspect(t, host)
	f := lab.follow(t)
	clock := newStopwatch(t)
	ctx := context.Background()

	// The user data runs once per boot: it proves it ran, and which boot the guest is in.
	token := randomToken("user-data-")
	// Each file is written aside and renamed, so the test never reads one half-written.
	script := "#!/bin/sh\necho " + token + " >/www/user-data.tmp && mv /www/user-data.tmp /www/user-data.txt\n" +
		"cat /proc/sys/kernel/random/boot_id >/www/boot-id.tmp && mv /www/boot-id.tmp /www/boot-id.txt\n"
	const name = "virt-life"
	id := lab.mustCreate(ctx, t, map[string]any{"name": name, "flavorId": "tiny", "imageId": "busybox",
		"userData": base64.StdEncoding.EncodeToString([]byte(script))})
	clock.step("created %s", id)

	built := f.until(t, bootLimit, name+" RUNNING", of(id, func(ev event) bool { return ev.Instance.running() }))
	inPrefix(t, built.Instance)
	ip, mac := built.Instance.Status.PrivateIP, built.Instance.Status.MACAddress
	clock.step("RUNNING at %s, MAC %s", ip, mac)
	boot := awaitGuest(t, host, ip, name, id, token, "")
	clock.step("the guest answers HTTP (boot %s)", boot)
	healthy(ctx, t, lab, id)

	step(t, "a console session shows the serial console, once", func(t *testing.T) {
		url := lab.consoleSession(ctx, t, id)
		conn, res, err := websocket.DefaultDialer.DialContext(ctx, url, nil)
		if err != nil {
			t.Fatalf("open console %s: %v (%v)", url, err, res)
		}
		defer conn.Close()
		// What the guest wrote before: its boot lines, up to the last.
		harness.ReadConsoleUntil(t, conn, "computeql-guest: ready", stepLimit)
		// What it echoes now: the kernel's terminal of the guest's console.
		probe := randomToken("typed-")
		if err := conn.WriteMessage(websocket.TextMessage, []byte(probe+"\r")); err != nil {
			t.Fatal(err)
		}
		harness.ReadConsoleUntil(t, conn, probe, stepLimit)
		conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
		if _, res, err := websocket.DefaultDialer.DialContext(ctx, url, nil); err == nil || res == nil || res.StatusCode != http.StatusUnauthorized {
			t.Errorf("a second use of the console URL: %v (%v), want 401", err, res)
		}
		// A new session attaches and echoes again: the first one left the console usable.
		again, res, err := websocket.DefaultDialer.DialContext(ctx, lab.consoleSession(ctx, t, id), nil)
		if err != nil {
			t.Fatalf("open a second console session: %v (%v)", err, res)
		}
		defer again.Close()
		probe2 := randomToken("typed-")
		if err := again.WriteMessage(websocket.TextMessage, []byte(probe2+"\r")); err != nil {
			t.Fatal(err)
		}
		harness.ReadConsoleUntil(t, again, probe2, stepLimit)
		clock.step("the console showed the boot and echoed %s; its URL then refused; a new session echoed %s", probe, probe2)
	})

	step(t, "stop powers the guest off", func(t *testing.T) {
		lab.verb(ctx, t, "stopInstance", id, nil)
		f.until(t, stepLimit, "the STOP action", of(id, action("STOP")))
		f.until(t, stepLimit, name+" STOPPED", of(id, func(ev event) bool { return ev.Instance.Status.PowerState == "STOPPED" }))
		dom, ok := lv.domainByMAC(t, mac)
		if !ok {
			t.Fatalf("no domain with MAC %s after the stop", mac)
		}
		// Shut off by the guest itself: the region forces a guest off only past stopTimeout,
		// and that would be "destroyed".
		if state, reason := lv.state(t, dom); state != libvirt.DomainShutoff || libvirt.DomainShutoffReason(reason) != libvirt.DomainShutoffShutdown {
			t.Errorf("domain %s is in state %d (reason %d), want shut off (%d) by the guest's shutdown (%d)",
				dom.Name, state, reason, libvirt.DomainShutoff, libvirt.DomainShutoffShutdown)
		}
		clock.step("STOPPED; domain %s shut off by the guest", dom.Name)
	})

	step(t, "start boots it again", func(t *testing.T) {
		lab.verb(ctx, t, "startInstance", id, nil)
		f.until(t, stepLimit, "the START action", of(id, action("START")))
		ev := f.until(t, bootLimit, name+" RUNNING again", of(id, func(ev event) bool { return ev.Instance.running() }))
		if got := ev.Instance.Status; got.PrivateIP != ip || !strings.EqualFold(got.MACAddress, mac) {
			t.Errorf("after a start: IP %s, MAC %s; want the same server's %s, %s", got.PrivateIP, got.MACAddress, ip, mac)
		}
		boot = awaitGuest(t, host, ip, name, id, token, boot)
		clock.step("RUNNING again; the guest answers (boot %s)", boot)
	})

	for _, r := range []struct {
		hard   bool
		action string
	}{{false, "REBOOT"}, {true, "HARD_REBOOT"}} {
		step(t, fmt.Sprintf("reboot hard=%v", r.hard), func(t *testing.T) {
			lab.verb(ctx, t, "rebootInstance", id, map[string]any{"hard": r.hard})
			f.until(t, stepLimit, "the "+r.action+" action", of(id, action(r.action)))
			boot = awaitGuest(t, host, ip, name, id, token, boot)
			// A reboot may never show in the power state (the domain keeps running): the new
			// boot is the proof that it happened, and the instance must end up RUNNING.
			awaitRunning(ctx, t, lab, id)
			clock.step("rebooted (hard=%v): boot %s, RUNNING", r.hard, boot)
		})
	}

	step(t, "a host outage is waited out", func(t *testing.T) {
		if err := host.StopDaemon(); err != nil {
			t.Fatal(err)
		}
		clock.step("libvirtd stopped")
		f.until(t, stepLimit, name+" saying its region is unreachable", of(id, func(ev event) bool {
			st := ev.Instance.Status
			return hasReason(ev.Instance, "RegionUnreachable") && st.HealthStatus == "UNKNOWN" &&
				st.ProvisioningStatus == "PROVISIONED" && st.PowerState == "RUNNING" && st.PrivateIP == ip
		}))
		clock.step("the instance says its region is unreachable, its last known state kept")
		var errs harness.Errors
		if err := lab.tryVerb(ctx, "stopInstance", id, nil); !errors.As(err, &errs) || errs[0].Code() != "UNAVAILABLE" {
			t.Fatalf("stopInstance while libvirtd is down: %v, want UNAVAILABLE", err)
		}
		// The guest does not depend on libvirtd: it keeps running the same boot.
		if got, err := httpGet(ctx, host, ip, "/boot-id.txt"); err != nil || strings.TrimSpace(got) != boot {
			t.Fatalf("the guest while libvirtd is down: boot %q, %v; want it still up in boot %s", got, err, boot)
		}
		if err := host.StartDaemon(ctx); err != nil {
			t.Fatal(err)
		}
		lv.connect(t, host)
		clock.step("libvirtd started again")
		f.until(t, stepLimit, name+" RUNNING and HEALTHY again", of(id, func(ev event) bool {
			return ev.Instance.running() && ev.Instance.Status.HealthStatus == "HEALTHY" && hasReason(ev.Instance, "Provisioned")
		}))
		if got := lab.get(ctx, t, id); got.Status.PrivateIP != ip || !strings.EqualFold(got.Status.MACAddress, mac) {
			t.Errorf("after the outage: %s; want the same server at %s, %s", got, ip, mac)
		}
		if got, err := httpGet(ctx, host, ip, "/boot-id.txt"); err != nil || strings.TrimSpace(got) != boot {
			t.Errorf("the guest after the outage: boot %q, %v; want the same boot %s, never restarted", got, err, boot)
		}
		clock.step("reconciling resumed on the same server")
	})

	// A host that loses a domain: destroyed and undefined without the region knowing.
	lost, ok := lv.domainByMAC(t, mac)
	if !ok {
		t.Fatalf("no domain with MAC %s", mac)
	}
	lostID, lostMAC := uuid.UUID(lost.UUID).String(), mac
	step(t, "a server lost behind the region's back is recreated", func(t *testing.T) {
		// The guest may be between its reboot's power-off and power-on: a domain not running
		// needs no destroy before its undefine.
		if err := lv.l.DomainDestroy(lost); err != nil && !libvirt.IsNotFound(err) && !strings.Contains(err.Error(), "not running") {
			t.Fatalf("destroy domain %s: %v", lost.Name, err)
		}
		if err := lv.l.DomainUndefine(lost); err != nil {
			t.Fatalf("undefine domain %s: %v", lost.Name, err)
		}
		clock.step("domain %s destroyed and undefined behind the region's back", lost.Name)
		f.until(t, stepLimit, "a condition saying the server is recreated", of(id, func(ev event) bool {
			for _, c := range ev.Instance.Status.Conditions {
				if strings.Contains(c.Message, "recreated") {
					return true
				}
			}
			return false
		}))
		ev := f.until(t, bootLimit, name+" RUNNING on a new server", of(id, func(ev event) bool { return ev.Instance.running() }))
		inPrefix(t, ev.Instance)
		ip, mac = ev.Instance.Status.PrivateIP, ev.Instance.Status.MACAddress
		dom, ok := lv.domainByMAC(t, mac)
		if !ok {
			t.Fatalf("no domain with the new MAC %s", mac)
		}
		if dom.UUID == lost.UUID {
			t.Errorf("the recreated domain %s has the lost one's uuid", dom.Name)
		}
		boot = awaitGuest(t, host, ip, name, id, token, boot)
		clock.step("recreated as %s at %s; the guest answers (boot %s)", dom.Name, ip, boot)
	})

	step(t, "delete leaves nothing behind", func(t *testing.T) {
		lab.verb(ctx, t, "deleteInstance", id, nil)
		f.until(t, stepLimit, name+" DELETED", of(id, func(ev event) bool { return ev.Kind == "DELETED" }))
		clock.step("DELETED")
		if doms := lv.domains(t); len(doms) > 0 {
			t.Errorf("domains left on the host: %v", names(doms))
		}
		// The lost server's too: the region frees what a domain undefined behind its back
		// held when it hears of it, and an address never released would be lost for ever.
		for _, v := range lv.serverVolumes(t) {
			whose := "the recreated server"
			if strings.HasPrefix(v, "computeql-"+lostID) {
				whose = "the lost server"
			}
			t.Errorf("volume %s of %s left in pool %s", v, whose, poolName)
		}
		for _, r := range lv.reservations(t) {
			whose := "the recreated server"
			if strings.HasPrefix(r, strings.ToLower(lostMAC)+"=") {
				whose = "the lost server"
			}
			t.Errorf("DHCP reservation %s of %s left in network %s", r, whose, libvirtNetwork)
		}
		for kind, used := range lab.quotaUsed(ctx, t) {
			if used != 0 {
				t.Errorf("quota %s: %d in use after the delete, want 0", kind, used)
			}
		}
	})
}

// awaitGuest waits until the busybox guest at ip serves its index page naming the instance,
// the token its user data wrote, and a boot id other than notBoot; it returns the boot id.
func awaitGuest(t *testing.T, host *virttest.Host, ip, name, id, token, notBoot string) string {
	t.Helper()
	var boot string
	await(t, bootLimit, pollEvery, fmt.Sprintf("the guest of %s answering HTTP on %s in a boot after %q", name, ip, notBoot), func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		index, err := httpGet(ctx, host, ip, "/")
		if err != nil {
			return err
		}
		for _, want := range []string{"hostname=" + name + "\n", "instance-id=" + id + "\n"} {
			if !strings.Contains(index, want) {
				t.Fatalf("the guest at %s serves index.html %q, without %q", ip, index, want)
			}
		}
		// The user data runs after the web server starts: until it has, these are missing.
		got, err := httpGet(ctx, host, ip, "/user-data.txt")
		if err != nil {
			return err
		}
		if strings.TrimSpace(got) != token {
			t.Fatalf("the guest at %s serves user-data.txt %q, want %q", ip, got, token)
		}
		b, err := httpGet(ctx, host, ip, "/boot-id.txt")
		if err != nil {
			return err
		}
		if b = strings.TrimSpace(b); b == notBoot {
			return errors.New("still in the boot before")
		}
		if b == "" {
			t.Fatalf("the guest at %s serves an empty boot-id.txt: its kernel has no boot_id", ip)
		}
		boot = b
		return nil
	})
	return boot
}

// awaitRunning waits until the instance query shows the instance provisioned and running.
func awaitRunning(ctx context.Context, t *testing.T, lab *lab, id string) {
	t.Helper()
	await(t, stepLimit, pollEvery, "the instance RUNNING", func() error {
		if inst := lab.get(ctx, t, id); !inst.running() {
			return errors.New(inst.String())
		}
		return nil
	})
}

// healthy checks that a running busybox instance is HEALTHY: it has its address, and its
// image runs no guest agent that could fail to answer.
func healthy(ctx context.Context, t *testing.T, lab *lab, id string) {
	t.Helper()
	if inst := lab.get(ctx, t, id); inst.Status.HealthStatus != "HEALTHY" {
		t.Errorf("health of %s: %s, want HEALTHY", inst, inst.Status.HealthStatus)
	}
}

// step runs one step of a sequence as a subtest; the sequence stops at the first that fails,
// since every later step starts from the state it should have left.
func step(t *testing.T, name string, fn func(t *testing.T)) {
	t.Helper()
	if !t.Run(name, fn) {
		t.FailNow()
	}
}

func names(doms []libvirt.Domain) []string {
	out := make([]string, len(doms))
	for i, d := range doms {
		out[i] = d.Name
	}
	return out
}
