package libvirt

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/redistest"
	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/virttest"
)

// importCounter counts the "image imported" lines a driver logs: one per upload.
type importCounter struct {
	slog.Handler
	n *atomic.Int64
}

func (importCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h importCounter) WithAttrs([]slog.Attr) slog.Handler     { return h }
func (h importCounter) WithGroup(string) slog.Handler          { return h }

func (h importCounter) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "image imported into the pool" {
		h.n.Add(1)
	}
	return nil
}

// Two processes of a region creating servers from a new image at once: one imports it, the
// other waits for the whole of it, and neither ever backs a disk onto a partial upload. An
// import that died (a volume without the ready mark, no lock) is redone; a volume without
// the mark that a disk already backs onto is taken as whole and never deleted.
func TestLibvirtImportsImageOnceAcrossProcesses(t *testing.T) {
	host := virttest.Start(t, virttest.Options{})
	rs, err := redistest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rs.Stop)
	// Large enough that an upload takes a while: the other process looks meanwhile.
	file := filepath.Join(t.TempDir(), "big.raw")
	content := bytes.Repeat([]byte("computeql-image-"), 8<<20/16*8) // 64 MiB
	if err := os.WriteFile(file, content, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(content)
	doc := labCatalogJSON(host, fmt.Sprintf(`{"id": "big", "name": "big", "architecture": "x86_64", "sizeGiB": 1,
		"virtualization": "any", "state": "ready", "regions": ["lab"], "file": %q}`, file))
	var imports atomic.Int64
	logger := slog.New(importCounter{Handler: slog.DiscardHandler, n: &imports})
	a, connA := labDriver(t, doc, rs.Addr, logger, time.Now)
	b, connB := labDriver(t, doc, rs.Addr, logger, time.Now)
	img, _ := a.opts.Catalog.Image("big")
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()

	// whole fails the test unless the volume's file holds the image, byte for byte, at the
	// moment baseVolume returned it.
	whole := func(who string, v volume) {
		t.Helper()
		got, err := os.ReadFile(v.path)
		if err != nil {
			t.Errorf("%s: %v", who, err)
			return
		}
		if sha256.Sum256(got) != sum {
			t.Errorf("%s: got a base volume of %d bytes that is not the image (%d bytes): a disk would back onto a partial upload", who, len(got), len(content))
		}
	}

	var wg sync.WaitGroup
	for _, p := range []struct {
		name string
		d    *hostDriver
	}{{"process a", a}, {"process b", b}} {
		wg.Go(func() {
			conn := connA
			if p.d == b {
				conn = connB
			}
			v, err := p.d.baseVolume(ctx, conn, p.d.pool, img)
			if err != nil {
				t.Errorf("%s: %v", p.name, err)
				return
			}
			whole(p.name, v)
		})
	}
	wg.Wait()
	if n := imports.Load(); n != 1 {
		t.Errorf("%d imports of the image by two processes at once, want 1", n)
	}
	name := namePrefix + "image-big"
	ready := imageReadyKey("lab", "", name)
	if n, err := rdb.Exists(ctx, ready).Result(); err != nil || n != 1 {
		t.Fatalf("ready mark %s: %d, %v; want it set", ready, n, err)
	}
	if n, err := rdb.Exists(ctx, importLockKey("lab", "", name)).Result(); err != nil || n != 0 {
		t.Errorf("import lock still held after the import: %d, %v", n, err)
	}

	t.Run("an import that died is redone", func(t *testing.T) {
		// What a process killed mid-upload leaves: the volume, no mark, and (once its lease
		// ran out) no lock. Its bytes are cut short here to make the point.
		if err := rdb.Del(ctx, ready).Err(); err != nil {
			t.Fatal(err)
		}
		v, err := a.baseVolume(ctx, connA, a.pool, img)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(v.path, 1<<20); err != nil {
			t.Fatal(err)
		}
		if err := rdb.Del(ctx, ready).Err(); err != nil {
			t.Fatal(err)
		}
		before := imports.Load()
		v, err = b.baseVolume(ctx, connB, b.pool, img)
		if err != nil {
			t.Fatal(err)
		}
		whole("after an unfinished import", v)
		if n := imports.Load() - before; n != 1 {
			t.Errorf("%d imports, want the unfinished one redone once", n)
		}
	})

	t.Run("a volume a disk backs onto is kept", func(t *testing.T) {
		base, err := a.baseVolume(ctx, connA, a.pool, img)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.overlay(connA, a.pool, namePrefix+"4b6f0c36-8a4e-4d5e-9a7e-3f1c2d3e4f50.qcow2", base, 1<<30); err != nil {
			t.Fatal(err)
		}
		if err := rdb.Del(ctx, ready).Err(); err != nil {
			t.Fatal(err)
		}
		before := imports.Load()
		v, err := b.baseVolume(ctx, connB, b.pool, img)
		if err != nil {
			t.Fatal(err)
		}
		if v.path != base.path {
			t.Errorf("base volume %s, want the one the disk backs onto, %s", v.path, base.path)
		}
		if n := imports.Load() - before; n != 0 {
			t.Errorf("%d imports: a base a disk backs onto was imported again", n)
		}
		if n, err := rdb.Exists(ctx, ready).Result(); err != nil || n != 1 {
			t.Errorf("ready mark: %d, %v; want it set again", n, err)
		}
	})

	t.Run("Redis not answering is unavailable", func(t *testing.T) {
		c, err := region.Parse([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		lab, _ := c.Region("lab")
		dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
		t.Cleanup(func() { _ = dead.Close() })
		d, err := New(Options{Region: *lab, Catalog: c, Redis: dead, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.hosts[0].baseVolume(ctx, connA, a.pool, img); !errors.Is(err, region.ErrUnavailable) {
			t.Errorf("baseVolume with Redis down: %v, want ErrUnavailable", err)
		}
	})
}
