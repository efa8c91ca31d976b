// Package virt tests computeql end to end on real virtual machines: the built binary as an api
// and a worker process, sharing a real redis-server, serving a libvirt region whose host is a
// private libvirtd (package virttest) in network and mount namespaces of its own, with QEMU
// guests under TCG. Everything a user does goes through GraphQL and one WebSocket subscriber;
// what the guests and the host did is checked from outside the API: HTTP and SSH into the
// guests from inside the host's network namespace (virttest.Host.Dial), and libvirt's own view
// of domains, volumes and DHCP reservations through a connection of the test's own.
//
// Each test owns its host, Redis and processes, so they run in parallel: a guest spends most
// of its boot waiting on emulated hardware, which the others can use.
//
// The guest images come from $COMPUTEQL_IMAGES_DIR (make virt-test sets it to images/, which
// make images fills): busybox/{vmlinuz,initrd.img} and debian/{disk.qcow2,vmlinuz,initrd.img,
// cmdline}. A missing image skips its test, or fails it when CI is set.
package virt

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/computeql/computeql/e2e/harness"
	"github.com/computeql/computeql/virttest"
)

func TestMain(m *testing.M) { harness.Main(m) }

// ImagesEnv names the directory holding the guest images; make virt-test sets it.
const ImagesEnv = "COMPUTEQL_IMAGES_DIR"

// What every test's catalogue has in common: one organization and project, and one network
// of the libvirt region "lab". Each host is in a namespace of its own, so every test may use
// the same prefix.
const (
	org       = "acme"
	project   = "web"
	networkID = "lab-web"
	prefix    = "10.92.0.0/24"
	// poolName and libvirtNetwork are what the driver names the region's pool and the
	// network's libvirt network (its defaults: docs/libvirt.md, "The region's settings").
	poolName       = "computeql"
	libvirtNetwork = "computeql-" + networkID
)

// imagePaths returns the named files of a guest image directory, skipping the test (failing
// it under CI) when one is missing.
func imagePaths(t *testing.T, image string, files ...string) []string {
	t.Helper()
	dir := os.Getenv(ImagesEnv)
	var paths, missing []string
	for _, f := range files {
		p := filepath.Join(dir, image, f)
		if _, err := os.Stat(p); dir == "" || err != nil {
			missing = append(missing, f)
		}
		paths = append(paths, p)
	}
	if len(missing) > 0 {
		msg := fmt.Sprintf("no %s guest image (%s) in $%s=%q: run make virt-test, which builds it", image, strings.Join(missing, ", "), ImagesEnv, dir)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return paths
}

// catalogue is what a test puts in its catalogue besides the region, organization and network.
type catalogue struct {
	flavors, images, cas, securityGroups []map[string]any
	// hosts, when given, are the region's hosts (rack1, rack2, …) instead of writeCatalog's.
	hosts []*virttest.Host
}

// busyboxCatalogue offers flavor "tiny" and image "busybox", the guest that boots in seconds.
func busyboxCatalogue(t *testing.T) catalogue {
	t.Helper()
	paths := imagePaths(t, "busybox", "vmlinuz", "initrd.img")
	return catalogue{
		flavors: []map[string]any{flavor("tiny", 1, 1, 2, nil)},
		images: []map[string]any{image("busybox", 1, map[string]any{
			"kernel": paths[0], "initrd": paths[1], "cmdline": "console=ttyS0"})},
	}
}

// writeCatalog writes the catalogue of a libvirt region "lab" on the host to a file for the
// processes' --catalog. The quota is wide enough that no refusal a test looks for is mixed
// with QUOTA_EXCEEDED.
func writeCatalog(t *testing.T, host *virttest.Host, c catalogue) string {
	t.Helper()
	settings := map[string]any{
		"accel": "tcg",
		// Long enough for a guest to power off on the ACPI button under a loaded TCG,
		// short enough that a guest ignoring it does not stall the test for long.
		"stopTimeout": "30s",
	}
	if len(c.hosts) == 0 {
		settings["uri"], settings["poolPath"] = host.URI, filepath.Join(host.Dir, "pool")
	} else {
		hosts := make([]any, len(c.hosts))
		for i, h := range c.hosts {
			hosts[i] = map[string]any{"name": fmt.Sprintf("rack%d", i+1), "uri": h.URI, "poolPath": filepath.Join(h.Dir, "pool")}
		}
		settings["hosts"] = hosts
	}
	doc := map[string]any{
		"regions": []any{map[string]any{"id": "lab", "name": "Lab", "driver": "libvirt", "libvirt": settings}},
		"organizations": []any{map[string]any{"id": org, "name": "Acme", "projects": []any{map[string]any{"id": project, "name": "Web"}},
			"quota": map[string]any{"servers": 10, "gpus": 8, "publicIPs": 2, "cpus": 64, "memoryGiB": 8192}}},
		"networks": []any{map[string]any{"id": networkID, "name": "web", "organizationId": org, "projectId": project,
			"region": "lab", "prefix": prefix}},
		"securityGroups":            orEmpty(c.securityGroups),
		"sshCertificateAuthorities": orEmpty(c.cas),
		"flavors":                   orEmpty(c.flavors),
		"images":                    orEmpty(c.images),
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "catalog.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func orEmpty(list []map[string]any) []map[string]any {
	if list == nil {
		return []map[string]any{}
	}
	return list
}

// flavor is a catalogue flavor of the lab region; edit adds to it (a GPU, bare metal).
func flavor(id string, cpus, memoryGiB, diskGB int, edit func(map[string]any)) map[string]any {
	f := map[string]any{"id": id, "name": id, "cpus": cpus, "memoryGiB": memoryGiB, "diskGB": diskGB,
		"architecture": "x86_64", "regions": []string{"lab"}}
	if edit != nil {
		edit(f)
	}
	return f
}

// image is a ready x86_64 catalogue image of the lab region with what it boots (file, volume,
// kernel, initrd, cmdline).
func image(id string, sizeGiB int, boot map[string]any) map[string]any {
	im := map[string]any{"id": id, "name": id, "architecture": "x86_64", "sizeGiB": sizeGiB,
		"virtualization": "any", "state": "ready", "regions": []string{"lab"}}
	for k, v := range boot {
		im[k] = v
	}
	return im
}

// lab is a deployment serving the catalogue: one api and one worker process on a Redis of
// their own, and an admin of the organization.
type lab struct {
	api, worker *harness.Process
	client      *harness.Client
	token       string
}

func deploy(t *testing.T, catalog string) *lab {
	t.Helper()
	d := harness.NewDeployment(t, harness.StartRedis(t), harness.Options{
		// The rate limit would only get in the way of the tests' polls.
		Args: []string{"--catalog", catalog, "--rate-limit", "-1"},
	})
	api := d.API(t)
	worker := d.Worker(t)
	token := d.Token(t, "--subject", "e2e-virt", "--grant", org+"=admin")
	return &lab{api: api, worker: worker, client: api.Client(t, token), token: token}
}

// userError is a mutation payload's userErrors entry.
type userError struct {
	Field   []string `json:"field"`
	Code    string   `json:"code"`
	Message string   `json:"message"`
}

// create runs createInstance in the lab's project and network with the input's other fields;
// it returns the new instance's id, or "" and the userErrors.
func (l *lab) create(ctx context.Context, t *testing.T, in map[string]any) (string, []userError) {
	t.Helper()
	full := map[string]any{"organizationId": org, "projectId": project, "networkId": networkID}
	for k, v := range in {
		full[k] = v
	}
	var data struct {
		CreateInstance struct {
			Instance *struct {
				ID string `json:"id"`
			} `json:"instance"`
			UserErrors []userError `json:"userErrors"`
		} `json:"createInstance"`
	}
	if err := l.client.Do(ctx, `mutation($in: CreateInstanceInput!) { createInstance(input: $in) {
		instance { id } userErrors { field code message } } }`, map[string]any{"in": full}, &data); err != nil {
		t.Fatalf("createInstance %v: %v", in["name"], err)
	}
	p := data.CreateInstance
	if p.Instance == nil {
		return "", p.UserErrors
	}
	if len(p.UserErrors) > 0 {
		t.Fatalf("createInstance %v: an instance and userErrors %+v", in["name"], p.UserErrors)
	}
	return p.Instance.ID, nil
}

// mustCreate creates an instance the test expects to be accepted.
func (l *lab) mustCreate(ctx context.Context, t *testing.T, in map[string]any) string {
	t.Helper()
	id, errs := l.create(ctx, t, in)
	if id == "" {
		t.Fatalf("createInstance %v refused: %+v", in["name"], errs)
	}
	return id
}

// verb runs one of the mutations that take {id, ...} and return an instance and userErrors
// (startInstance, stopInstance, rebootInstance, deleteInstance) and fails the test on any
// error.
func (l *lab) verb(ctx context.Context, t *testing.T, mutation, id string, extra map[string]any) {
	t.Helper()
	if err := l.tryVerb(ctx, mutation, id, extra); err != nil {
		t.Fatal(err)
	}
}

// tryVerb is verb returning the error: the response's top-level errors (harness.Errors), or
// its userErrors.
func (l *lab) tryVerb(ctx context.Context, mutation, id string, extra map[string]any) error {
	in := map[string]any{"id": id}
	for k, v := range extra {
		in[k] = v
	}
	inputType := strings.ToUpper(mutation[:1]) + mutation[1:] + "Input"
	var data map[string]struct {
		UserErrors []userError `json:"userErrors"`
	}
	q := fmt.Sprintf(`mutation($in: %s!) { %s(input: $in) { userErrors { field code message } } }`, inputType, mutation)
	if err := l.client.Do(ctx, q, map[string]any{"in": in}, &data); err != nil {
		return fmt.Errorf("%s %s: %w", mutation, id, err)
	}
	if errs := data[mutation].UserErrors; len(errs) > 0 {
		return fmt.Errorf("%s %s: userErrors %+v", mutation, id, errs)
	}
	return nil
}

// instance is what the tests read of an instance, in queries and events alike.
type instance struct {
	ID                string  `json:"id"`
	Name              string  `json:"name"`
	FlavorID          string  `json:"flavorId"`
	ImageID           string  `json:"imageId"`
	DesiredPowerState string  `json:"desiredPowerState"`
	DeletedAt         *string `json:"deletedAt"`
	Status            struct {
		ProvisioningStatus string      `json:"provisioningStatus"`
		PowerState         string      `json:"powerState"`
		HealthStatus       string      `json:"healthStatus"`
		PrivateIP          string      `json:"privateIP"`
		MACAddress         string      `json:"macAddress"`
		Conditions         []condition `json:"conditions"`
	} `json:"status"`
}

type condition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

const instanceFields = `id name flavorId imageId desiredPowerState deletedAt
	status { provisioningStatus powerState healthStatus privateIP macAddress conditions { type status reason message } }`

func (i instance) running() bool {
	return i.Status.ProvisioningStatus == "PROVISIONED" && i.Status.PowerState == "RUNNING" && i.Status.PrivateIP != ""
}

func (i instance) String() string {
	var conds []string
	for _, c := range i.Status.Conditions {
		conds = append(conds, fmt.Sprintf("%s=%s %s: %q", c.Type, c.Status, c.Reason, c.Message))
	}
	return fmt.Sprintf("%s %s/%s ip=%q mac=%q conditions=[%s]", i.Name, i.Status.ProvisioningStatus, i.Status.PowerState,
		i.Status.PrivateIP, i.Status.MACAddress, strings.Join(conds, "; "))
}

// consoleSession opens a console session of the instance and returns its URL.
func (l *lab) consoleSession(ctx context.Context, t *testing.T, id string) string {
	t.Helper()
	url, err := l.client.ConsoleSession(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return url
}

// get reads an instance through the instance query.
func (l *lab) get(ctx context.Context, t *testing.T, id string) instance {
	t.Helper()
	var data struct {
		Instance *instance `json:"instance"`
	}
	if err := l.client.Do(ctx, `query($id: ID!) { instance(id: $id) { `+instanceFields+` } }`, map[string]any{"id": id}, &data); err != nil {
		t.Fatalf("instance %s: %v", id, err)
	}
	if data.Instance == nil {
		t.Fatalf("instance %s: null", id)
	}
	return *data.Instance
}

// quotaUsed is the organization's usage by kind.
func (l *lab) quotaUsed(ctx context.Context, t *testing.T) map[string]int64 {
	t.Helper()
	q, err := l.client.Quota(ctx, org)
	if err != nil {
		t.Fatal(err)
	}
	return q.Used
}

// event is an instanceEvents subscription event.
type event struct {
	Kind     string   `json:"kind"`
	Action   *string  `json:"action"`
	Outcome  *string  `json:"outcome"`
	Message  *string  `json:"message"`
	Instance instance `json:"instance"`
}

func (e event) String() string {
	s := e.Kind
	if e.Action != nil {
		s += " " + *e.Action
	}
	return s + ": " + e.Instance.String()
}

const subscription = `subscription($org: ID!) { instanceEvents(organizationId: $org) {
	kind action outcome message instance { ` + instanceFields + ` } } }`

// follower reads the organization's subscription in order: each wait looks only at the events
// after those earlier waits consumed, so that a state reached before an action is never taken
// for one reached after it.
type follower struct {
	sub  *harness.Subscription
	seen int     // events consumed
	last []event // the latest few, for a failure's message
}

// follow subscribes to the organization's instance events on the lab's API.
func (l *lab) follow(t *testing.T) *follower {
	t.Helper()
	return &follower{sub: l.api.Subscribe(t, l.token, subscription, map[string]any{"org": org})}
}

// until waits at most limit for the next event that matches, consuming it and every event
// before it, and returns it.
func (f *follower) until(t *testing.T, limit time.Duration, what string, match func(event) bool) event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var found event
	n := 0 // Wait hands over every event from the first, batch by batch
	err := f.sub.Wait(ctx, func(batch []json.RawMessage) bool {
		for _, raw := range batch {
			n++
			if n <= f.seen {
				continue
			}
			f.seen = n
			var data struct {
				InstanceEvents event `json:"instanceEvents"`
			}
			if err := json.Unmarshal(raw, &data); err != nil {
				t.Fatalf("decode event %s: %v", raw, err)
			}
			ev := data.InstanceEvents
			f.last = append(f.last[max(len(f.last)-7, 0):], ev)
			if match(ev) {
				found = ev
				return true
			}
		}
		return false
	})
	if err != nil {
		var recent []string
		for _, ev := range f.last {
			recent = append(recent, "  "+ev.String())
		}
		t.Fatalf("subscriber: %s not within %s: %v; the last events:\n%s", what, limit, err, strings.Join(recent, "\n"))
	}
	return found
}

// of matches the events of one instance that also match cond.
func of(id string, cond func(event) bool) func(event) bool {
	return func(ev event) bool { return ev.Instance.ID == id && cond(ev) }
}

// action matches the ACTION event of a verb that succeeded.
func action(name string) func(event) bool {
	return func(ev event) bool {
		return ev.Kind == "ACTION" && ev.Action != nil && *ev.Action == name && ev.Outcome == nil
	}
}

// await polls cond every interval until it returns nil, failing the test with cond's last
// error after limit. It is for what has no event to wait on — a guest that starts answering
// on the network — where eventually.Holds's 3 ms polls would be a dial into the namespace
// every few milliseconds, taking the two cores from the guests being waited for.
func await(t *testing.T, limit, interval time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not within %s: last: %v", what, limit, err)
		}
		<-tick.C
	}
}

// randomToken is a string a guest could not have come up with by itself.
func randomToken(prefix string) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // never fails on Linux
	return prefix + hex.EncodeToString(b)
}

// inPrefix checks that an instance's private IP is an address of the network's prefix, other
// than the gateway's (the host's own) and the broadcast address, and that its MAC is one.
func inPrefix(t *testing.T, inst instance) {
	t.Helper()
	p := netip.MustParsePrefix(prefix)
	ip, err := netip.ParseAddr(inst.Status.PrivateIP)
	gateway := p.Masked().Addr().Next()
	if err != nil || !p.Contains(ip) || ip == gateway || ip == p.Masked().Addr() || !p.Contains(ip.Next()) {
		t.Errorf("%s: private IP %q is not a guest address of %s", inst.Name, inst.Status.PrivateIP, prefix)
	}
	if _, err := net.ParseMAC(inst.Status.MACAddress); err != nil {
		t.Errorf("%s: MAC address %q: %v", inst.Name, inst.Status.MACAddress, err)
	}
}

// httpGet fetches a page of a guest's web server from inside the host's network namespace.
func httpGet(ctx context.Context, host *virttest.Host, ip, path string) (string, error) {
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
		DialContext:       host.Dial,
		DisableKeepAlives: true, // a guest that rebooted must be reached anew
	}}
	resp, err := client.Get("http://" + net.JoinHostPort(ip, "80") + path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return string(body), nil
}

// inspector is the test's own connection to the host's libvirtd: libvirt's view of what the
// workers made, independent of the driver's.
type inspector struct {
	l *libvirt.Libvirt
}

func inspect(t *testing.T, host *virttest.Host) *inspector {
	t.Helper()
	in := &inspector{}
	in.connect(t, host)
	t.Cleanup(func() { _ = in.l.Disconnect() })
	return in
}

// connect (re)connects the inspector, as after libvirtd was restarted.
func (in *inspector) connect(t *testing.T, host *virttest.Host) {
	t.Helper()
	l, err := host.Connect()
	if err != nil {
		t.Fatal(err)
	}
	if old := in.l; old != nil {
		// Not waited for: after a restart the old connection's daemon is gone, and
		// go-libvirt's Disconnect waits for its answer to the goodbye for ever.
		go func() { _ = old.Disconnect() }()
	}
	in.l = l
}

// domains returns the host's domains made by computeql, defined or running.
func (in *inspector) domains(t *testing.T) []libvirt.Domain {
	t.Helper()
	doms, _, err := in.l.ConnectListAllDomains(1, 0)
	if err != nil {
		t.Fatalf("list domains: %v", err)
	}
	return slices.DeleteFunc(doms, func(d libvirt.Domain) bool { return !strings.HasPrefix(d.Name, "computeql-") })
}

// definition is the domain's definition as the running domain has it.
func (in *inspector) definition(t *testing.T, d libvirt.Domain) libvirtxml.Domain {
	t.Helper()
	doc, err := in.l.DomainGetXMLDesc(d, 0)
	if err != nil {
		t.Fatalf("domain %s: %v", d.Name, err)
	}
	var def libvirtxml.Domain
	if err := def.Unmarshal(doc); err != nil {
		t.Fatalf("domain %s: %v", d.Name, err)
	}
	return def
}

// domainByMAC returns the domain whose network interface has the MAC.
func (in *inspector) domainByMAC(t *testing.T, mac string) (libvirt.Domain, bool) {
	t.Helper()
	for _, d := range in.domains(t) {
		def := in.definition(t, d)
		if def.Devices == nil {
			continue
		}
		for _, nic := range def.Devices.Interfaces {
			if nic.MAC != nil && strings.EqualFold(nic.MAC.Address, mac) {
				return d, true
			}
		}
	}
	return libvirt.Domain{}, false
}

// disk is the file a domain's first disk (vda) is, as the running domain has it.
func (in *inspector) disk(t *testing.T, d libvirt.Domain) string {
	t.Helper()
	def := in.definition(t, d)
	for _, disk := range def.Devices.Disks {
		if disk.Target != nil && disk.Target.Dev == "vda" && disk.Source != nil && disk.Source.File != nil {
			return disk.Source.File.File
		}
	}
	return ""
}

// state is a domain's state and its reason.
func (in *inspector) state(t *testing.T, d libvirt.Domain) (libvirt.DomainState, int32) {
	t.Helper()
	state, reason, err := in.l.DomainGetState(d, 0)
	if err != nil {
		t.Fatalf("state of domain %s: %v", d.Name, err)
	}
	return libvirt.DomainState(state), reason
}

// volumes returns the names of the volumes in the region's pool, as the host sees them now.
func (in *inspector) volumes(t *testing.T) []string {
	t.Helper()
	pool, err := in.l.StoragePoolLookupByName(poolName)
	if err != nil {
		t.Fatalf("pool %s: %v", poolName, err)
	}
	if err := in.l.StoragePoolRefresh(pool, 0); err != nil {
		t.Fatalf("refresh pool %s: %v", poolName, err)
	}
	vols, _, err := in.l.StoragePoolListAllVolumes(pool, 1, 0)
	if err != nil {
		t.Fatalf("volumes of pool %s: %v", poolName, err)
	}
	names := make([]string, len(vols))
	for i, v := range vols {
		names[i] = v.Name
	}
	slices.Sort(names)
	return names
}

// serverVolumes returns the volumes of the pool that belong to a server (computeql-<uuid>.qcow2,
// computeql-<uuid>-seed.iso), leaving out base images (computeql-image-<id>).
func (in *inspector) serverVolumes(t *testing.T) []string {
	t.Helper()
	return slices.DeleteFunc(in.volumes(t), func(name string) bool { return strings.HasPrefix(name, "computeql-image-") })
}

// reservations returns the DHCP reservations of the network's libvirt network, as MAC=IP; none
// when the network was never made.
func (in *inspector) reservations(t *testing.T) []string {
	t.Helper()
	n, err := in.l.NetworkLookupByName(libvirtNetwork)
	var lerr libvirt.Error
	if errors.As(err, &lerr) && lerr.Code == uint32(libvirt.ErrNoNetwork) {
		return nil
	}
	if err != nil {
		t.Fatalf("network %s: %v", libvirtNetwork, err)
	}
	doc, err := in.l.NetworkGetXMLDesc(n, 0)
	if err != nil {
		t.Fatalf("network %s: %v", libvirtNetwork, err)
	}
	var def libvirtxml.Network
	if err := def.Unmarshal(doc); err != nil {
		t.Fatalf("network %s: %v", libvirtNetwork, err)
	}
	var out []string
	for _, ip := range def.IPs {
		if ip.DHCP == nil {
			continue
		}
		for _, h := range ip.DHCP.Hosts {
			out = append(out, strings.ToLower(h.MAC)+"="+h.IP)
		}
	}
	return out
}

// stopwatch logs each step of a test with the time since the test began, so that a run's log
// shows where the time goes.
type stopwatch struct {
	t     *testing.T
	start time.Time
}

func newStopwatch(t *testing.T) *stopwatch { return &stopwatch{t: t, start: time.Now()} }

func (s *stopwatch) step(format string, args ...any) {
	s.t.Helper()
	s.t.Logf("%6.1fs  %s", time.Since(s.start).Seconds(), fmt.Sprintf(format, args...))
}
