package libvirt

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/redistest"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/virttest"
)

func TestServerOfVolume(t *testing.T) {
	id := uuid.NewString()
	for name, want := range map[string]string{
		namePrefix + id + ".qcow2":      id,
		namePrefix + id + "-seed.iso":   id,
		namePrefix + "image-busybox":    "",
		namePrefix + "not-a-uuid.qcow2": "",
		"someone-else.qcow2":            "",
	} {
		got, ok := serverOfVolume(name)
		if got != want || ok != (want != "") {
			t.Errorf("serverOfVolume(%q) = %q, %v; want %q", name, got, ok, want)
		}
	}
}

// A server's volume without its domain (a create cut short) is deleted once it is old
// enough; base images and young volumes are kept.
func TestLibvirtCollectsOrphanedVolumes(t *testing.T) {
	host := virttest.Start(t, virttest.Options{})
	rs, err := redistest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rs.Stop)
	cat, err := region.Parse([]byte(fmt.Sprintf(`{"regions": [{"id": "lab", "name": "Lab", "driver": "libvirt",
		"libvirt": {"uri": %q, "poolPath": %q, "accel": "tcg"}}], "organizations": [], "networks": [], "securityGroups": [],
		"sshCertificateAuthorities": [], "flavors": [], "images": []}`, host.URI, filepath.Join(host.Dir, "pool"))))
	if err != nil {
		t.Fatal(err)
	}
	lab, _ := cat.Region("lab")
	now := time.Now()
	d, err := New(Options{Region: *lab, Catalog: cat, Redis: redis.NewClient(&redis.Options{Addr: rs.Addr}),
		Logger: slog.New(slog.DiscardHandler), Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	eventually.Holds(t, 30*time.Second, d.Connected, "driver connected")
	conn, err := d.host("test")
	if err != nil {
		t.Fatal(err)
	}
	orphan := namePrefix + uuid.NewString() + ".qcow2"
	base := namePrefix + "image-busybox"
	for _, name := range []string{orphan, base} {
		if _, err := d.upload(conn, d.pool, name, "raw", strings.NewReader("disk"), 4); err != nil {
			t.Fatal(err)
		}
	}
	volumes := func() []string {
		vols, _, err := conn.StoragePoolListAllVolumes(d.pool, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, v := range vols {
			names = append(names, v.Name)
		}
		return names
	}
	if n, err := d.collectVolumes(conn, d.pool); n != 0 || err != nil {
		t.Fatalf("collected %d (%v) volumes made a moment ago, want none: a create may be under way", n, err)
	}
	now = now.Add(orphanAge + time.Minute)
	if n, err := d.collectVolumes(conn, d.pool); n != 1 || err != nil {
		t.Fatalf("collected %d volumes (%v), want the orphan's one", n, err)
	}
	if got := volumes(); slices.Contains(got, orphan) || !slices.Contains(got, base) {
		t.Errorf("volumes left: %v, want the base image's and not the orphan's", got)
	}
}
