package instance

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/region"
)

// Images are the catalogue's, public and read from the catalogue, or snapshots, which the
// region made of a project's instance with snapshotInstance and which only that project sees
// and boots. A snapshot's id is a UUID, which no catalogue image need be: only a UUID that the
// catalogue lacks costs a call to the region.

// findImage returns the catalogue's image with the id, or else the project's snapshot, or nil
// when neither has it: a snapshot of another project is not found.
func (s *Service) findImage(ctx context.Context, org, project, id string) (*region.Image, error) {
	if img, ok := s.cat.Image(id); ok {
		return img, nil
	}
	if _, err := uuid.Parse(id); err != nil {
		return nil, nil
	}
	return s.projectImage(ctx, org, project, func(img *region.Image) bool { return img.ID == id })
}

// projectImage returns the first image the region made for the project that matches, or nil.
func (s *Service) projectImage(ctx context.Context, org, project string, match func(*region.Image) bool) (*region.Image, error) {
	imgs, err := s.region.Images(ctx, org, project)
	if err != nil {
		return nil, regionError(err, "the images of project "+strconv.Quote(project))
	}
	for i := range imgs {
		if match(&imgs[i]) {
			return &imgs[i], nil
		}
	}
	return nil, nil
}

// checkImage resolves the image an instance of the project would boot (findImage) and checks
// that the region offers it and it is ready. The error is the region's failure to answer.
func (s *Service) checkImage(ctx context.Context, p *problems, org, project, id, regionID string) (*region.Image, error) {
	img, err := s.findImage(ctx, org, project, id)
	switch {
	case err != nil:
		return nil, err
	case img == nil:
		p.add(CodeNotFound, path("imageId"), "image %q not found", id)
		return nil, nil
	case regionID != "" && !img.OfferedIn(regionID):
		p.add(CodeUnprocessable, path("imageId"), "image %q is not offered in region %q", id, regionID)
		return nil, nil
	case img.State != region.ImageStateReady:
		p.add(CodeUnprocessable, path("imageId"), "image %q is %s, not ready", id, img.State)
		return nil, nil
	}
	return img, nil
}

// InstanceImage returns the image the instance boots: the catalogue's, or its project's
// snapshot; nil when it has since been retired or deleted.
func (s *Service) InstanceImage(ctx context.Context, inst *Instance) (*region.Image, error) {
	return s.findImage(ctx, inst.OrganizationID, inst.ProjectID, inst.ImageID)
}

// DeleteImageRequest is what deleteImage asks for.
type DeleteImageRequest struct {
	ID string
	// IdempotencyKey makes a retry safe (see idempotency.go).
	IdempotencyKey *string
}

// DeleteImage deletes a snapshot and returns its id. It needs operator in the snapshot's
// project, as snapshotInstance does. A catalogue image cannot be deleted, nor a snapshot that
// an instance not being deleted boots (its spec names it): both are refused, and so is a
// snapshot the region is still making. A retry with the idempotency key after the first call
// deleted it is answered with its id.
//
// The check of the instances and the region's delete are not one step: an instance created
// from the snapshot between the two would find its image gone and show ERROR. The region
// refuses to delete an image a server's disk rests on, so no server is ever harmed.
func (s *Service) DeleteImage(ctx context.Context, req DeleteImageRequest) (string, error) {
	pr, err := Principal(ctx)
	if err != nil {
		return "", err
	}
	idem, err := newIdempotency(pr, req.IdempotencyKey, "deleteImage", req.ID)
	if err != nil {
		return "", err
	}
	if idem.key != "" {
		// The image is gone after the first call: its key says so in one of the caller's
		// organizations.
		for _, org := range pr.Organizations() {
			prior, err := s.recorded(ctx, org, idem)
			if err != nil {
				return "", err
			}
			if prior != "" {
				return idem.replayOf(prior)
			}
		}
	}
	if _, ok := s.cat.Image(req.ID); ok {
		var p problems
		p.add(CodeUnprocessable, path("id"), "image %q is a catalogue image, which cannot be deleted: only snapshots made with snapshotInstance can", req.ID)
		return "", p.err()
	}
	img, err := s.snapshotOf(ctx, pr, req.ID)
	if err != nil {
		return "", err
	}
	what := "image " + strconv.Quote(req.ID)
	if img == nil {
		return "", Errorf(CodeNotFound, "%s not found", what)
	}
	org, project := img.OrganizationID, img.ProjectID
	if err := authorize(pr, org, project, auth.RoleOperator, what); err != nil {
		return "", err
	}
	users, err := s.imageUsers(ctx, org, project, img.ID)
	if err != nil {
		return "", err
	}
	if len(users) > 0 {
		names := make([]string, len(users))
		for i, inst := range users {
			names[i] = fmt.Sprintf("%s (%s)", inst.Name, inst.ID)
		}
		var p problems
		p.add(CodeConflict, path("id"), "image %q is used by %d %s: %s; delete %s or rebuild %s on another image first", img.ID, len(users),
			plural(len(users), "instance", "instances"), strings.Join(names, ", "), plural(len(users), "it", "them"), plural(len(users), "it", "them"))
		return "", p.err()
	}
	if err := s.region.DeleteImage(ctx, org, project, img.ID); err != nil {
		if errors.Is(err, region.ErrImageNotFound) {
			return "", Errorf(CodeNotFound, "%s not found", what)
		}
		return "", regionError(err, what)
	}
	replayed, err := s.store.RecordKey(ctx, org, idem.record(img.ID))
	if err != nil {
		// Deleted all the same: only a retry's answer is lost, which is then NOT_FOUND.
		s.log.WarnContext(ctx, "record the idempotency key of a deleted image", "image", img.ID, "err", err)
	}
	if replayed != "" {
		return idem.replayOf(replayed)
	}
	return img.ID, nil
}

// snapshotOf finds a snapshot among the projects the caller may read; nil when none has it.
func (s *Service) snapshotOf(ctx context.Context, pr auth.Principal, id string) (*region.Image, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, nil
	}
	for _, o := range s.cat.Organizations {
		for _, p := range o.Projects {
			if !pr.Allows(o.ID, p.ID, auth.RoleViewer) {
				continue
			}
			img, err := s.findImage(ctx, o.ID, p.ID, id)
			if err != nil || img != nil {
				return img, err
			}
		}
	}
	return nil, nil
}

// imageUsers lists the project's instances that boot the image and are not being deleted.
func (s *Service) imageUsers(ctx context.Context, org, project, imageID string) ([]*Instance, error) {
	var out []*Instance
	for cursor := ""; ; {
		insts, err := s.store.List(ctx, org, project, cursor, scanBatch)
		if err != nil {
			return nil, internal("list instances", err)
		}
		for _, inst := range insts {
			if inst.ImageID == imageID && !inst.Deleting() {
				out = append(out, inst)
			}
		}
		if len(insts) < scanBatch {
			return out, nil
		}
		cursor = insts[len(insts)-1].ID
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
