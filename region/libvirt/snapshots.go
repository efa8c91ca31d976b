package libvirt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"libvirt.org/go/libvirtxml"

	"github.com/computeql/computeql/region"
)

// A snapshot is an image of a server's disk as it was at one instant, made while the server
// runs (or stays stopped):
//
//  1. an external disk-only snapshot (no libvirt metadata, atomic) puts a new, empty overlay
//     (computeql-<server>-snap.qcow2) on top of the server's disk, which from then on is read
//     only: the guest writes to the overlay;
//  2. the frozen disk is copied, through its backing chain, into a new standalone qcow2 volume
//     of the pool (computeql-snap-<image>.qcow2) by the host (virStorageVolCreateXMLFrom), with
//     no backing file: a base for new servers' overlays, never written;
//  3. the overlay is merged back into the server's disk with an active, shallow block commit
//     and a pivot, so the server's disk is its own overlay again; the shared base image under
//     it is never written (a commit without SHALLOW would write into it). A stopped server is
//     started paused for the commit (a block job needs QEMU) and powered off again.
//
// The image's record (its name, tags, shape, state) is kept in Redis, in the region's hash of
// images (imagesKey), so that every process serving the region, now or after a restart, lists
// the same images; the volume is the image's bytes. While a snapshot is made, its maker holds a
// lease in Redis
// per server (snapshotLockKey): a second snapshot of the server is refused meanwhile, and a
// snapshot whose maker died (its lease ran out) is cleaned by the next connect or collection
// pass: its overlay is merged back, its partial copy deleted and its image marked failed.
const (
	// snapshotLease is the import lock's: both are renewed by renewLease.
	snapshotLease = importLease
	// blockJobPoll is how often a commit's progress is read until it can pivot.
	blockJobPoll   = 200 * time.Millisecond
	snapshotPrefix = namePrefix + "snap-"
)

// snapshotRecord is what the region's hash of images keeps of an image.
type snapshotRecord struct {
	// Image is the image as Images lists it; its Volume, Kernel, Initrd and Cmdline are what
	// a server made from it boots.
	Image region.Image `json:"image"`
	// Server is the server it was made of.
	Server string `json:"server"`
	// Host is the host whose pool holds the image's volume, in a region that names its
	// hosts; "" in one of a single host by uri.
	Host      string    `json:"host,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
}

// owns reports whether the image's volume is in this host's pool.
func (d *hostDriver) owns(rec *snapshotRecord) bool {
	if rec.Host == "" {
		return d.first
	}
	return rec.Host == d.keyHost
}

func imageVolumeName(id string) string { return snapshotPrefix + id + ".qcow2" }
func overlayName(serverID string) string {
	return namePrefix + serverID + "-snap.qcow2"
}

// Snapshot implements region.Client. It returns once the snapshot is taken (the instant the
// image shows); the copy and the merge go on in the background, and the image is READY once
// both are done, FAILED when the copy failed.
func (d *hostDriver) Snapshot(ctx context.Context, id string, req region.ImageRequest) (region.Image, error) {
	conn, s, err := d.verb("snapshot", id)
	if err != nil {
		return region.Image{}, err
	}
	if state, _ := s.regionState(); state != region.ServerRunning && state != region.ServerStopped {
		return region.Image{}, fmt.Errorf("snapshot: the server is %s: %w", state, region.ErrRefused)
	}
	disk := diskSource(&s.xml)
	if disk == "" {
		return region.Image{}, fmt.Errorf("snapshot: the server boots without a disk, so there is nothing to snapshot: %w", region.ErrRefused)
	}
	d.mu.RLock()
	pool, jobs := d.pool, d.jobs
	d.mu.RUnlock()
	source, err := d.image(ctx, s.rec.Spec)
	if err != nil {
		return region.Image{}, fmt.Errorf("snapshot: %w", err)
	}
	imageID := uuid.NewString()
	lock := snapshotLockKey(d.opts.Region.ID, s.id)
	got, err := d.opts.Redis.SetNX(ctx, lock, imageID, snapshotLease).Result()
	if err != nil {
		return region.Image{}, fmt.Errorf("snapshot: %v: %w", err, region.ErrUnavailable)
	}
	if !got || filepath.Base(disk) != namePrefix+s.id+".qcow2" {
		if got {
			_ = releaseLease.Run(context.WithoutCancel(ctx), d.opts.Redis, []string{lock}, imageID).Err()
		}
		return region.Image{}, fmt.Errorf("snapshot: a snapshot of the server is being made: %w", region.ErrRefused)
	}
	rec, err := d.takeSnapshot(ctx, conn, pool, s, source, disk, imageID, req)
	if err != nil {
		_ = releaseLease.Run(context.WithoutCancel(ctx), d.opts.Redis, []string{lock}, imageID).Err()
		return region.Image{}, err
	}
	if jobs == nil {
		return rec.Image, nil // the session ended meanwhile: its successor cleans up
	}
	jobs.Go(func(jctx context.Context) { d.makeImage(jctx, conn, pool, rec, lock) })
	return rec.Image, nil
}

// takeSnapshot writes the image's record (CREATING) and takes the external snapshot; a
// snapshot the host refuses leaves no record behind.
func (d *hostDriver) takeSnapshot(ctx context.Context, conn *golibvirt.Libvirt, pool golibvirt.StoragePool, s *server, source *region.Image, disk, imageID string, req region.ImageRequest) (*snapshotRecord, error) {
	vol, err := conn.StorageVolLookupByName(pool, filepath.Base(disk))
	if err != nil {
		return nil, d.fault("snapshot: the server's disk", err)
	}
	_, capacity, _, err := conn.StorageVolGetInfo(vol)
	if err != nil {
		return nil, d.fault("snapshot: the server's disk", err)
	}
	spec := s.rec.Spec
	rec := &snapshotRecord{Server: s.id, Host: d.keyHost, CreatedAt: d.opts.Now().UTC(), Image: region.Image{
		ID: imageID, Name: req.Name, Architecture: source.Architecture, SizeGiB: int64(capacity >> 30),
		Virtualization: source.Virtualization, State: region.ImageStateCreating, OS: source.OS,
		Regions: []string{d.opts.Region.ID}, OrganizationID: spec.OrganizationID, ProjectID: spec.ProjectID, Tags: req.Tags,
		Volume: imageVolumeName(imageID), Kernel: source.Kernel, Initrd: source.Initrd, Cmdline: source.Cmdline,
	}}
	if err := d.writeSnapshotRecord(ctx, rec); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	doc, err := snapshotXML(&s.xml, imageID, filepath.Join(filepath.Dir(disk), overlayName(s.id)))
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	// No metadata: libvirt keeps no snapshot object that would block undefining the domain;
	// atomic: every disk or none.
	flags := uint32(golibvirt.DomainSnapshotCreateDiskOnly | golibvirt.DomainSnapshotCreateNoMetadata | golibvirt.DomainSnapshotCreateAtomic)
	if _, err := conn.DomainSnapshotCreateXML(s.dom, doc, flags); err != nil {
		if derr := d.opts.Redis.HDel(context.WithoutCancel(ctx), imagesKey(d.opts.Region.ID), imageID).Err(); derr != nil {
			d.log.Warn("delete the record of a snapshot the host refused", "image", imageID, "err", derr)
		}
		return nil, d.fault("snapshot", err)
	}
	d.log.Info("snapshot taken; copying the disk", "server", s.id, "image", imageID)
	return rec, nil
}

// snapshotXML asks for an external snapshot of the server's disk into the overlay at path,
// and none of its other disks (the seed, which is read only).
func snapshotXML(dom *libvirtxml.Domain, imageID, path string) (string, error) {
	snap := libvirtxml.DomainSnapshot{Name: namePrefix + imageID, Disks: &libvirtxml.DomainSnapshotDisks{}}
	for _, disk := range dom.Devices.Disks {
		if disk.Target == nil {
			continue
		}
		sd := libvirtxml.DomainSnapshotDisk{Name: disk.Target.Dev, Snapshot: "no"}
		if disk.Target.Dev == "vda" {
			sd = libvirtxml.DomainSnapshotDisk{Name: "vda", Snapshot: "external",
				Driver: &libvirtxml.DomainDiskDriver{Type: "qcow2"},
				Source: &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: path}}}
		}
		snap.Disks.Disks = append(snap.Disks.Disks, sd)
	}
	return snap.Marshal()
}

// makeImage copies the frozen disk into the image's volume, merges the overlay back and
// records the outcome, holding the server's snapshot lease throughout.
func (d *hostDriver) makeImage(ctx context.Context, conn *golibvirt.Libvirt, pool golibvirt.StoragePool, rec *snapshotRecord, lock string) {
	imageID := rec.Image.ID
	renewing, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { d.renewLease(renewing, lock, imageID) })
	defer func() {
		stop()
		wg.Wait()
		_ = releaseLease.Run(context.WithoutCancel(ctx), d.opts.Redis, []string{lock}, imageID).Err()
	}()
	copyErr := d.copyDisk(ctx, pool, rec)
	if err := d.mergeBack(ctx, conn, pool, rec.Server); err != nil {
		// The image does not depend on it; the next collection pass merges it.
		d.log.Warn("merge a snapshot's overlay back into the server's disk", "server", rec.Server, "image", imageID, "err", err)
	}
	rec.Image.State = region.ImageStateReady
	if copyErr != nil {
		d.log.Warn("a snapshot's copy failed", "server", rec.Server, "image", imageID, "err", copyErr)
		rec.Image.State = region.ImageStateFailed
		if err := deleteVolumes(conn, pool, []string{rec.Image.Volume}); err != nil {
			d.log.Warn("delete a failed snapshot's copy", "image", imageID, "err", err)
		}
	}
	if err := d.writeSnapshotRecord(context.WithoutCancel(ctx), rec); err != nil {
		d.log.Warn("record a snapshot's outcome", "image", imageID, "state", rec.Image.State, "err", err)
		return
	}
	d.log.Info("snapshot made", "server", rec.Server, "image", imageID, "state", rec.Image.State)
}

// diskCopies is how many snapshots' disk copies a host makes at once; the others wait their
// turn, their images CREATING meanwhile. Each is a qemu-img of the host reading one disk and
// writing another, and a worker thread of libvirtd's for as long: more at once would only
// share the disks' bandwidth, and take threads the host's other calls need.
const diskCopies = 4

// copyDisk makes the image's volume: the host converts the server's frozen disk, through its
// backing chain, into a qcow2 volume without a backing file. It waits for a turn among the
// host's copies (diskCopies), and copies on a connection of its own (streams), cut when ctx
// ends (the session's end: the host stopped answering, or the process is stopping).
func (d *hostDriver) copyDisk(ctx context.Context, pool golibvirt.StoragePool, rec *snapshotRecord) error {
	st, err := d.awaitStream(ctx, d.copies)
	if err != nil {
		return fmt.Errorf("wait for a turn to copy the disk: %w", err)
	}
	// Cut, not abandoned: the call fails at once on a cut connection, and is waited for.
	stop := context.AfterFunc(ctx, st.cut.Cut)
	err = copyVolume(st.conn, pool, rec)
	stop()
	st.returned(err)
	return err
}

// copyVolume has the host copy the server's disk into the image's volume.
func copyVolume(conn *golibvirt.Libvirt, pool golibvirt.StoragePool, rec *snapshotRecord) error {
	src, err := conn.StorageVolLookupByName(pool, namePrefix+rec.Server+".qcow2")
	if err != nil {
		return fmt.Errorf("the server's disk: %w", err)
	}
	_, capacity, _, err := conn.StorageVolGetInfo(src)
	if err != nil {
		return fmt.Errorf("the server's disk: %w", err)
	}
	def := libvirtxml.StorageVolume{
		Name:     rec.Image.Volume,
		Capacity: &libvirtxml.StorageVolumeSize{Value: capacity, Unit: "bytes"},
		Target:   &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: "qcow2"}},
	}
	doc, err := def.Marshal()
	if err != nil {
		return err
	}
	if _, err := conn.StorageVolCreateXMLFrom(pool, doc, src, 0); err != nil {
		return fmt.Errorf("copy the disk into %s: %w", rec.Image.Volume, err)
	}
	return nil
}

// mergeBack puts the server's disk back on its own overlay: the snapshot overlay on top of it
// is committed into it (active, shallow: never further down, into the shared base) and the
// domain pivots to it; then the overlay is deleted. A stopped server is started paused for the
// commit and powered off again. A server that is gone, or not on the overlay, is left alone.
func (d *hostDriver) mergeBack(ctx context.Context, conn *golibvirt.Libvirt, pool golibvirt.StoragePool, id string) error {
	s, err := d.lookup(conn, id)
	if errors.Is(err, region.ErrServerNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	own := namePrefix + s.id + ".qcow2"
	if cur := diskSource(&s.xml); filepath.Base(cur) == overlayName(s.id) {
		if s.state == golibvirt.DomainShutoff {
			if _, err := conn.DomainCreateWithFlags(s.dom, uint32(golibvirt.DomainStartPaused)); err != nil {
				return fmt.Errorf("start the server paused for the commit: %w", err)
			}
			defer func() {
				if err := conn.DomainDestroy(s.dom); err != nil {
					d.log.Warn("power off a server started paused for a commit", "server", s.id, "err", err)
				}
			}()
		}
		if err := d.commit(ctx, conn, s.dom); err != nil {
			return err
		}
	}
	if err := d.pinDisk(conn, s.dom, own); err != nil {
		return err
	}
	// The file was made by the snapshot, not through the pool: the pool learns of it first.
	if err := conn.StoragePoolRefresh(pool, 0); err != nil {
		return fmt.Errorf("refresh the pool: %w", err)
	}
	return deleteVolumes(conn, pool, []string{overlayName(s.id)})
}

// commit merges the active layer of the domain's disk into the layer below and pivots to it.
func (d *hostDriver) commit(ctx context.Context, conn *golibvirt.Libvirt, dom golibvirt.Domain) error {
	found, _, _, _, _, err := conn.DomainGetBlockJobInfo(dom, "vda", 0)
	if err != nil {
		return fmt.Errorf("block job of vda: %w", err)
	}
	if found == 0 { // else a commit begun by a maker that died goes on
		err := conn.DomainBlockCommit(dom, "vda", golibvirt.OptString{}, golibvirt.OptString{}, 0,
			golibvirt.DomainBlockCommitActive|golibvirt.DomainBlockCommitShallow)
		if err != nil {
			return fmt.Errorf("commit the overlay: %w", err)
		}
	}
	tick := time.NewTicker(blockJobPoll)
	defer tick.Stop()
	for {
		found, _, _, cur, end, err := conn.DomainGetBlockJobInfo(dom, "vda", 0)
		if err != nil {
			return fmt.Errorf("block job of vda: %w", err)
		}
		if found == 0 {
			return errors.New("the commit ended without a pivot")
		}
		if cur == end {
			err := conn.DomainBlockJobAbort(dom, "vda", golibvirt.DomainBlockJobAbortPivot)
			if err == nil {
				return nil
			}
			if !isCode(err, golibvirt.ErrBlockCopyActive) {
				return fmt.Errorf("pivot to the server's disk: %w", err)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// pinDisk makes sure the domain's persistent definition boots its own disk, as the live one
// does after a pivot.
func (d *hostDriver) pinDisk(conn *golibvirt.Libvirt, dom golibvirt.Domain, own string) error {
	d.records.Lock()
	defer d.records.Unlock()
	doc, err := conn.DomainGetXMLDesc(dom, golibvirt.DomainXMLInactive)
	if err != nil {
		return fmt.Errorf("read the domain's definition: %w", err)
	}
	var def libvirtxml.Domain
	if err := def.Unmarshal(doc); err != nil {
		return err
	}
	cur := diskSource(&def)
	if cur == "" || filepath.Base(cur) == own {
		return nil
	}
	for i := range def.Devices.Disks {
		disk := &def.Devices.Disks[i]
		if disk.Target != nil && disk.Target.Dev == "vda" {
			*disk = fileDisk(filepath.Join(filepath.Dir(cur), own), "qcow2", "vda", false)
		}
	}
	out, err := def.Marshal()
	if err != nil {
		return err
	}
	if _, err := conn.DomainDefineXML(out); err != nil {
		return fmt.Errorf("define the domain on its own disk: %w", err)
	}
	return nil
}

// diskSource is the file the domain's first disk (vda) is, "" for a domain without one.
func diskSource(dom *libvirtxml.Domain) string {
	if dom.Devices == nil {
		return ""
	}
	for _, disk := range dom.Devices.Disks {
		if disk.Target != nil && disk.Target.Dev == "vda" && disk.Source != nil && disk.Source.File != nil {
			return disk.Source.File.File
		}
	}
	return ""
}

// writeSnapshotRecord writes the image's record.
func (d *hostDriver) writeSnapshotRecord(ctx context.Context, rec *snapshotRecord) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := d.opts.Redis.HSet(ctx, imagesKey(d.opts.Region.ID), rec.Image.ID, data).Err(); err != nil {
		return fmt.Errorf("record image %s: %v: %w", rec.Image.ID, err, region.ErrUnavailable)
	}
	return nil
}

// readSnapshotRecord reads an image's record; found is false when there is none.
func (d *hostDriver) readSnapshotRecord(ctx context.Context, id string) (*snapshotRecord, bool, error) {
	data, err := d.opts.Redis.HGet(ctx, imagesKey(d.opts.Region.ID), id).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("the record of image %s: %v: %w", id, err, region.ErrUnavailable)
	}
	var rec snapshotRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, false, fmt.Errorf("the record of image %s: %w", id, err)
	}
	return &rec, true, nil
}

// snapshotRecords reads every image record of the region.
func (d *hostDriver) snapshotRecords(ctx context.Context) ([]*snapshotRecord, error) {
	all, err := d.opts.Redis.HGetAll(ctx, imagesKey(d.opts.Region.ID)).Result()
	if err != nil {
		return nil, fmt.Errorf("image records: %v: %w", err, region.ErrUnavailable)
	}
	out := make([]*snapshotRecord, 0, len(all))
	for id, data := range all {
		var rec snapshotRecord
		if err := json.Unmarshal([]byte(data), &rec); err != nil {
			d.log.Warn("an image record cannot be read", "image", id, "err", err)
			continue
		}
		out = append(out, &rec)
	}
	return out, nil
}

// Images implements region.Client: the snapshots of the project, from their records.
func (d *hostDriver) Images(ctx context.Context, org, project string) ([]region.Image, error) {
	if _, err := d.host("images"); err != nil {
		return nil, err
	}
	recs, err := d.snapshotRecords(ctx)
	if err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	out := []region.Image{}
	for _, rec := range recs {
		if rec.Image.OrganizationID == org && rec.Image.ProjectID == project {
			out = append(out, rec.Image)
		}
	}
	return out, nil
}

// DeleteImage implements region.Client: the image's volume, then its record, so that a delete
// cut short is finished by the next one. An image being made, or that a server's disk rests
// on, is refused.
func (d *hostDriver) DeleteImage(ctx context.Context, org, project, id string) error {
	conn, err := d.host("delete image")
	if err != nil {
		return err
	}
	d.mu.RLock()
	pool := d.pool
	d.mu.RUnlock()
	if _, err := uuid.Parse(id); err != nil {
		return fmt.Errorf("image %q: %w", id, region.ErrImageNotFound)
	}
	rec, found, err := d.readSnapshotRecord(ctx, id)
	if err != nil {
		return fmt.Errorf("delete image: %w", err)
	}
	if !found || rec.Image.OrganizationID != org || rec.Image.ProjectID != project {
		return fmt.Errorf("image %q: %w", id, region.ErrImageNotFound)
	}
	if rec.Image.State == region.ImageStateCreating {
		return fmt.Errorf("delete image: image %s is being made: %w", id, region.ErrRefused)
	}
	vol, found, err := lookupVolume(conn, pool, rec.Image.Volume)
	if err != nil {
		return d.fault("delete image", err)
	}
	if found {
		v, err := describe(conn, vol)
		if err != nil {
			return d.fault("delete image", err)
		}
		used, err := backedOnto(conn, pool, v.path)
		if err != nil {
			return d.fault("delete image", err)
		}
		if used {
			return fmt.Errorf("delete image: servers' disks rest on image %s: %w", id, region.ErrRefused)
		}
	}
	if err := deleteVolumes(conn, pool, []string{rec.Image.Volume}); err != nil {
		return d.fault("delete image", err)
	}
	if err := d.opts.Redis.HDel(ctx, imagesKey(d.opts.Region.ID), id).Err(); err != nil {
		return fmt.Errorf("delete image: %v: %w", err, region.ErrUnavailable)
	}
	return nil
}

// snapshotImage is the image a spec names when it is not the catalogue's: a ready snapshot of
// the spec's project.
func (d *hostDriver) snapshotImage(ctx context.Context, spec region.ServerSpec) (*region.Image, error) {
	if _, err := uuid.Parse(spec.ImageID); err != nil {
		return nil, fmt.Errorf("image %q does not exist: %w", spec.ImageID, region.ErrRefused)
	}
	rec, found, err := d.readSnapshotRecord(ctx, spec.ImageID)
	if err != nil {
		return nil, err
	}
	if !found || rec.Image.OrganizationID != spec.OrganizationID || rec.Image.ProjectID != spec.ProjectID {
		return nil, fmt.Errorf("image %q does not exist: %w", spec.ImageID, region.ErrRefused)
	}
	if rec.Image.State != region.ImageStateReady {
		return nil, fmt.Errorf("image %s is %s, not ready: %w", spec.ImageID, rec.Image.State, region.ErrRefused)
	}
	return &rec.Image, nil
}

// image is the image a spec names: the catalogue's, or a snapshot of its project.
func (d *hostDriver) image(ctx context.Context, spec region.ServerSpec) (*region.Image, error) {
	if img, ok := d.opts.Catalog.Image(spec.ImageID); ok {
		return img, nil
	}
	return d.snapshotImage(ctx, spec)
}

// recoverSnapshot cleans after one image whose maker is gone: the server's overlay merged back
// (when merge), and the image, if still CREATING, marked FAILED without its partial copy. It
// returns 1 when it marked the image failed.
func (d *hostDriver) recoverSnapshot(ctx context.Context, conn *golibvirt.Libvirt, pool golibvirt.StoragePool, rec *snapshotRecord, merge bool) (int, error) {
	if merge {
		if err := d.mergeBack(ctx, conn, pool, rec.Server); err != nil {
			d.log.Warn("merge the overlay of a snapshot cut short", "server", rec.Server, "err", err)
		}
	}
	if rec.Image.State != region.ImageStateCreating {
		return 0, nil
	}
	if err := deleteVolumes(conn, pool, []string{rec.Image.Volume}); err != nil {
		return 0, err
	}
	rec.Image.State = region.ImageStateFailed
	if err := d.writeSnapshotRecord(ctx, rec); err != nil {
		return 0, err
	}
	return 1, nil
}

// recoverSnapshots finishes what makers of snapshots that died left behind: for each image
// whose server's snapshot lease is free, the server's overlay is merged back, and an image
// still CREATING is marked FAILED and its partial copy deleted. It returns how many images it
// marked failed.
func (d *hostDriver) recoverSnapshots(ctx context.Context, conn *golibvirt.Libvirt, pool golibvirt.StoragePool) (int, error) {
	recs, err := d.snapshotRecords(ctx)
	if err != nil {
		return 0, err
	}
	failed := 0
	merged := map[string]bool{}
	for _, rec := range recs {
		if !d.owns(rec) {
			continue // another host's pool
		}
		// Held while it cleans, so that a snapshot of the server begun meanwhile is refused
		// rather than merged away under its copy.
		lock, token := snapshotLockKey(d.opts.Region.ID, rec.Server), "recover-"+uuid.NewString()
		got, err := d.opts.Redis.SetNX(ctx, lock, token, snapshotLease).Result()
		if err != nil {
			return failed, fmt.Errorf("snapshot lease: %w", err)
		}
		if !got {
			continue // a snapshot of the server is being made
		}
		n, err := d.recoverSnapshot(ctx, conn, pool, rec, !merged[rec.Server])
		merged[rec.Server] = true
		_ = releaseLease.Run(context.WithoutCancel(ctx), d.opts.Redis, []string{lock}, token).Err()
		failed += n
		if err != nil {
			return failed, err
		}
	}
	return failed, nil
}
