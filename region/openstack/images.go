package openstack

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"

	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"

	"github.com/computeql/computeql/region"
)

// Properties of a snapshot's Glance image, beside those Nova gives it (it copies the server's
// image's properties, kernel and ramdisk among them, so that the snapshot boots alike). The
// scope and large-field keys are the server metadata's own; every one is written at each
// snapshot, so that what a snapshot copied from the snapshot its server was made from is
// overwritten.
const (
	// propSource is the catalogue image the snapshot descends from, through any number of
	// snapshots: it gives the snapshot its architecture, virtualization and OS.
	propSource = "compute:source-image"
	// propSize is the size in GiB of the disk the snapshot was taken of.
	propSize = "compute:size-gib"
)

// imageListOpts lists a project's snapshots of the region: Glance filters a list by any of an
// image's properties given as a query parameter.
type imageListOpts struct {
	regionID, org, project string
}

func (o imageListOpts) ToImageListQuery() (string, error) {
	q := url.Values{}
	q.Set(metaRegion, o.regionID)
	q.Set(metaOrg, o.org)
	q.Set(metaProject, o.project)
	q.Set("limit", strconv.Itoa(imagePage))
	return "?" + q.Encode(), nil
}

// imagePage is how many images one request of the list asks Glance for.
const imagePage = 100

// ownedBy reports whether a Glance image is a snapshot of the region's project.
func (d *Driver) ownedBy(im *images.Image, org, project string) bool {
	return property(im, metaRegion) == d.opts.Region.ID && property(im, metaOrg) == org && property(im, metaProject) == project
}

// property is a string property of a Glance image, "" when it has none.
func property(im *images.Image, key string) string {
	s, _ := im.Properties[key].(string)
	return s
}

// imageState is the region's state of a Glance image's status.
func imageState(s images.ImageStatus) region.ImageState {
	switch s {
	case images.ImageStatusActive:
		return region.ImageStateReady
	case images.ImageStatusQueued, images.ImageStatusSaving, "uploading", "importing":
		return region.ImageStateCreating
	}
	// killed (its upload failed), deactivated (an operator made it unbootable), deleted.
	return region.ImageStateFailed
}

// toImage is the region's view of a project's snapshot.
func (d *Driver) toImage(im *images.Image, tags map[string]string) region.Image {
	out := region.Image{
		ID: im.ID, Name: im.Name, State: imageState(im.Status), Regions: []string{d.opts.Region.ID},
		OrganizationID: property(im, metaOrg), ProjectID: property(im, metaProject), Tags: tags,
	}
	if src, ok := d.opts.Catalog.Image(property(im, propSource)); ok {
		out.Architecture, out.Virtualization, out.OS = src.Architecture, src.Virtualization, src.OS
	}
	out.SizeGiB, _ = strconv.ParseInt(property(im, propSize), 10, 64)
	return out
}

// glanceImage reads a Glance image; a missing one is region.ErrImageNotFound.
func (d *Driver) glanceImage(ctx context.Context, id string) (*images.Image, error) {
	var im *images.Image
	err := d.call(ctx, "read image "+id, func(ctx context.Context, c *clients) error {
		var err error
		im, err = images.Get(ctx, c.image, id).Extract()
		return err
	})
	if err != nil {
		return nil, notFoundAs(err, region.ErrImageNotFound)
	}
	return im, nil
}

// snapshotOf returns the project's snapshot of the region; another's, or one deleted, is
// region.ErrImageNotFound.
func (d *Driver) snapshotOf(ctx context.Context, org, project, id string) (*images.Image, error) {
	im, err := d.glanceImage(ctx, id)
	if err != nil {
		return nil, err
	}
	if !d.ownedBy(im, org, project) || im.Status == images.ImageStatusDeleted || im.Status == images.ImageStatusPendingDelete {
		return nil, fmt.Errorf("image %s of project %s/%s: %w", id, org, project, region.ErrImageNotFound)
	}
	return im, nil
}

// sourceImage is the catalogue image a server's image descends from: the image itself when
// the catalogue has it, else (a snapshot of the server's project) the one the snapshot names.
func (d *Driver) sourceImage(ctx context.Context, org, project, id string) (*region.Image, error) {
	if im, ok := d.opts.Catalog.Image(id); ok {
		return im, nil
	}
	snap, err := d.snapshotOf(ctx, org, project, id)
	if err != nil {
		return nil, err
	}
	src, ok := d.opts.Catalog.Image(property(snap, propSource))
	if !ok {
		return nil, fmt.Errorf("image %s descends from %q, which the catalogue does not have: %w", id, property(snap, propSource), region.ErrRefused)
	}
	return src, nil
}

// Snapshot asks Nova to image the server (createImage): Nova copies its disk into a new Glance
// image, which is CREATING until the copy is uploaded and READY (active) after. The image's
// tags are kept in Redis, as a server's user data is, since a tag is not a Glance property
// Nova could not copy into a later snapshot of a server made from this one.
func (d *Driver) Snapshot(ctx context.Context, id string, req region.ImageRequest) (region.Image, error) {
	s, err := d.nova(ctx, id)
	if err != nil {
		return region.Image{}, err
	}
	if state := toServer(s, nil).State; state != region.ServerRunning && state != region.ServerStopped {
		return region.Image{}, fmt.Errorf("snapshot: the server is %s: %w", state, region.ErrRefused)
	}
	org, project := s.Metadata[metaOrg], s.Metadata[metaProject]
	src, err := d.sourceImage(ctx, org, project, s.Metadata[metaImage])
	if err != nil {
		return region.Image{}, fmt.Errorf("snapshot: %w", err)
	}
	f, ok := d.opts.Catalog.Flavor(s.Metadata[metaFlavor])
	if !ok {
		return region.Image{}, fmt.Errorf("snapshot: the server's flavor %q is not in the catalogue: %w", s.Metadata[metaFlavor], region.ErrRefused)
	}
	ref, err := d.keepLargeFields(ctx, largeFields{Tags: req.Tags})
	if err != nil {
		return region.Image{}, err
	}
	size := region.DiskGiB(f.DiskGB)
	md := map[string]string{
		metaRegion: d.opts.Region.ID, metaOrg: org, metaProject: project,
		propSource: src.ID, propSize: strconv.FormatInt(size, 10), metaLarge: ref,
	}
	var imageID string
	err = d.call(ctx, "snapshot server "+id, func(ctx context.Context, c *clients) error {
		imageID, err = servers.CreateImage(ctx, c.compute, id, servers.CreateImageOpts{Name: req.Name, Metadata: md}).ExtractImageID()
		return err
	})
	if err != nil {
		d.dropLargeFields(context.WithoutCancel(ctx), ref)
		return region.Image{}, notFoundAs(err, region.ErrServerNotFound)
	}
	return region.Image{
		ID: imageID, Name: req.Name, Architecture: src.Architecture, Virtualization: src.Virtualization, OS: src.OS,
		SizeGiB: size, State: region.ImageStateCreating, Regions: []string{d.opts.Region.ID},
		OrganizationID: org, ProjectID: project, Tags: req.Tags,
	}, nil
}

// Images lists the project's snapshots in Glance.
func (d *Driver) Images(ctx context.Context, org, project string) ([]region.Image, error) {
	var list []images.Image
	err := d.call(ctx, "list the images of "+org+"/"+project, func(ctx context.Context, c *clients) error {
		pages, err := images.List(c.image, imageListOpts{regionID: d.opts.Region.ID, org: org, project: project}).AllPages(ctx)
		if err != nil {
			return err
		}
		list, err = images.ExtractImages(pages)
		return err
	})
	if err != nil {
		return nil, err
	}
	var mine []*images.Image
	var refs []string
	for i := range list {
		if im := &list[i]; d.ownedBy(im, org, project) { // a cloud's Glance may ignore the filter
			mine = append(mine, im)
			refs = append(refs, property(im, metaLarge))
		}
	}
	large, err := d.largeFieldsOf(ctx, refs)
	if err != nil {
		return nil, err
	}
	out := make([]region.Image, len(mine))
	for i, im := range mine {
		out[i] = d.toImage(im, large[i].Tags)
	}
	return out, nil
}

// DeleteImage deletes the project's snapshot from Glance, then its tags.
func (d *Driver) DeleteImage(ctx context.Context, org, project, id string) error {
	im, err := d.snapshotOf(ctx, org, project, id)
	if err != nil {
		return err
	}
	err = d.call(ctx, "delete image "+id, func(ctx context.Context, c *clients) error {
		return images.Delete(ctx, c.image, id).ExtractErr()
	})
	if err != nil && !errors.Is(err, errNotFound) {
		return err
	}
	d.dropLargeFields(ctx, property(im, metaLarge))
	if errors.Is(err, errNotFound) {
		return fmt.Errorf("image %s of project %s/%s: %w", id, org, project, region.ErrImageNotFound)
	}
	return nil
}
