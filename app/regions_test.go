package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/computeql/computeql/redistest"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/sim"
)

// mixedCatalog has two simulated regions and a libvirt region "lab" on a host nothing listens
// on (port 1 of the loopback), each with a network of acme/web.
const mixedCatalog = `{
  "regions": [
    {"id": "eu-west", "name": "EU West"},
    {"id": "us-east", "name": "US East", "driver": "sim"},
    {"id": "lab", "name": "Lab", "driver": "libvirt", "libvirt": {"uri": "qemu+tcp://127.0.0.1:1/system"}}
  ],
  "organizations": [{"id": "acme", "name": "Acme", "projects": [{"id": "web", "name": "Web"}]}],
  "networks": [
    {"id": "net-eu", "name": "eu", "organizationId": "acme", "projectId": "web", "region": "eu-west", "prefix": "10.10.0.0/24"},
    {"id": "net-us", "name": "us", "organizationId": "acme", "projectId": "web", "region": "us-east", "prefix": "10.11.0.0/24"},
    {"id": "net-lab", "name": "lab", "organizationId": "acme", "projectId": "web", "region": "lab", "prefix": "10.12.0.0/24"}
  ],
  "flavors": [{"id": "small", "name": "Small", "cpus": 1, "memoryGiB": 1, "diskGB": 10, "architecture": "x86_64",
    "regions": ["eu-west", "us-east", "lab"]}],
  "images": [{"id": "linux", "name": "Linux", "architecture": "x86_64", "sizeGiB": 1, "virtualization": "any", "state": "ready",
    "regions": ["eu-west", "us-east", "lab"], "file": "/srv/images/linux.qcow2"}]
}`

// spec is a server of acme/web in the region, on its network.
func spec(regionID, network string) region.ServerSpec {
	return region.ServerSpec{
		Scope: region.Scope{OrganizationID: "acme", ProjectID: "web", RegionID: regionID, NetworkID: network},
		Name:  "s-" + regionID, FlavorID: "small", ImageID: "linux",
		Tags: map[string]string{region.InstanceTag: "i-" + regionID},
	}
}

// runName names the method a run is, e.g. "sim.(*Sim).Run".
func runName(run func(context.Context) error) string {
	name := runtime.FuncForPC(reflect.ValueOf(run).Pointer()).Name()
	name = strings.TrimSuffix(name, "-fm") // a method value
	return name[strings.LastIndex(name, "/")+1:]
}

const (
	simRun     = "sim.(*Sim).Run"
	libvirtRun = "libvirt.(*Driver).Run"
)

// TestRegionDriversByRole: one simulator serves every simulated region, clocked by every role
// but api; a libvirt region has a driver of its own, connected in every role that calls the
// region (all, api, worker) and absent from the region role; until its host answers, a call for
// it is ErrUnavailable, so that callers retry.
func TestRegionDriversByRole(t *testing.T) {
	cat, err := region.Parse([]byte(mixedCatalog))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := redistest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	log := slog.New(slog.DiscardHandler)

	tests := []struct {
		role     string
		wantRuns []string // sorted
		// wantLab is the error a call for the libvirt region wraps.
		wantLab error
	}{
		{role: "all", wantRuns: []string{libvirtRun, simRun}, wantLab: region.ErrUnavailable},
		{role: "api", wantRuns: []string{libvirtRun}, wantLab: region.ErrUnavailable},
		{role: "worker", wantRuns: []string{libvirtRun, simRun}, wantLab: region.ErrUnavailable},
		{role: "region", wantRuns: []string{simRun}, wantLab: region.ErrUnknownRegion},
	}
	for _, tt := range tests {
		t.Run(tt.role, func(t *testing.T) {
			rdb := srv.Client(t)
			reg := prometheus.NewRegistry()
			d, err := newRegionDrivers(cat, rdb, tt.role, sim.Options{Catalog: cat, Logger: log}, log, reg)
			if err != nil {
				t.Fatal(err)
			}
			// A process with a libvirt driver says whether it reaches each host: this one's
			// host does not exist.
			families, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			var connected []string
			for _, f := range families {
				for _, m := range f.GetMetric() {
					if f.GetName() == "computeql_libvirt_host_connected" {
						connected = append(connected, fmt.Sprintf("%v=%v", m.GetLabel(), m.GetGauge().GetValue()))
					}
				}
			}
			wantConnected := 0
			if slices.Contains(tt.wantRuns, libvirtRun) {
				wantConnected = 1
			}
			if len(connected) != wantConnected || wantConnected == 1 && !strings.Contains(connected[0], `value:"default"`) ||
				wantConnected == 1 && !strings.HasSuffix(connected[0], "=0") {
				t.Errorf("computeql_libvirt_host_connected: %v, want %d series, for host default, at 0", connected, wantConnected)
			}
			var runs []string
			for _, run := range d.runs {
				runs = append(runs, runName(run))
			}
			slices.Sort(runs)
			if !slices.Equal(runs, tt.wantRuns) {
				t.Errorf("runs %v, want %v", runs, tt.wantRuns)
			}

			// The drivers run as the process would run them: the libvirt driver keeps dialling
			// its host, and every run returns once the process stops.
			ctx, stop := context.WithCancel(context.Background())
			done := make(chan error, len(d.runs))
			for _, run := range d.runs {
				go func() { done <- run(ctx) }()
			}
			t.Cleanup(func() {
				stop()
				for range d.runs {
					select {
					case err := <-done:
						if err != nil {
							t.Errorf("a driver's run returned %v", err)
						}
					case <-time.After(10 * time.Second):
						t.Fatal("a driver's run did not return within 10s of the process stopping")
					}
				}
			})

			lab := spec("lab", "net-lab")
			if _, err := d.router.CreateServer(ctx, lab); !errors.Is(err, tt.wantLab) {
				t.Errorf("create a server in lab: %v, want %v", err, tt.wantLab)
			}
			if _, err := d.router.FindServers(ctx, lab.Scope, region.InstanceTag, "i-lab"); !errors.Is(err, tt.wantLab) {
				t.Errorf("find servers in lab: %v, want %v", err, tt.wantLab)
			}

			// Both simulated regions are served by the one simulator, watched once: every
			// event comes through the driver named "sim", and each server's creation once.
			created := map[string]string{} // server id → region
			for _, s := range []region.ServerSpec{spec("eu-west", "net-eu"), spec("us-east", "net-us")} {
				got, err := d.router.CreateServer(ctx, s)
				if err != nil {
					t.Fatalf("create a server in %s: %v", s.RegionID, err)
				}
				created[got.ID] = s.RegionID
			}
			seen := map[string]int{}
			errSeen := errors.New("both creations seen")
			watchCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			err = d.router.Watch(watchCtx, url.Values{"sim": {"0-0"}}.Encode(), func(ev region.Event) error {
				cursors, err := url.ParseQuery(ev.Cursor)
				if err != nil {
					return err
				}
				if len(cursors) != 1 || cursors.Get("sim") == "" {
					return fmt.Errorf("event %+v: cursor %q, want only the driver sim's", ev, ev.Cursor)
				}
				if ev.Kind == region.ServerCreated {
					seen[ev.ServerID]++
				}
				if len(seen) == len(created) {
					return errSeen
				}
				return nil
			})
			if !errors.Is(err, errSeen) {
				t.Fatalf("watch: %v; creations seen %v, want %v", err, seen, created)
			}
			for id, regionID := range created {
				if seen[id] != 1 {
					t.Errorf("server %s of %s: created %d times in the watch, want once", id, regionID, seen[id])
				}
			}
		})
	}
}
