package app

import (
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/computeql/computeql/redistest"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/sim"
)

// TestRegionDriversOfAnOpenStackRegion: an OpenStack region's driver is built from the cloud
// that clouds.yaml (found through OS_CLIENT_CONFIG_FILE, as OpenStack's tools find it) names,
// in every role that calls the region and in none other, with nothing to run; a cloud that
// does not answer is ErrUnreachable, so that callers retry; a cloud clouds.yaml lacks stops
// the process from starting.
func TestRegionDriversOfAnOpenStackRegion(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	clouds := filepath.Join(t.TempDir(), "clouds.yaml")
	if err := os.WriteFile(clouds, []byte("clouds:\n  away:\n    auth:\n      auth_url: http://"+addr+"/v3\n"+
		"      username: u\n      password: p\n      user_domain_name: Default\n      project_name: p\n      project_domain_name: Default\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("OS_CLIENT_CONFIG_FILE", clouds)
	doc := strings.NewReplacer(
		`{"id": "lab", "name": "Lab", "driver": "libvirt", "libvirt": {"uri": "qemu+tcp://127.0.0.1:1/system"}}`,
		`{"id": "lab", "name": "Lab", "driver": "openstack", "openstack": {"cloud": "away", "requestTimeout": "5s"}}`,
		`, "file": "/srv/images/linux.qcow2"`, ``,
	).Replace(mixedCatalog)
	cat, err := region.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := redistest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	log := slog.New(slog.DiscardHandler)
	for _, tt := range []struct {
		role    string
		wantLab error
	}{
		{"all", region.ErrUnreachable},
		{"api", region.ErrUnreachable},
		{"worker", region.ErrUnreachable},
		{"region", region.ErrUnknownRegion},
	} {
		t.Run(tt.role, func(t *testing.T) {
			d, err := newRegionDrivers(cat, srv.Client(t), tt.role, sim.Options{Catalog: cat, Logger: log}, log, prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			for _, run := range d.runs {
				if name := runName(run); name != simRun {
					t.Errorf("run %s, want the simulator's only", name)
				}
			}
			lab := spec("lab", "net-lab")
			if _, err := d.router.CreateServer(t.Context(), lab); !errors.Is(err, tt.wantLab) {
				t.Errorf("create a server in lab: %v, want %v", err, tt.wantLab)
			}
			if _, err := d.router.FindServers(t.Context(), lab.Scope, region.InstanceTag, "i-lab"); !errors.Is(err, tt.wantLab) {
				t.Errorf("find servers in lab: %v, want %v", err, tt.wantLab)
			}
		})
	}

	missing := strings.Replace(doc, `"cloud": "away"`, `"cloud": "elsewhere"`, 1)
	if cat, err = region.Parse([]byte(missing)); err != nil {
		t.Fatal(err)
	}
	if _, err := newRegionDrivers(cat, srv.Client(t), "api", sim.Options{Catalog: cat, Logger: log}, log, prometheus.NewRegistry()); err == nil ||
		!strings.Contains(err.Error(), "elsewhere") {
		t.Errorf("a cloud clouds.yaml lacks: %v, want an error naming it", err)
	}
}
