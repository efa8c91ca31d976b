package virt

import (
	"context"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/computeql/computeql/virttest"
)

// TestLibvirtSecurityGroups: a guest's port is reachable from another guest only as its
// security groups allow, and changing its groups applies at once, without a reboot. One guest
// serves HTTP on port 80; another probes it every second from inside the network (busybox nc:
// its wget crashes in a static build) and serves what it saw. Traffic from the host to a guest is not filtered, which is how the test reads
// both.
func TestLibvirtSecurityGroups(t *testing.T) {
	t.Parallel()
	cat := busyboxCatalogue(t)
	host := virttest.Start(t, virttest.Options{})
	cat.securityGroups = []map[string]any{
		{"id": "ping", "name": "ping", "networkId": networkID, "rules": []any{
			map[string]any{"direction": "ingress", "protocol": "icmp"}}},
		{"id": "web", "name": "web", "networkId": networkID, "rules": []any{
			map[string]any{"direction": "ingress", "protocol": "tcp", "portMin": 80, "portMax": 80, "remotePrefix": prefix}}},
	}
	lab := deploy(t, writeCatalog(t, host, cat))
	f := lab.follow(t)
	ctx := context.Background()

	// The target is in a group that opens nothing on TCP.
	target := lab.mustCreate(ctx, t, map[string]any{"name": "target", "flavorId": "tiny", "imageId": "busybox",
		"networking": map[string]any{"securityGroupIds": []string{"ping"}},
		"userData":   base64.StdEncoding.EncodeToString([]byte("#!/bin/sh\ncat /proc/sys/kernel/random/boot_id >/www/boot.tmp && mv /www/boot.tmp /www/boot-id.txt\n"))})
	built := f.until(t, bootLimit, "target RUNNING", of(target, func(ev event) bool { return ev.Instance.running() }))
	targetIP := built.Instance.Status.PrivateIP
	boot := awaitPage(t, host, targetIP, "/boot-id.txt", func(s string) bool { return s != "" })

	probe := "#!/bin/sh\n( n=0; while true; do n=$((n+1)); " +
		"if printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 " + targetIP + " 80 2>/dev/null | grep -q '^HTTP/1.[01] 200'; then r=open; else r=closed; fi; " +
		"echo \"$n $r\" >/www/probe.tmp && mv /www/probe.tmp /www/probe.txt; sleep 1; done ) &\n"
	prober := lab.mustCreate(ctx, t, map[string]any{"name": "prober", "flavorId": "tiny", "imageId": "busybox",
		"userData": base64.StdEncoding.EncodeToString([]byte(probe))})
	proberIP := f.until(t, bootLimit, "prober RUNNING", of(prober, func(ev event) bool { return ev.Instance.running() })).Instance.Status.PrivateIP

	// seen waits until the prober reports the port as want in a probe made after round after.
	seen := func(what, want string, after int) int {
		t.Helper()
		var round int
		awaitPage(t, host, proberIP, "/probe.txt", func(s string) bool {
			n, r, ok := strings.Cut(strings.TrimSpace(s), " ")
			round, _ = strconv.Atoi(n)
			return ok && round > after && r == want
		})
		t.Logf("%s: probe %d says %s", what, round, want)
		return round
	}
	setGroups := func(groups ...string) {
		t.Helper()
		lab.verb(ctx, t, "updateInstance", target, map[string]any{"networking": map[string]any{"securityGroupIds": groups}})
	}

	round := seen("port 80 in no group of the target's", "closed", 2)
	setGroups("ping", "web")
	round = seen("port 80 opened by group web", "open", round)
	setGroups("ping")
	seen("group web taken away again", "closed", round)

	if got := awaitPage(t, host, targetIP, "/boot-id.txt", func(s string) bool { return s != "" }); got != boot {
		t.Errorf("the target booted again (%s, was %s): changing groups must apply without a reboot", got, boot)
	}
	if hasReason(lab.get(ctx, t, target), "Errored") {
		t.Errorf("target after the changes: %s", lab.get(ctx, t, target))
	}
}

// awaitPage waits until the guest at ip serves path with content that ok accepts, and
// returns it (trimmed).
func awaitPage(t *testing.T, host *virttest.Host, ip, path string, ok func(string) bool) string {
	t.Helper()
	var got string
	await(t, bootLimit, pollEvery, fmt.Sprintf("%s on %s", path, ip), func() error {
		ctx, cancel := context.WithTimeout(context.Background(), pollEvery*8)
		defer cancel()
		body, err := httpGet(ctx, host, ip, path)
		if err != nil {
			return err
		}
		if got = strings.TrimSpace(body); !ok(got) {
			return fmt.Errorf("serves %q", got)
		}
		return nil
	})
	return got
}
