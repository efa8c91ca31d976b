package instance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/region"
)

// The operational verbs act on the instance's one backing server through the region and
// return as soon as the region accepted; the power change then shows through the status the
// workers observe. Each needs operator, and each is recorded on the instance's history with
// its caller and outcome once the caller is allowed to act on the instance. A verb that
// changes the server's power (start, stop, reboot) is recorded before the region is asked, so
// that its ACTION precedes every status change it causes; when the region then refuses, a
// second ACTION of the same verb records the refusal with its code, and a start or stop gives
// the desired power state back.

// Start powers the instance on. On a server that is still being built it only records the
// intent: the server runs when the build completes.
func (s *Service) Start(ctx context.Context, id string, idempotencyKey *string) (*Instance, error) {
	return s.power(ctx, id, idempotencyKey, ActionStart, IntentRunning, s.region.StartServer)
}

// Stop powers the instance off. On a server that is still being built it records the intent,
// and the workers stop the server as soon as the build completes. The instance stays stopped
// across a rebuild or a recreated server.
func (s *Service) Stop(ctx context.Context, id string, idempotencyKey *string) (*Instance, error) {
	return s.power(ctx, id, idempotencyKey, ActionStop, IntentStopped, s.region.StopServer)
}

// Reboot restarts a running instance; hard power-cycles it instead of asking the guest.
func (s *Service) Reboot(ctx context.Context, id string, hard bool, idempotencyKey *string) (*Instance, error) {
	action := ActionReboot
	if hard {
		action = ActionHardReboot
	}
	pr, inst, err := s.operable(ctx, id)
	if err != nil {
		return nil, err
	}
	idem, err := newIdempotency(pr, idempotencyKey, string(action), id)
	if err != nil {
		return nil, err
	}
	if replayed, done, err := s.replayIn(ctx, pr, inst.OrganizationID, idem); done {
		return replayed, err
	}
	var target string
	msg, err := s.perform(ctx, inst, func(srv *region.Server) (string, error) {
		if srv == nil || srv.State.Provisioning() {
			return "", Errorf(CodeUnprocessable, "the server of instance %q is still being built", inst.ID)
		}
		if inst.Resizing() {
			return "", resizingError(inst)
		}
		// Refused here rather than by the region, so that a refusal is one ACTION, not an
		// "asked" and a refusal.
		if srv.State != region.ServerRunning {
			return "", Errorf(CodeUnprocessable, "cannot %s instance %q while its server is %s: it must be RUNNING",
				strings.ReplaceAll(strings.ToLower(string(action)), "_", "-"), inst.ID, srv.State)
		}
		target = srv.ID
		return "The server was asked to reboot.", nil
	})
	ev := ActionEvent{Actor: pr.Subject, Action: action, Outcome: outcome(err), Message: msg, At: s.now().UTC()}
	if err != nil {
		return nil, s.record(ctx, inst, ev, err) // like Start and Stop: a refused verb returns no instance
	}
	// The key is recorded with the ACTION, before the region is asked: a retry meanwhile is
	// answered from it, and never reboots twice.
	ev.Idem = idem.record(inst.ID)
	refusal, err := s.store.Act(ctx, inst, nil, ev)
	switch {
	case err != nil:
		return nil, internal("record "+strings.ToLower(string(action)), err)
	case refusal != nil && refusal.Replayed != "":
		return s.replay(ctx, pr, idem, refusal.Replayed)
	case refusal != nil:
		return nil, Errorf(CodeNotFound, "instance %q not found", id)
	}
	if _, err := s.region.RebootServer(ctx, target, hard); err != nil {
		err = regionError(err, "instance "+strconv.Quote(inst.ID))
		ev.Outcome, ev.At, ev.Idem = outcome(err), s.now().UTC(), idem.forget()
		return nil, s.record(ctx, inst, ev, err)
	}
	return inst, nil
}

// SSHKey returns the private key of the project key pair the instance's server accepts. An
// instance with an SSH certificate authority has no key to give: its users log in with
// certificates the authority signed.
func (s *Service) SSHKey(ctx context.Context, id string) (region.SSHKey, error) {
	var key region.SSHKey
	err := s.act(ctx, id, ActionSSHKey, func(inst *Instance, srv *region.Server) (string, error) {
		if inst.SSHCertificateAuthorityID != "" {
			return "", Errorf(CodeUnprocessable, "instance %q accepts certificates of SSH certificate authority %q instead of a key pair: log in with a certificate it signed",
				inst.ID, inst.SSHCertificateAuthorityID)
		}
		var err error
		if key, err = s.region.SSHKey(ctx, srv.ID); err != nil {
			return "", err
		}
		return "The project key pair's private key was read.", nil
	})
	return key, err
}

// SnapshotRequest is what snapshotInstance asks for.
type SnapshotRequest struct {
	ID   string
	Name string
	Tags []Tag
	// IdempotencyKey makes a retry safe (see idempotency.go).
	IdempotencyKey *string
}

// fingerprinted is the request as its idempotency key's fingerprint covers it.
func (r SnapshotRequest) fingerprinted() SnapshotRequest {
	r.IdempotencyKey = nil
	return r
}

// ProvenanceTag names, on a snapshot image, the instance it was made from.
const ProvenanceTag = ReservedTagPrefix + "source-instance-id"

// RequestTag names, on a snapshot image, the idempotency key of the call that made it (hashed
// with its caller): a retry finds the image by it, even when the call's record was lost.
const RequestTag = ReservedTagPrefix + "request"

// Snapshot makes an image of the instance's server. Caller tags under the reserved prefix are
// dropped, so an image cannot pretend to come from another instance; the provenance tag is
// added. The image is CREATING until the region has finished it.
func (s *Service) Snapshot(ctx context.Context, req SnapshotRequest) (*region.Image, error) {
	var p problems
	checkName(&p, req.Name)
	tags := make([]Tag, 0, len(req.Tags))
	at := make([]int, 0, len(req.Tags)) // the caller's index of each kept tag
	for i, t := range req.Tags {
		if !strings.HasPrefix(t.Name, ReservedTagPrefix) {
			tags = append(tags, t)
			at = append(at, i)
		}
	}
	var tp problems
	checkTags(&tp, tags)
	for _, fe := range tp.list {
		// A problem names the caller's own tag: the dropped ones do not shift the index.
		if len(fe.Field) > 2 {
			if k, err := strconv.Atoi(fe.Field[2]); err == nil {
				fe.Field[2] = strconv.Itoa(at[k])
			}
		}
		p.list = append(p.list, fe)
	}
	if p.any() {
		// Fail before touching the instance: a malformed request is not an action taken.
		if _, _, err := s.operable(ctx, req.ID); err != nil {
			return nil, err
		}
		return nil, p.err()
	}
	pr, inst, err := s.operable(ctx, req.ID)
	if err != nil {
		return nil, err
	}
	idem, err := newIdempotency(pr, req.IdempotencyKey, "snapshotInstance", req.fingerprinted())
	if err != nil {
		return nil, err
	}
	if idem.key != "" {
		prior, err := s.recorded(ctx, inst.OrganizationID, idem)
		if err != nil {
			return nil, err
		}
		if prior != "" {
			if _, err := idem.replayOf(prior); err != nil {
				return nil, err
			}
		}
		// The image the first call made, found by its tag: recorded or not (the call may have
		// ended between the region's answer and its record), it is the answer. Recorded and
		// gone since, the answer is no image.
		made, err := s.imageOf(ctx, inst, idem.key)
		if err != nil || made != nil || prior != "" {
			return made, err
		}
	}
	var img region.Image
	var rec Idempotency
	err = s.actOn(ctx, pr, inst, ActionSnapshot, &rec, func(inst *Instance, srv *region.Server) (string, error) {
		m := make(map[string]string, len(tags)+2)
		for _, t := range tags {
			m[t.Name] = t.Value
		}
		m[ProvenanceTag] = inst.ID
		if idem.key != "" {
			m[RequestTag] = idem.key
			rec = idem.record(inst.ID)
		}
		var err error
		if img, err = s.region.Snapshot(ctx, srv.ID, region.ImageRequest{Name: req.Name, Tags: m}); err != nil {
			return "", err
		}
		return fmt.Sprintf("Image %q (%s) is being made.", img.Name, img.ID), nil
	})
	if err != nil {
		return nil, err
	}
	return &img, nil
}

// imageOf returns the image of the instance's project that the request key made, or nil.
func (s *Service) imageOf(ctx context.Context, inst *Instance, key string) (*region.Image, error) {
	return s.projectImage(ctx, inst.OrganizationID, inst.ProjectID, func(img *region.Image) bool { return img.Tags[RequestTag] == key })
}

// TagsOf lists a region resource's tags ordered by name.
func TagsOf(m map[string]string) []Tag {
	out := make([]Tag, 0, len(m))
	for name, value := range m {
		out = append(out, Tag{Name: name, Value: value})
	}
	slices.SortFunc(out, func(a, b Tag) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// power is Start and Stop: the instance records the intent with the ACTION, then the region
// changes the server's power, so the workers keep the intent across new servers and the
// ACTION precedes the status changes it causes. When the region refuses, the intent is given
// back (unless the instance changed meanwhile) and the refusal recorded. A server still being
// built gets only the intent, which the workers apply when the build completes. Asking for the
// power the instance already has and wants (a second stop) changes nothing and succeeds,
// returning the instance, as EC2 and most clouds answer: a retry is harmless and leaves no
// history.
func (s *Service) power(ctx context.Context, id string, idempotencyKey *string, action Action, want PowerIntent, call func(context.Context, string) (region.Server, error)) (*Instance, error) {
	pr, cur, err := s.operable(ctx, id)
	if err != nil {
		return nil, err
	}
	idem, err := newIdempotency(pr, idempotencyKey, string(action), id)
	if err != nil {
		return nil, err
	}
	if replayed, done, err := s.replayIn(ctx, pr, cur.OrganizationID, idem); done {
		return replayed, err
	}
	noop, target := false, ""
	msg, err := s.perform(ctx, cur, func(srv *region.Server) (string, error) {
		if want == IntentRunning && cur.Resizing() {
			return "", resizingError(cur)
		}
		if srv == nil || srv.State.Provisioning() {
			if cur.DesiredPower() == want {
				noop = true
				return "", nil
			}
			return "The server is still being built; it will be " + strings.ToLower(string(want)) + " when the build completes.", nil
		}
		if poweredAs(srv.State, want) {
			if cur.DesiredPower() == want {
				noop = true
				return "", nil
			}
			// Powered so behind our back: only the intent is new.
			return "The server is " + strings.ToLower(string(srv.State)) + " already.", nil
		}
		target = srv.ID
		return "The server was asked to " + strings.ToLower(string(action)) + ".", nil
	})
	if noop && err == nil {
		return cur, nil
	}
	ev := ActionEvent{Actor: pr.Subject, Action: action, Outcome: outcome(err), Message: msg, At: s.now().UTC()}
	if err != nil {
		return nil, s.record(ctx, cur, ev, err)
	}
	before := cur.Power
	ev.Idem = idem.record(cur.ID)
	next, prior, err := s.writePower(ctx, pr, cur, want, ev)
	switch {
	case err != nil:
		return nil, err
	case prior != "":
		return s.replay(ctx, pr, idem, prior) // a retry that raced the first call
	}
	if target != "" {
		if _, err := call(ctx, target); err != nil {
			err = regionError(err, "instance "+strconv.Quote(id))
			ev.Outcome, ev.At, ev.Idem = outcome(err), s.now().UTC(), idem.forget()
			return nil, s.undoPower(ctx, next, before, ev, err)
		}
	}
	if next.Generation != cur.Generation {
		s.enqueue(ctx, next)
	}
	return next, nil
}

// writePower records the verb's ACTION with the power intent, compare-and-set: a concurrent
// change of the instance means writing it again on the newer spec, which the verb does not
// depend on.
func (s *Service) writePower(ctx context.Context, pr auth.Principal, cur *Instance, want PowerIntent, ev ActionEvent) (*Instance, string, error) {
	id := cur.ID
	for range maxStatusRetries {
		next := *cur
		next.Power = want
		var changed []string
		if cur.DesiredPower() != want {
			changed = []string{"desiredPowerState"}
		}
		refusal, err := s.store.Act(ctx, &next, changed, ev)
		switch {
		case err != nil:
			return nil, "", internal("record "+strings.ToLower(string(ev.Action)), err)
		case refusal == nil:
			if len(changed) > 0 {
				next.Generation++
			}
			return &next, "", nil
		case refusal.Replayed != "":
			return nil, refusal.Replayed, nil
		case refusal.Gone:
			return nil, "", Errorf(CodeNotFound, "instance %q not found", id)
		}
		if cur, err = s.get(ctx, pr, id, auth.RoleOperator); err != nil {
			return nil, "", err
		}
	}
	return nil, "", Errorf(CodeConflict, "instance %q keeps changing; retry the %s", id, strings.ToLower(string(ev.Action)))
}

// undoPower records the region's refusal of a start or stop, giving the intent the verb wrote
// back, unless the instance changed since (then only the refusal is recorded), and returns the
// refusal.
func (s *Service) undoPower(ctx context.Context, written *Instance, before PowerIntent, ev ActionEvent, verbErr error) error {
	back := *written
	back.Power = before
	if back.DesiredPower() == written.DesiredPower() {
		return s.record(ctx, written, ev, verbErr)
	}
	ev.Message = strings.TrimSuffix(errorMessage(verbErr), ".") + "."
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	refusal, err := s.store.Act(rctx, &back, []string{"desiredPowerState"}, ev)
	switch {
	case err != nil:
		s.log.ErrorContext(rctx, "record action", "instance", written.ID, "action", ev.Action, "outcome", ev.Outcome, "err", err)
	case refusal != nil && !refusal.Gone:
		// Changed since: the newer intent stands.
		return s.record(ctx, written, ev, verbErr)
	case refusal == nil:
		// A worker may have acted on the intent while it was written (stopped the server a
		// stop failed to reach, or built a new one stopped): it reconciles to the intent put
		// back, rather than at the next resync.
		s.enqueue(rctx, &back)
	}
	return verbErr
}

// resizingError refuses a verb that would power on a server while it is being resized: the
// workers start it again themselves once it has its new flavor, if the resize was to.
func resizingError(inst *Instance) error {
	return Errorf(CodeUnprocessable, "instance %q is being resized to flavor %s: wait until the resize is done", inst.ID, inst.FlavorID)
}

// poweredAs reports whether a server in state is, or is on its way to being, powered as want.
func poweredAs(state region.ServerState, want PowerIntent) bool {
	switch want {
	case IntentRunning:
		return state == region.ServerRunning || state == region.ServerStarting
	case IntentStopped:
		return state == region.ServerStopped || state == region.ServerStopping
	}
	return false
}

// act runs a verb that changes nothing of the instance itself and records it.
func (s *Service) act(ctx context.Context, id string, action Action, fn func(*Instance, *region.Server) (string, error)) error {
	pr, inst, err := s.operable(ctx, id)
	if err != nil {
		return err
	}
	return s.actOn(ctx, pr, inst, action, nil, fn)
}

// actOn is act on an instance read already. fn may set *idem (nil: none) to the idempotency
// key its success records with the ACTION.
func (s *Service) actOn(ctx context.Context, pr auth.Principal, inst *Instance, action Action, idem *Idempotency, fn func(*Instance, *region.Server) (string, error)) error {
	msg, err := s.perform(ctx, inst, func(srv *region.Server) (string, error) {
		if srv == nil || srv.State.Provisioning() {
			return "", Errorf(CodeUnprocessable, "the server of instance %q is still being built", inst.ID)
		}
		return fn(inst, srv)
	})
	ev := ActionEvent{Actor: pr.Subject, Action: action, Outcome: outcome(err), Message: msg, At: s.now().UTC()}
	if err == nil && idem != nil {
		ev.Idem = *idem
	}
	return s.record(ctx, inst, ev, err)
}

// operable returns the caller and the instance, if the caller may act on it.
func (s *Service) operable(ctx context.Context, id string) (auth.Principal, *Instance, error) {
	pr, err := Principal(ctx)
	if err != nil {
		return auth.Principal{}, nil, err
	}
	inst, err := s.get(ctx, pr, id, auth.RoleOperator)
	return pr, inst, err
}

// perform finds the instance's one server and calls fn with it, or with nil while the server
// is yet to be made (the instance is pending or being rebuilt); it returns what fn says
// happened, or the error, mapped to its code. Zero servers for an instance that had one, or
// several, are a consistency error: the workers will repair it, and acting now could hit the
// wrong server.
func (s *Service) perform(ctx context.Context, inst *Instance, fn func(*region.Server) (string, error)) (string, error) {
	if inst.Deleting() {
		return "", Errorf(CodeUnprocessable, "instance %q is being deleted", inst.ID)
	}
	servers, err := s.region.FindServers(ctx, inst.Scope(), region.InstanceTag, inst.ID)
	if err != nil {
		return "", regionError(err, "instance "+strconv.Quote(inst.ID))
	}
	live := region.Live(servers)
	var msg string
	switch {
	case len(live) > 1:
		ids := make([]string, len(live))
		for i, srv := range live {
			ids[i] = srv.ID
		}
		return "", Errorf(CodeConsistency, "instance %q is backed by %d servers (%s) instead of one; the workers will delete the extra ones, retry then",
			inst.ID, len(live), strings.Join(ids, ", "))
	case len(live) == 0 && !inst.Status.Building():
		return "", Errorf(CodeConsistency, "instance %q has no server in the region (it is %s); the workers will recreate it, retry then",
			inst.ID, inst.Status.ProvisioningStatus)
	case len(live) == 0:
		msg, err = fn(nil)
	default:
		msg, err = fn(&live[0])
	}
	if err != nil {
		return "", regionError(err, "instance "+strconv.Quote(inst.ID))
	}
	return msg, nil
}

// outcome is the code an action's record carries: none for success.
func outcome(err error) Code {
	if err == nil {
		return ""
	}
	return CodeOf(err)
}

// recordTimeout bounds writing an action's record once the caller may have gone.
const recordTimeout = 5 * time.Second

// record appends the verb's event and returns the verb's own error, which is what the caller
// must see; an event that cannot be written is logged, since the action itself happened.
func (s *Service) record(ctx context.Context, inst *Instance, ev ActionEvent, verbErr error) error {
	if verbErr != nil {
		ev.Message = strings.TrimSuffix(errorMessage(verbErr), ".") + "."
	}
	// The action happened; its record must land even if the caller has gone.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	if _, err := s.store.Act(ctx, inst, nil, ev); err != nil {
		s.log.ErrorContext(ctx, "record action", "instance", inst.ID, "action", ev.Action, "outcome", ev.Outcome, "err", err)
	}
	return verbErr
}

// errorMessage is the part of an error safe to show users.
func errorMessage(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Message
	}
	return "internal error"
}

// regionError maps what the region said to the code the caller sees: its refusals keep their
// meaning (a stopped server cannot be stopped: UNPROCESSABLE with the region's reason; a
// vanished server: NOT_FOUND); only real faults are UNAVAILABLE or INTERNAL.
func regionError(err error, what string) error {
	var e *Error
	switch {
	case errors.As(err, &e):
		return err
	case errors.Is(err, region.ErrRefused):
		return &Error{Code: CodeUnprocessable, Message: region.Reason(err, region.ErrRefused), Err: err}
	case errors.Is(err, region.ErrServerNotFound):
		return &Error{Code: CodeNotFound, Message: fmt.Sprintf("the server of %s is gone; the workers will recreate it", what), Err: err}
	case errors.Is(err, region.ErrUnavailable):
		return &Error{Code: CodeUnavailable, Message: "the region did not answer; retry", Err: err}
	}
	return internal("region", err)
}
