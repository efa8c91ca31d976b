package instance

import (
	"context"
	"fmt"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/quota"
	"github.com/computeql/computeql/region"
)

// ResizeRequest is what resizeInstance asks for.
type ResizeRequest struct {
	ID       string
	FlavorID string
	// AllowRestart consents to stopping a powered-on server for the resize and starting it
	// again after.
	AllowRestart bool
	// IdempotencyKey makes a retry safe (see idempotency.go).
	IdempotencyKey *string
}

// fingerprinted is the request as its idempotency key's fingerprint covers it.
func (r ResizeRequest) fingerprinted() ResizeRequest {
	r.IdempotencyKey = nil
	return r
}

// Resize gives the instance's server another flavor in place (DOMAIN's resize, Nova's resize,
// EC2's stop-modify-start): its CPUs, memory and disk change and it keeps its disk's content,
// IP addresses and MAC address. The disk only grows. A server that is powered on is stopped
// and started again by the workers, which needs AllowRestart. The quota is charged or
// released by the difference in the same write as the change, which an ACTION RESIZE
// records; the workers then carry it out.
func (s *Service) Resize(ctx context.Context, req ResizeRequest) (*Instance, error) {
	r, err := s.prepareResize(ctx, req)
	if err != nil {
		return nil, err
	}
	pr, _ := Principal(ctx) // prepareResize has it
	ev := ActionEvent{
		Actor: pr.Subject, Action: ActionResize, At: r.next.UpdatedAt,
		Message: fmt.Sprintf("Resize from flavor %s to %s asked.", r.cur.FlavorID, r.next.FlavorID),
	}
	if r.next.ResizeRestart {
		ev.Message = fmt.Sprintf("Resize from flavor %s to %s asked: the server is stopped, resized and started again.", r.cur.FlavorID, r.next.FlavorID)
	}
	return s.commit(ctx, r, "resizeInstance", req.fingerprinted(), req.IdempotencyKey, false,
		func(inst *Instance, limits quota.Amounts, idem Idempotency) (*Refusal, error) {
			ev.Idem = idem
			return s.store.Resize(ctx, inst, r.delta, limits, SpecChanges(r.cur.Spec, r.next), ev)
		})
}

// DryRunResize checks a resize as Resize does, the quota included, and says what it would do,
// writing nothing.
func (s *Service) DryRunResize(ctx context.Context, req ResizeRequest) (*Plan, error) {
	r, err := s.prepareResize(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := s.refusePrepared(ctx, r); err != nil {
		return nil, err
	}
	return &Plan{Restart: r.next.ResizeRestart, ChangedFields: r.changed(), QuotaChanges: quotaChanges(r.delta)}, nil
}

// prepareResize checks a resize against the instance: the new flavor must be offered where
// the instance runs, fit its image, differ from the current one and have a disk at least as
// large; the server must be built and not in the middle of another resize; a server that is
// not stopped needs AllowRestart.
func (s *Service) prepareResize(ctx context.Context, req ResizeRequest) (*preparedChange, error) {
	pr, err := Principal(ctx)
	if err != nil {
		return nil, err
	}
	cur, err := s.get(ctx, pr, req.ID, auth.RoleMember)
	if err != nil {
		return nil, err
	}
	// A state that forbids any resize is the only problem reported; it is not an error, so
	// that a retry of a resize that went through (and is under way) is answered from its key.
	var p problems
	switch {
	case cur.Deleting():
		p.add(CodeUnprocessable, path("id"), "instance %q is being deleted and cannot be resized", req.ID)
	case cur.Resizing():
		p.add(CodeUnprocessable, path("id"), "instance %q is being resized to flavor %s already: resize it again once that is done", req.ID, cur.FlavorID)
	case cur.Status.ProvisioningStatus != ProvisioningProvisioned:
		p.add(CodeUnprocessable, path("id"), "instance %q is %s: only a provisioned instance can be resized", req.ID, cur.Status.ProvisioningStatus)
	}
	if p.any() {
		return &preparedChange{cur: cur, p: p}, nil
	}
	next := cur.Spec
	flavor := checkFlavor(&p, s.cat, req.FlavorID, cur.RegionID)
	if flavor != nil {
		img, err := s.findImage(ctx, cur.OrganizationID, cur.ProjectID, cur.ImageID)
		if err != nil {
			return nil, err
		}
		if img != nil {
			// The image is the instance's own: what does not fit it is the flavor asked for.
			var fit problems
			checkCompatible(&fit, flavor, img)
			for _, fe := range fit.list {
				p.add(fe.Code, path("flavorId"), "%s", fe.Message)
			}
		}
		checkRegionOffers(&p, s.cat, cur.RegionID, flavor, false)
		from, ok := s.cat.Flavor(cur.FlavorID)
		switch {
		case flavor.ID == cur.FlavorID:
			p.add(CodeUnprocessable, path("flavorId"), "instance %q has flavor %s already", req.ID, flavor.ID)
		case ok && flavor.DiskGB < from.DiskGB:
			p.add(CodeUnprocessable, path("flavorId"), "flavor %s has a %d GB disk, smaller than the instance's %d GB: a disk never shrinks; choose a flavor with a disk of at least %d GB",
				flavor.ID, flavor.DiskGB, from.DiskGB, from.DiskGB)
		}
	}
	restart := cur.Status.PowerState != PowerStopped
	if restart && !req.AllowRestart {
		p.add(CodeUnprocessable, path("allowRestart"), "instance %q is %s: resizing stops its server and starts it again; set allowRestart: true to proceed, or stop the instance first",
			req.ID, cur.Status.PowerState)
	}
	cost := cur.Charge
	if flavor != nil {
		cost = charge(flavor, cur.Networking.PublicIP)
		next.FlavorID = flavor.ID
	}
	next.Charge = cost
	next.ResizeGeneration = cur.Generation + 1
	next.ResizeRestart = restart
	next.UpdatedAt = s.now().UTC()
	next.UpdatedBy = pr.Subject
	return &preparedChange{cur: cur, next: next, delta: cost.Sub(cur.Charge), p: p}, nil
}

// ConsoleOutput returns the end of the serial console output of the instance's server: the
// last tailBytes (nil: region.ConsoleOutputMax, which is also the most). Boot logs can hold
// secrets, so it takes a caller who may act on the instance. It is a read: it is not recorded
// on the instance's history, which a dashboard polling it would flood.
func (s *Service) ConsoleOutput(ctx context.Context, id string, tailBytes *int) (region.ConsoleOutput, error) {
	tail := region.ConsoleOutputMax
	if tailBytes != nil {
		if *tailBytes < 1 || *tailBytes > region.ConsoleOutputMax {
			return region.ConsoleOutput{}, Errorf(CodeBadUserInput, "tailBytes must be between 1 and %d", region.ConsoleOutputMax)
		}
		tail = *tailBytes
	}
	_, inst, err := s.operable(ctx, id)
	if err != nil {
		return region.ConsoleOutput{}, err
	}
	var out region.ConsoleOutput
	_, err = s.perform(ctx, inst, func(srv *region.Server) (string, error) {
		if srv == nil {
			return "", Errorf(CodeUnprocessable, "instance %q has no server yet: its console has written nothing", inst.ID)
		}
		var err error
		out, err = s.region.ConsoleOutput(ctx, srv.ID, tail)
		return "", err
	})
	return out, err
}
