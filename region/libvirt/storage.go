package libvirt

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"
)

// ensurePool returns the region's storage pool, defining, building and starting it as a
// directory pool when it is missing or inactive.
func (d *hostDriver) ensurePool(conn *golibvirt.Libvirt) (golibvirt.StoragePool, error) {
	settings := d.cfg
	pool, err := conn.StoragePoolLookupByName(settings.Pool)
	if isCode(err, golibvirt.ErrNoStoragePool) {
		def := libvirtxml.StoragePool{Type: "dir", Name: settings.Pool, Target: &libvirtxml.StoragePoolTarget{Path: settings.PoolPath}}
		doc, merr := def.Marshal()
		if merr != nil {
			return pool, merr
		}
		if pool, err = conn.StoragePoolDefineXML(doc, 0); err != nil {
			return pool, fmt.Errorf("define storage pool %s: %w", settings.Pool, err)
		}
		if err = conn.StoragePoolBuild(pool, golibvirt.StoragePoolBuildNew); err != nil {
			return pool, fmt.Errorf("build storage pool %s: %w", settings.Pool, err)
		}
		_ = conn.StoragePoolSetAutostart(pool, 1)
	}
	if err != nil {
		return pool, fmt.Errorf("look up storage pool %s: %w", settings.Pool, err)
	}
	state, _, _, _, err := conn.StoragePoolGetInfo(pool)
	if err != nil {
		return pool, fmt.Errorf("storage pool %s: %w", settings.Pool, err)
	}
	if golibvirt.StoragePoolState(state) != golibvirt.StoragePoolRunning {
		if err := conn.StoragePoolCreate(pool, 0); err != nil {
			return pool, fmt.Errorf("start storage pool %s: %w", settings.Pool, err)
		}
	}
	return pool, nil
}

// volume is a pool volume and its path on the host.
type volume struct {
	vol    golibvirt.StorageVol
	path   string
	format string
}

// diskFormat tells a qcow2 file by its magic; anything else is taken as raw.
func diskFormat(f io.ReaderAt) (string, error) {
	magic := make([]byte, 4)
	if _, err := f.ReadAt(magic, 0); err != nil && err != io.EOF {
		return "", err
	}
	if bytes.Equal(magic, []byte("QFI\xfb")) {
		return "qcow2", nil
	}
	return "raw", nil
}

// upload makes a volume holding exactly the reader's bytes. A volume left half-written by a
// failed upload is deleted, so that it is never taken for a whole one.
func (d *hostDriver) upload(conn *golibvirt.Libvirt, pool golibvirt.StoragePool, name, format string, r io.Reader, size uint64) (golibvirt.StorageVol, error) {
	def := libvirtxml.StorageVolume{
		Name: name, Capacity: &libvirtxml.StorageVolumeSize{Value: size, Unit: "bytes"},
		Target: &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: "raw"}},
	}
	doc, err := def.Marshal()
	if err != nil {
		return golibvirt.StorageVol{}, err
	}
	vol, err := conn.StorageVolCreateXML(pool, doc, 0)
	if err != nil {
		return vol, fmt.Errorf("create volume %s: %w", name, err)
	}
	if size == 0 {
		return vol, nil // nothing to write: the volume is empty
	}
	if err := conn.StorageVolUpload(vol, r, 0, size, 0); err != nil {
		_ = conn.StorageVolDelete(vol, golibvirt.StorageVolDeleteNormal)
		return vol, fmt.Errorf("upload volume %s: %w", name, err)
	}
	// A directory pool detects the format of what was written when it refreshes.
	_ = conn.StoragePoolRefresh(pool, 0)
	return vol, nil
}

func describe(conn *golibvirt.Libvirt, vol golibvirt.StorageVol) (volume, error) {
	doc, err := conn.StorageVolGetXMLDesc(vol, 0)
	if err != nil {
		return volume{}, fmt.Errorf("volume %s: %w", vol.Name, err)
	}
	var def libvirtxml.StorageVolume
	if err := def.Unmarshal(doc); err != nil {
		return volume{}, fmt.Errorf("volume %s: %w", vol.Name, err)
	}
	v := volume{vol: vol, format: "raw"}
	if def.Target != nil {
		v.path = def.Target.Path
		if def.Target.Format != nil && def.Target.Format.Type != "" {
			v.format = def.Target.Format.Type
		}
	}
	return v, nil
}

// overlay makes the server's disk: a qcow2 overlay of the base volume, as large as the
// flavor's disk, so the base is shared and never written.
func (d *hostDriver) overlay(conn *golibvirt.Libvirt, pool golibvirt.StoragePool, name string, base volume, sizeBytes uint64) (volume, error) {
	def := libvirtxml.StorageVolume{
		Name:     name,
		Capacity: &libvirtxml.StorageVolumeSize{Value: sizeBytes, Unit: "bytes"},
		Target:   &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: "qcow2"}},
		BackingStore: &libvirtxml.StorageVolumeBackingStore{
			Path: base.path, Format: &libvirtxml.StorageVolumeTargetFormat{Type: base.format},
		},
	}
	doc, err := def.Marshal()
	if err != nil {
		return volume{}, err
	}
	vol, err := conn.StorageVolCreateXML(pool, doc, 0)
	if err != nil {
		return volume{}, fmt.Errorf("create disk %s: %w", name, err)
	}
	return describe(conn, vol)
}

// deleteVolumes deletes the named volumes of the pool; ones already gone are no error.
func deleteVolumes(conn *golibvirt.Libvirt, pool golibvirt.StoragePool, names []string) error {
	for _, name := range names {
		vol, err := conn.StorageVolLookupByName(pool, name)
		if isCode(err, golibvirt.ErrNoStorageVol) {
			continue
		}
		if err != nil {
			return fmt.Errorf("look up volume %s: %w", name, err)
		}
		if err := conn.StorageVolDelete(vol, golibvirt.StorageVolDeleteNormal); err != nil && !isCode(err, golibvirt.ErrNoStorageVol) {
			return fmt.Errorf("delete volume %s: %w", name, err)
		}
	}
	return nil
}

// isCode reports whether err is libvirt's error with the code.
func isCode(err error, code golibvirt.ErrorNumber) bool {
	var e golibvirt.Error
	return errors.As(err, &e) && e.Code == uint32(code)
}

// orphanAge is how old a server's volume without a domain must be before it is collected: a
// create in progress makes its volumes a moment before it defines the domain.
const orphanAge = 10 * time.Minute

// collectVolumes deletes the volumes of servers whose domain does not exist: what a process
// killed in the middle of a create left behind. It returns how many it deleted.
func (d *hostDriver) collectVolumes(conn *golibvirt.Libvirt, pool golibvirt.StoragePool) (int, error) {
	// Snapshots' overlays are made outside the pool: it learns of them first.
	if err := conn.StoragePoolRefresh(pool, 0); err != nil {
		return 0, fmt.Errorf("refresh the pool: %w", err)
	}
	vols, _, err := conn.StoragePoolListAllVolumes(pool, 1, 0)
	if err != nil {
		return 0, fmt.Errorf("list volumes: %w", err)
	}
	deleted := 0
	for _, vol := range vols {
		id, ok := serverOfVolume(vol.Name)
		if !ok {
			continue
		}
		u, _ := parseUUID(id)
		if _, err := conn.DomainLookupByUUID(u); !golibvirt.IsNotFound(err) {
			continue // the server's, or the host could not say
		}
		doc, err := conn.StorageVolGetXMLDesc(vol, 0)
		if err != nil {
			continue
		}
		var def libvirtxml.StorageVolume
		if def.Unmarshal(doc) != nil || def.Target == nil || def.Target.Timestamps == nil {
			continue
		}
		secs, _, _ := strings.Cut(def.Target.Timestamps.Ctime, ".")
		ctime, err := strconv.ParseInt(secs, 10, 64)
		if err != nil || d.opts.Now().Sub(time.Unix(ctime, 0)) < orphanAge {
			continue
		}
		if err := conn.StorageVolDelete(vol, golibvirt.StorageVolDeleteNormal); err != nil {
			return deleted, fmt.Errorf("delete volume %s: %w", vol.Name, err)
		}
		deleted++
	}
	return deleted, nil
}

// serverOfVolume is the id of the server a volume belongs to, from its name
// (computeql-<uuid>.qcow2, a snapshot's overlay computeql-<uuid>-snap.qcow2,
// computeql-<uuid>-seed.iso, computeql-<uuid>-console.log, or a
// rotated computeql-<uuid>-console.log.N where the host's virtlogd rotates console logs);
// base images and snapshots' images belong to none.
func serverOfVolume(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, namePrefix)
	if !ok {
		return "", false
	}
	if base, n, ok := strings.Cut(rest, "-console.log."); ok && n != "" && strings.Trim(n, "0123456789") == "" {
		rest = base + "-console.log"
	}
	for _, suffix := range []string{".qcow2", "-snap.qcow2", "-seed.iso", "-console.log"} {
		if id, ok := strings.CutSuffix(rest, suffix); ok {
			if _, valid := parseUUID(id); valid {
				return id, true
			}
		}
	}
	return "", false
}
