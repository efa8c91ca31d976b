// Package openstack tests computeql end to end in front of a real OpenStack control plane
// (package openstacktest: Keystone, Glance, Placement, Nova with a libvirt compute on a
// private libvirtd (package virttest) booting real guests, Neutron): the built binary as an api and a worker process on a real redis-server, serving an
// OpenStack region that names the control plane's cloud in its clouds.yaml. Everything a user
// does goes through GraphQL and one WebSocket subscriber; what the cloud did is checked from
// outside computeql, through gophercloud with the cloud's own credentials.
//
// The control plane takes about a minute to start and most of the machine's two cores, so
// the tests start one only: every check that needs it is a step of TestOpenStackLifecycle.
// BenchmarkOpenStackCreate, run apart (make bench-openstack), starts its own.
package openstack

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	gopenstack "github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/instanceactions"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gorilla/websocket"

	"github.com/computeql/computeql/e2e/harness"
	"github.com/computeql/computeql/openstacktest"
)

func TestMain(m *testing.M) { harness.Main(m) }

// The catalogue's names for the seeded objects: other than the cloud's ids, so that every
// lookup the driver makes must go through the catalogue's "openstack" references.
const (
	org       = "acme"
	project   = "web"
	regionID  = "os"
	networkID = "os-web"
	flavorID  = "tiny"
	imageID   = "blank"
	// prefix is the seeded subnet's (openstacktest's seed).
	prefix = "192.0.2.0/24"
)

// writeCatalog writes a catalogue whose one region is the control plane's cloud, with the
// seeded network, flavor and image under catalogue ids of their own, for the processes'
// --catalog.
func writeCatalog(t testing.TB, c *openstacktest.Cloud) string {
	t.Helper()
	ref := func(id string) map[string]any { return map[string]any{"id": id} }
	doc := map[string]any{
		"regions": []any{map[string]any{"id": regionID, "name": "OpenStack", "driver": "openstack",
			// A poll every half second: the fake driver acts in about a second, and each step
			// would otherwise wait up to the default 2 s to be seen.
			"openstack": map[string]any{"cloud": openstacktest.CloudName, "pollInterval": "500ms"}}},
		"organizations": []any{map[string]any{"id": org, "name": "Acme", "projects": []any{map[string]any{"id": project, "name": "Web"}},
			"quota": map[string]any{"servers": 20, "cpus": 64, "memoryGiB": 256}}},
		"networks": []any{map[string]any{"id": networkID, "name": "web", "organizationId": org, "projectId": project,
			"region": regionID, "prefix": prefix, "openstack": ref(c.NetworkID)}},
		"securityGroups":            []any{},
		"sshCertificateAuthorities": []any{},
		"flavors": []any{map[string]any{"id": flavorID, "name": "tiny", "cpus": 1, "memoryGiB": 1, "diskGB": 2,
			"architecture": "x86_64", "regions": []string{regionID}, "openstack": ref(c.FlavorID)}},
		"images": []any{map[string]any{"id": imageID, "name": "blank", "architecture": "x86_64", "sizeGiB": 1,
			"virtualization": "any", "state": "ready", "regions": []string{regionID}, "openstack": ref(c.ImageID)}},
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

// deployment is an api and a worker process serving the catalogue, on a Redis of their own,
// with the cloud's clouds.yaml in their environment as an operator would give it.
type deployment struct {
	api    *harness.Process
	client *harness.Client
	token  string
}

func deploy(t testing.TB, c *openstacktest.Cloud, catalog string) *deployment {
	t.Helper()
	d := harness.NewDeployment(t, harness.StartRedis(t), harness.Options{
		// The rate limit would only get in the way of the benchmark's bursts.
		Args: []string{"--catalog", catalog, "--rate-limit", "-1"},
		Env:  []string{"OS_CLIENT_CONFIG_FILE=" + c.CloudsYAML},
	})
	api := d.API(t)
	d.Worker(t)
	token := d.Token(t, "--subject", "e2e-openstack", "--grant", org+"=admin")
	return &deployment{api: api, client: api.Client(t, token), token: token}
}

// userError is a mutation payload's userErrors entry.
type userError struct {
	Field   []string `json:"field"`
	Code    string   `json:"code"`
	Message string   `json:"message"`
}

// create runs createInstance of the tiny flavor and blank image in the project's network and
// returns the new instance's id.
func (d *deployment) create(ctx context.Context, t testing.TB, name string) string {
	t.Helper()
	id, err := d.tryCreate(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// tryCreate is create answering its failure, for goroutines other than the test's.
func (d *deployment) tryCreate(ctx context.Context, name string) (string, error) {
	in := map[string]any{"organizationId": org, "projectId": project, "networkId": networkID,
		"name": name, "flavorId": flavorID, "imageId": imageID}
	var data struct {
		CreateInstance struct {
			Instance *struct {
				ID string `json:"id"`
			} `json:"instance"`
			UserErrors []userError `json:"userErrors"`
		} `json:"createInstance"`
	}
	if err := d.client.Do(ctx, `mutation($in: CreateInstanceInput!) { createInstance(input: $in) {
		instance { id } userErrors { field code message } } }`, map[string]any{"in": in}, &data); err != nil {
		return "", fmt.Errorf("createInstance %s: %w", name, err)
	}
	if p := data.CreateInstance; p.Instance == nil || len(p.UserErrors) > 0 {
		return "", fmt.Errorf("createInstance %s: instance %v, userErrors %+v", name, p.Instance, p.UserErrors)
	}
	return data.CreateInstance.Instance.ID, nil
}

// verb runs a mutation that takes {id, ...} and answers userErrors (stopInstance,
// startInstance, rebootInstance, deleteInstance, snapshotInstance) and returns them; a
// top-level error fails the test.
func (d *deployment) verb(ctx context.Context, t testing.TB, mutation string, in map[string]any) []userError {
	t.Helper()
	inputType := strings.ToUpper(mutation[:1]) + mutation[1:] + "Input"
	var data map[string]struct {
		UserErrors []userError `json:"userErrors"`
	}
	q := fmt.Sprintf(`mutation($in: %s!) { %s(input: $in) { userErrors { field code message } } }`, inputType, mutation)
	if err := d.client.Do(ctx, q, map[string]any{"in": in}, &data); err != nil {
		t.Fatalf("%s %v: %v", mutation, in, err)
	}
	return data[mutation].UserErrors
}

// mustVerb runs a verb the test expects to be accepted.
func (d *deployment) mustVerb(ctx context.Context, t testing.TB, mutation, id string) {
	t.Helper()
	if errs := d.verb(ctx, t, mutation, map[string]any{"id": id}); len(errs) > 0 {
		t.Fatalf("%s %s: userErrors %+v", mutation, id, errs)
	}
}

// instance is what the tests read of an instance in events.
type instance struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	Status struct {
		ProvisioningStatus string `json:"provisioningStatus"`
		PowerState         string `json:"powerState"`
		PrivateIP          string `json:"privateIP"`
		MACAddress         string `json:"macAddress"`
		Conditions         []struct {
			Type    string `json:"type"`
			Status  string `json:"status"`
			Reason  string `json:"reason"`
			Message string `json:"message"`
		} `json:"conditions"`
	} `json:"status"`
}

// get reads an instance through the instance query.
func (d *deployment) get(ctx context.Context, t testing.TB, id string) instance {
	t.Helper()
	var data struct {
		Instance *instance `json:"instance"`
	}
	if err := d.client.Do(ctx, `query($id: ID!) { instance(id: $id) { id name
		status { provisioningStatus powerState privateIP macAddress conditions { type status reason message } } } }`,
		map[string]any{"id": id}, &data); err != nil {
		t.Fatalf("instance %s: %v", id, err)
	}
	if data.Instance == nil {
		t.Fatalf("instance %s: null", id)
	}
	return *data.Instance
}

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

// event is an instanceEvents subscription event.
type event struct {
	Kind     string   `json:"kind"`
	Action   *string  `json:"action"`
	Outcome  *string  `json:"outcome"`
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
	kind action outcome instance { id name
		status { provisioningStatus powerState privateIP macAddress conditions { type status reason message } } } } }`

// follower reads the organization's subscription in order: each wait looks only at the events
// after those earlier waits consumed, so that a state reached before an action is never taken
// for one reached after it.
type follower struct {
	sub  *harness.Subscription
	seen int
	last []event // the latest few, for a failure's message
}

func (d *deployment) follow(t testing.TB) *follower {
	t.Helper()
	return &follower{sub: d.api.Subscribe(t, d.token, subscription, map[string]any{"org": org})}
}

// until waits at most limit for the next event that matches, consuming it and every event
// before it, and returns it.
func (f *follower) until(t testing.TB, limit time.Duration, what string, match func(event) bool) event {
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

// guestReady is the line the busybox guest writes on its console once booted.
const guestReady = "computeql-guest: ready"

// consoleOutput reads the end of an instance's console through instanceConsoleOutput.
func (d *deployment) consoleOutput(ctx context.Context, t testing.TB, id string) string {
	t.Helper()
	var data struct {
		InstanceConsoleOutput struct {
			Text string `json:"text"`
		} `json:"instanceConsoleOutput"`
	}
	if err := d.client.Do(ctx, `query($id: ID!) { instanceConsoleOutput(id: $id) { text } }`, map[string]any{"id": id}, &data); err != nil {
		t.Fatalf("instanceConsoleOutput %s: %v", id, err)
	}
	return data.InstanceConsoleOutput.Text
}

// openConsole opens a console session of the instance through createConsoleSession and
// connects to its URL.
func (d *deployment) openConsole(ctx context.Context, t testing.TB, id string) *websocket.Conn {
	t.Helper()
	url, err := d.client.ConsoleSession(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	conn, res, err := websocket.DefaultDialer.DialContext(ctx, url, nil)
	if err != nil {
		t.Fatalf("open console %s: %v (%v)", url, err, res)
	}
	return conn
}

// typeAndRead types a line into a console session and reads until the console shows it.
func typeAndRead(t testing.TB, conn *websocket.Conn, line string) {
	t.Helper()
	if err := conn.WriteMessage(websocket.TextMessage, []byte(line+"\r")); err != nil {
		t.Fatalf("type into the console: %v", err)
	}
	harness.ReadConsoleUntil(t, conn, line, stepLimit)
}

// image is what the tests read of an image.
type image struct {
	ID    string `json:"id"`
	State string `json:"state"`
}

// snapshot runs snapshotInstance, which the test expects to be accepted, and returns its image.
func (d *deployment) snapshot(ctx context.Context, t testing.TB, id, name string) image {
	t.Helper()
	var data struct {
		SnapshotInstance struct {
			Image      *image      `json:"image"`
			UserErrors []userError `json:"userErrors"`
		} `json:"snapshotInstance"`
	}
	if err := d.client.Do(ctx, `mutation($id: ID!, $name: String!) { snapshotInstance(input: {id: $id, name: $name}) {
		image { id state } userErrors { field code message } } }`, map[string]any{"id": id, "name": name}, &data); err != nil {
		t.Fatal(err)
	}
	if p := data.SnapshotInstance; p.Image == nil || len(p.UserErrors) > 0 {
		t.Fatalf("snapshotInstance %s: image %v, userErrors %+v", id, p.Image, p.UserErrors)
	}
	return *data.SnapshotInstance.Image
}

// images lists the images the caller sees, through the images query.
func (d *deployment) images(ctx context.Context, t testing.TB) []image {
	t.Helper()
	var data struct {
		Images []image `json:"images"`
	}
	if err := d.client.Do(ctx, `{ images { id state } }`, nil, &data); err != nil {
		t.Fatalf("images: %v", err)
	}
	return data.Images
}

// nova is the test's own view of the cloud, through the same clouds.yaml as computeql's but
// none of its code.
type nova struct {
	compute, network, glance *gophercloud.ServiceClient
}

// glanceImage reads a Glance image.
func (n *nova) glanceImage(ctx context.Context, t testing.TB, id string) *images.Image {
	t.Helper()
	im, err := images.Get(ctx, n.glance, id).Extract()
	if err != nil {
		t.Fatalf("read Glance image %s: %v", id, err)
	}
	return im
}

// imageExists reports whether Glance has the image (a deleted one it answers 404).
func (n *nova) imageExists(ctx context.Context, t testing.TB, id string) bool {
	t.Helper()
	_, err := images.Get(ctx, n.glance, id).Extract()
	if gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
		return false
	}
	if err != nil {
		t.Fatalf("read Glance image %s: %v", id, err)
	}
	return true
}

func connect(t testing.TB, c *openstacktest.Cloud) *nova {
	t.Helper()
	pc, eo, err := c.Client(context.Background())
	if err != nil {
		t.Fatalf("authenticate through %s: %v", c.CloudsYAML, err)
	}
	compute, err := gopenstack.NewComputeV2(pc, eo)
	if err != nil {
		t.Fatal(err)
	}
	// 2.26 is the first microversion that filters servers by tag.
	compute.Microversion = "2.26"
	network, err := gopenstack.NewNetworkV2(pc, eo)
	if err != nil {
		t.Fatal(err)
	}
	image, err := gopenstack.NewImageV2(pc, eo)
	if err != nil {
		t.Fatal(err)
	}
	return &nova{compute: compute, network: network, glance: image}
}

// servers lists the cloud's servers (not deleted) that carry the Nova tag the driver writes
// for an instance.
func (n *nova) servers(ctx context.Context, t testing.TB, instanceID string) []servers.Server {
	t.Helper()
	pages, err := servers.List(n.compute, servers.ListOpts{Tags: "instance-id=" + instanceID}).AllPages(ctx)
	if err != nil {
		t.Fatalf("list servers of instance %s: %v", instanceID, err)
	}
	list, err := servers.ExtractServers(pages)
	if err != nil {
		t.Fatalf("list servers of instance %s: %v", instanceID, err)
	}
	return list
}

// server is the one server of an instance, failing the test when there is not exactly one.
func (n *nova) server(ctx context.Context, t testing.TB, instanceID string) servers.Server {
	t.Helper()
	list := n.servers(ctx, t, instanceID)
	if len(list) != 1 {
		t.Fatalf("Nova has %d servers of instance %s, want 1", len(list), instanceID)
	}
	return list[0]
}

// ports lists the Neutron ports of a server.
func (n *nova) ports(ctx context.Context, t testing.TB, serverID string) []ports.Port {
	t.Helper()
	pages, err := ports.List(n.network, ports.ListOpts{DeviceID: serverID}).AllPages(ctx)
	if err != nil {
		t.Fatalf("list ports of server %s: %v", serverID, err)
	}
	list, err := ports.ExtractPorts(pages)
	if err != nil {
		t.Fatalf("list ports of server %s: %v", serverID, err)
	}
	return list
}

// actions lists the actions Nova recorded on a server (create, stop, start, reboot, …), as
// Nova names them, oldest first.
func (n *nova) actions(ctx context.Context, t testing.TB, serverID string) []string {
	t.Helper()
	pages, err := instanceactions.List(n.compute, serverID, nil).AllPages(ctx)
	if err != nil {
		t.Fatalf("list actions of server %s: %v", serverID, err)
	}
	list, err := instanceactions.ExtractInstanceActions(pages)
	if err != nil {
		t.Fatalf("list actions of server %s: %v", serverID, err)
	}
	out := make([]string, len(list))
	for i, a := range list {
		// Nova lists the newest first.
		out[len(list)-1-i] = a.Action
	}
	return out
}

// stopwatch logs each step of a test with the time since the test began, so that a run's log
// shows where the time goes.
type stopwatch struct {
	t     testing.TB
	start time.Time
}

func newStopwatch(t testing.TB) *stopwatch { return &stopwatch{t: t, start: time.Now()} }

func (s *stopwatch) step(format string, args ...any) {
	s.t.Helper()
	s.t.Logf("%6.1fs  %s", time.Since(s.start).Seconds(), fmt.Sprintf(format, args...))
}

// step runs one step of a sequence as a subtest; the sequence stops at the first that fails,
// since every later step starts from the state it should have left.
func step(t *testing.T, name string, fn func(t *testing.T)) {
	t.Helper()
	if !t.Run(name, fn) {
		t.FailNow()
	}
}
