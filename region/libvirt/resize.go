package libvirt

import (
	"context"
	"fmt"
	"slices"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/computeql/computeql/region"
)

// ResizeServer implements region.Client: the shut-off domain is defined again with the
// flavor's memory and vCPUs, and its disk overlay grown to the flavor's disk. The guest's
// disk content, MAC and reserved address stay; the guest grows its file system at its next
// boot (cloud-init's growpart does on Debian's cloud images).
func (d *hostDriver) ResizeServer(ctx context.Context, id, flavorID string) (region.Server, error) {
	conn, s, err := d.verb("resize server", id)
	if err != nil {
		return region.Server{}, err
	}
	if !stopped(s) {
		return region.Server{}, fmt.Errorf("resize server: the server is not stopped: %w", region.ErrRefused)
	}
	cat, r := d.opts.Catalog, &d.opts.Region
	to, ok := cat.Flavor(flavorID)
	if !ok {
		return region.Server{}, fmt.Errorf("flavor %q does not exist: %w", flavorID, region.ErrRefused)
	}
	if why := r.RunsFlavor(to); why != "" {
		return region.Server{}, fmt.Errorf("region %s cannot run flavor %s: %s: %w", r.ID, to.ID, why, region.ErrRefused)
	}
	from, ok := cat.Flavor(s.rec.Spec.FlavorID)
	if !ok {
		return region.Server{}, fmt.Errorf("the server's flavor %q is no longer in the catalogue: %w", s.rec.Spec.FlavorID, region.ErrRefused)
	}
	if to.DiskGB < from.DiskGB {
		return region.Server{}, fmt.Errorf("the disk of flavor %s (%d GB) is smaller than the server's (%d GB), and a disk never shrinks: %w",
			to.ID, to.DiskGB, from.DiskGB, region.ErrRefused)
	}
	d.mu.RLock()
	pool := d.pool
	d.mu.RUnlock()
	// A stopped server keeps its room on the host, so only what the new flavor adds must fit.
	growth := region.Flavor{ID: to.ID, CPUs: max(0, to.CPUs-from.CPUs), MemoryGiB: max(0, to.MemoryGiB-from.MemoryGiB), DiskGB: to.DiskGB - from.DiskGB}
	placed, err := d.admit(&growth)
	if err != nil {
		return region.Server{}, err
	}
	defer placed()
	// The disk first: a resize interrupted after it leaves a larger disk and the old flavor,
	// which the next try completes, never a flavor whose disk is smaller than it says.
	if err := d.growDisk(conn, pool, s, uint64(to.DiskGB)*1_000_000_000); err != nil {
		return region.Server{}, d.fault("resize server", err)
	}
	if err := d.redefine(conn, s, to); err != nil {
		return region.Server{}, d.fault("resize server", err)
	}
	return d.observe(conn, s), nil
}

// growDisk grows the server's disk overlay to sizeBytes; a server booting a kernel without a
// disk has none to grow.
func (d *hostDriver) growDisk(conn *golibvirt.Libvirt, pool golibvirt.StoragePool, s *server, sizeBytes uint64) error {
	name := namePrefix + s.id + ".qcow2"
	if !slices.Contains(s.rec.Volumes, name) {
		return nil
	}
	vol, err := conn.StorageVolLookupByName(pool, name)
	if err != nil {
		return fmt.Errorf("look up disk %s: %w", name, err)
	}
	_, capacity, _, err := conn.StorageVolGetInfo(vol)
	if err != nil {
		return fmt.Errorf("disk %s: %w", name, err)
	}
	if capacity >= sizeBytes {
		return nil
	}
	if err := conn.StorageVolResize(vol, sizeBytes, 0); err != nil {
		return fmt.Errorf("grow disk %s: %w", name, err)
	}
	return nil
}

// redefine gives the shut-off domain the flavor's memory and vCPUs, and records the flavor,
// in one definition: a domain never has the one without the other.
func (d *hostDriver) redefine(conn *golibvirt.Libvirt, s *server, f *region.Flavor) error {
	d.records.Lock()
	defer d.records.Unlock()
	fresh, err := readServer(conn, s.dom)
	if err != nil {
		return err
	}
	fresh.rec.Spec.FlavorID = f.ID
	el, err := fresh.rec.element()
	if err != nil {
		return err
	}
	def := fresh.xml
	memMiB := uint(f.MemoryGiB) * 1024
	def.Memory = &libvirtxml.DomainMemory{Value: memMiB, Unit: "MiB"}
	def.CurrentMemory = &libvirtxml.DomainCurrentMemory{Value: memMiB, Unit: "MiB"}
	def.VCPU = &libvirtxml.DomainVCPU{Value: uint(f.CPUs)}
	def.Metadata = &libvirtxml.DomainMetadata{XML: namespaced(el)}
	doc, err := def.Marshal()
	if err != nil {
		return err
	}
	if _, err := conn.DomainDefineXML(doc); err != nil {
		return fmt.Errorf("define domain: %w", err)
	}
	fresh, err = readServer(conn, s.dom)
	if err != nil {
		return err
	}
	*s = *fresh
	return nil
}
