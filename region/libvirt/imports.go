package libvirt

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"libvirt.org/go/libvirtxml"

	"github.com/computeql/computeql/region"
)

// Importing an image's file into the pool takes seconds to minutes, and every worker process
// of the region may want the same image at once. A volume exists in the pool from the moment
// its upload starts, so its existence says nothing about its bytes: a disk made on a base
// still being uploaded boots from half an image. Hence, across processes:
//
//   - one process imports an image at a time: it holds importLockKey (SET NX with a random
//     token and a lease of importLease, renewed while it uploads);
//   - the importer sets imageReadyKey once the last byte is in; a base volume is backed onto
//     only when it exists and is marked ready;
//   - the others wait for the mark, or for the lock to free (an importer that died): then
//     one of them takes over, deletes the unmarked volume and imports it again;
//   - an unmarked volume that some server's disk already backs onto is whole (disks are made
//     only on whole bases, as by an earlier version that kept no mark): it is marked, never
//     deleted.
const (
	importLease = 30 * time.Second
	// importPoll is how often a process waiting for another's import looks again.
	importPoll = 500 * time.Millisecond
)

// renewLease extends a lock's lease (the import lock, a snapshot lock) if it is still ours.
// KEYS[1] the lock; ARGV[1] our token, ARGV[2] the lease in ms. Returns 1 if renewed, else 0.
var renewLease = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0`)

// releaseLease deletes a lock (the import lock, a snapshot lock) if it is still ours.
// KEYS[1] the lock; ARGV[1] our token. Returns 1 if released, else 0.
var releaseLease = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0`)

// baseVolume returns the image's base volume: the named volume, or the image's file imported
// into the pool under a name of its own on first use. A missing volume or file is the image's
// fault, reported as a refusal; Redis not answering is ErrUnavailable.
func (d *hostDriver) baseVolume(ctx context.Context, conn *golibvirt.Libvirt, pool golibvirt.StoragePool, img *region.Image) (volume, error) {
	if img.Volume != "" {
		vol, found, err := lookupVolume(conn, pool, img.Volume)
		if err != nil {
			return volume{}, err
		}
		if !found {
			return volume{}, fmt.Errorf("image %s: volume %q is missing from pool %s: %w", img.ID, img.Volume, d.cfg.Pool, region.ErrRefused)
		}
		return describe(conn, vol)
	}
	name := namePrefix + "image-" + img.ID
	// One import per process at a time: the others of this process wait here rather than
	// polling Redis.
	d.imports.Lock()
	defer d.imports.Unlock()
	lock, ready := importLockKey(d.opts.Region.ID, d.keyHost, name), imageReadyKey(d.opts.Region.ID, d.keyHost, name)
	for {
		vol, found, err := lookupVolume(conn, pool, name)
		if err != nil {
			return volume{}, err
		}
		if found {
			marked, err := d.opts.Redis.Exists(ctx, ready).Result()
			if err != nil {
				return volume{}, fmt.Errorf("image %s: %v: %w", img.ID, err, region.ErrUnavailable)
			}
			if marked == 1 {
				return describe(conn, vol)
			}
		}
		token := uuid.NewString()
		got, err := d.opts.Redis.SetNX(ctx, lock, token, importLease).Result()
		if err != nil {
			return volume{}, fmt.Errorf("image %s: %v: %w", img.ID, err, region.ErrUnavailable)
		}
		if got {
			v, err := d.importLocked(ctx, conn, pool, img, name, lock, token)
			// The lock's lease ends it anyway if this release cannot be made.
			_ = releaseLease.Run(context.WithoutCancel(ctx), d.opts.Redis, []string{lock}, token).Err()
			return v, err
		}
		t := time.NewTimer(importPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return volume{}, fmt.Errorf("image %s: waiting for another process's import: %v: %w", img.ID, ctx.Err(), region.ErrUnavailable)
		case <-t.C:
		}
	}
}

// importLocked imports the image's file as the volume, holding the import lock (renewed
// while the upload runs), and marks the volume ready.
func (d *hostDriver) importLocked(ctx context.Context, conn *golibvirt.Libvirt, pool golibvirt.StoragePool, img *region.Image, name, lock, token string) (volume, error) {
	ready := imageReadyKey(d.opts.Region.ID, d.keyHost, name)
	markReady := func(vol golibvirt.StorageVol) (volume, error) {
		if err := d.opts.Redis.Set(ctx, ready, "1", 0).Err(); err != nil {
			return volume{}, fmt.Errorf("image %s: %v: %w", img.ID, err, region.ErrUnavailable)
		}
		return describe(conn, vol)
	}
	vol, found, err := lookupVolume(conn, pool, name)
	if err != nil {
		return volume{}, err
	}
	if found {
		// Another process may have finished between our look and our lock.
		if marked, err := d.opts.Redis.Exists(ctx, ready).Result(); err != nil {
			return volume{}, fmt.Errorf("image %s: %v: %w", img.ID, err, region.ErrUnavailable)
		} else if marked == 1 {
			return describe(conn, vol)
		}
		base, err := describe(conn, vol)
		if err != nil {
			return volume{}, err
		}
		inUse, err := backedOnto(conn, pool, base.path)
		if err != nil {
			return volume{}, err
		}
		if inUse {
			return markReady(vol)
		}
		d.log.Warn("deleting an image volume whose import did not finish", "volume", name)
		if err := conn.StorageVolDelete(vol, golibvirt.StorageVolDeleteNormal); err != nil && !isCode(err, golibvirt.ErrNoStorageVol) {
			return volume{}, fmt.Errorf("delete unfinished import %s: %w", name, err)
		}
	}
	f, err := os.Open(img.File)
	if err != nil {
		d.log.Error("an image's file cannot be read", "image", img.ID, "err", err)
		return volume{}, fmt.Errorf("image %s: its file cannot be read: %w", img.ID, region.ErrRefused)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return volume{}, fmt.Errorf("image %s: %w", img.ID, err)
	}
	format, err := diskFormat(f)
	if err != nil {
		return volume{}, fmt.Errorf("image %s: %w", img.ID, err)
	}
	renewing, stop := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() { d.renewLease(renewing, lock, token) })
	vol, err = d.upload(conn, pool, name, format, f, uint64(info.Size()))
	stop()
	wg.Wait()
	if err != nil {
		return volume{}, fmt.Errorf("import image %s: %w", img.ID, err)
	}
	d.log.Info("image imported into the pool", "image", img.ID, "volume", name, "bytes", info.Size())
	return markReady(vol)
}

// renewLease keeps a lock (the import lock while the upload runs, a snapshot lock while the
// snapshot is made) until ctx ends.
func (d *hostDriver) renewLease(ctx context.Context, lock, token string) {
	t := time.NewTicker(importLease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			renewed, err := renewLease.Run(ctx, d.opts.Redis, []string{lock}, token, importLease.Milliseconds()).Int()
			if err == nil && renewed == 0 {
				d.log.Warn("lost a lock while its work was under way", "lock", lock)
				return
			}
		}
	}
}

// lookupVolume finds a volume of the pool by name; found is false when there is none.
func lookupVolume(conn *golibvirt.Libvirt, pool golibvirt.StoragePool, name string) (golibvirt.StorageVol, bool, error) {
	vol, err := conn.StorageVolLookupByName(pool, name)
	if isCode(err, golibvirt.ErrNoStorageVol) {
		return vol, false, nil
	}
	if err != nil {
		return vol, false, fmt.Errorf("look up volume %s: %w", name, err)
	}
	return vol, true, nil
}

// backedOnto reports whether a server's disk in the pool backs onto the file at path.
func backedOnto(conn *golibvirt.Libvirt, pool golibvirt.StoragePool, path string) (bool, error) {
	vols, _, err := conn.StoragePoolListAllVolumes(pool, 1, 0)
	if err != nil {
		return false, fmt.Errorf("list volumes: %w", err)
	}
	for _, v := range vols {
		if !strings.HasPrefix(v.Name, namePrefix) || !strings.HasSuffix(v.Name, ".qcow2") {
			continue
		}
		doc, err := conn.StorageVolGetXMLDesc(v, 0)
		if isCode(err, golibvirt.ErrNoStorageVol) {
			continue // deleted meanwhile
		}
		if err != nil {
			return false, fmt.Errorf("volume %s: %w", v.Name, err)
		}
		var def libvirtxml.StorageVolume
		if err := def.Unmarshal(doc); err != nil {
			return false, fmt.Errorf("volume %s: %w", v.Name, err)
		}
		if def.BackingStore != nil && def.BackingStore.Path == path {
			return true, nil
		}
	}
	return false, nil
}
