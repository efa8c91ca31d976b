package instance

import (
	"cmp"
	"context"
	"encoding/base64"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/quota"
	"github.com/computeql/computeql/region"
)

// CreateRequest is what createInstance asks for.
type CreateRequest struct {
	OrganizationID            string
	ProjectID                 string
	NetworkID                 string
	Name                      string
	Description               *string
	Tags                      []Tag
	FlavorID                  string
	ImageID                   string
	SSHCertificateAuthorityID *string
	Networking                *NetworkingRequest
	// UserData is base64.
	UserData *string
	// SSHPublicKeys are authorized_keys lines the guest accepts.
	SSHPublicKeys []string
	// DeletionProtection refuses deleteInstance until an update clears it.
	DeletionProtection *bool
	// DryRun asks what the create would do (Service.DryRunCreate) instead of doing it.
	DryRun *bool
	// IdempotencyKey makes a retry safe (see idempotency.go).
	IdempotencyKey *string
	// ExpiresAt starts a lease, ending with ExpiryAction (STOP when not given).
	ExpiresAt    *time.Time
	ExpiryAction *ExpiryAction
}

// fingerprinted is the request as its idempotency key's fingerprint covers it: without the key.
func (r CreateRequest) fingerprinted() CreateRequest {
	r.IdempotencyKey, r.DryRun = nil, nil
	return r
}

// NetworkingRequest is requested networking; on update, fields left nil stay as they are.
type NetworkingRequest struct {
	SecurityGroupIDs       []string
	PublicIP               *bool
	AllowedSourceAddresses []string
}

func (r *NetworkingRequest) apply(n Networking) Networking {
	if r == nil {
		return n
	}
	if r.SecurityGroupIDs != nil {
		n.SecurityGroupIDs = r.SecurityGroupIDs
	}
	if r.PublicIP != nil {
		n.PublicIP = *r.PublicIP
	}
	if r.AllowedSourceAddresses != nil {
		n.AllowedSourceAddresses = r.AllowedSourceAddresses
	}
	return n
}

// Create validates the request (every failure at once), then stores the
// instance, claims its name and charges its quota in one atomic step, and queues it.
func (s *Service) Create(ctx context.Context, req CreateRequest) (*Instance, error) {
	inst, network, p, err := s.prepareCreate(ctx, req)
	if err != nil {
		return nil, err
	}
	pr, _ := Principal(ctx) // prepareCreate has it
	idem, err := newIdempotency(pr, req.IdempotencyKey, "createInstance", req.fingerprinted())
	if err != nil {
		return nil, err
	}
	// A retry is answered from its key before anything is checked again: the catalogue may
	// have changed since, and the name is its own instance's now.
	if inst, done, err := s.replayIn(ctx, pr, req.OrganizationID, idem); done {
		return inst, err
	}
	if p.any() {
		return nil, s.refuseCreate(ctx, p, inst, network, req.Name)
	}
	refusal, queued, err := s.store.CreateQueued(ctx, inst, NameClaim(network.ID, req.Name), s.limits(inst.OrganizationID), idem.record(inst.ID))
	if err != nil {
		return nil, internal("create instance", err)
	}
	if refusal != nil && refusal.Replayed != "" {
		// A retry sent while the first call was still running, which won.
		return s.replay(ctx, pr, idem, refusal.Replayed)
	}
	if refusal != nil {
		if refusal.NameTaken {
			// The claim was taken when the store refused; its holder is read to name it, and
			// if it has gone meanwhile the refusal stands all the same.
			if taken, err := s.checkNameFree(ctx, &p, inst.OrganizationID, network.ID, req.Name); err != nil || !taken {
				addNameTaken(&p, req.Name, network.ID)
			}
		}
		addQuotaProblems(&p, refusal.Exceeded)
		return nil, p.err()
	}
	inst.Generation, inst.StatusVersion = 1, 1
	if !queued {
		s.enqueue(ctx, inst)
	}
	return inst, nil
}

// DryRunCreate validates a create as Create does, the taken name and the quota included, and
// says what it would do, writing nothing.
func (s *Service) DryRunCreate(ctx context.Context, req CreateRequest) (*Plan, error) {
	inst, network, p, err := s.prepareCreate(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := s.refuseCreate(ctx, p, inst, network, req.Name); err != nil {
		return nil, err
	}
	return &Plan{ChangedFields: []string{}, QuotaChanges: quotaChanges(inst.Charge)}, nil
}

// refuseCreate adds a taken name and a lack of quota to the create's problems, so that every
// problem comes at once, and returns them (nil when there are none). The authoritative checks
// are the store's atomic ones.
func (s *Service) refuseCreate(ctx context.Context, p problems, inst *Instance, network *region.Network, name string) error {
	if network != nil && namePattern.MatchString(name) {
		if _, err := s.checkNameFree(ctx, &p, inst.OrganizationID, network.ID, name); err != nil {
			return internal("create instance", err)
		}
	}
	if err := s.precheckQuota(ctx, &p, inst.OrganizationID, inst.Charge); err != nil {
		return internal("create instance", err)
	}
	if p.any() {
		return p.err()
	}
	return nil
}

// prepareCreate checks a create and builds the instance it would make, returning the
// problems found; the network is nil when it is not the caller's. An error is a refusal of the
// whole request (an unknown project, a caller without the role).
func (s *Service) prepareCreate(ctx context.Context, req CreateRequest) (*Instance, *region.Network, problems, error) {
	pr, err := Principal(ctx)
	if err != nil {
		return nil, nil, problems{}, err
	}
	org, project := req.OrganizationID, req.ProjectID
	// A project the caller may not see answers as one that does not exist, word for word:
	// the answer must not tell which organizations and projects exist.
	if !s.cat.HasProject(org, project) || !pr.RoleIn(org, project).Includes(auth.RoleViewer) {
		return nil, nil, problems{}, Errorf(CodeNotFound, "project %q of organization %q not found", project, org)
	}
	if err := authorize(pr, org, project, auth.RoleMember, "project "+strconv.Quote(project)); err != nil {
		return nil, nil, problems{}, err
	}

	var p problems
	// The network is resolved under the caller's organization and project: one of another
	// project is "not found", whatever the request claims.
	network, ok := s.cat.Network(req.NetworkID)
	if !ok || network.OrganizationID != org || network.ProjectID != project {
		p.add(CodeNotFound, path("networkId"), "network %q not found in project %q", req.NetworkID, project)
		network = nil
	}
	regionID := ""
	if network != nil {
		regionID = network.Region
	}
	checkName(&p, req.Name)
	desc := deref(req.Description)
	checkDescription(&p, desc)
	checkTags(&p, req.Tags)
	flavor := checkFlavor(&p, s.cat, req.FlavorID, regionID)
	image, err := s.checkImage(ctx, &p, org, project, req.ImageID, regionID)
	if err != nil {
		return nil, nil, problems{}, err
	}
	if flavor != nil && image != nil {
		checkCompatible(&p, flavor, image)
	}
	networking := checkNetworking(&p, s.cat, req.Networking.apply(Networking{}), org, project, network)
	checkRegionOffers(&p, s.cat, regionID, flavor, networking.PublicIP)
	caID := deref(req.SSHCertificateAuthorityID)
	if caID != "" {
		checkSSHCA(&p, s.cat, caID, org, project)
	}
	var userData []byte
	if req.UserData != nil {
		userData = decodeUserData(&p, *req.UserData, caID != "")
	}
	sshKeys := checkSSHPublicKeys(&p, req.SSHPublicKeys)
	expiresAt, expiryAction := checkLease(&p, s.now(), req.ExpiresAt, req.ExpiryAction, nil, "")
	var cost quota.Amounts
	if flavor != nil {
		cost = charge(flavor, networking.PublicIP)
	}
	if p.any() {
		return &Instance{OrganizationID: org, Spec: Spec{Charge: cost}}, network, p, nil
	}

	now := s.now().UTC()
	id, err := uuid.NewV7()
	if err != nil {
		return nil, nil, p, internal("create instance: new id", err)
	}
	inst := &Instance{
		ID:             id.String(),
		OrganizationID: org,
		ProjectID:      project,
		Spec: Spec{
			Name:                      req.Name,
			Description:               desc,
			Tags:                      req.Tags,
			RegionID:                  regionID,
			NetworkID:                 network.ID,
			FlavorID:                  flavor.ID,
			ImageID:                   image.ID,
			SSHCertificateAuthorityID: caID,
			Networking:                networking,
			UserData:                  userData,
			SSHPublicKeys:             sshKeys,
			DeletionProtection:        req.DeletionProtection != nil && *req.DeletionProtection,
			ExpiresAt:                 expiresAt,
			ExpiryAction:              expiryAction,
			Charge:                    cost,
			CreatedAt:                 now,
			CreatedBy:                 pr.Subject,
			UpdatedAt:                 now,
			UpdatedBy:                 pr.Subject,
		},
		Status: Status{
			ProvisioningStatus: ProvisioningPending,
			HealthStatus:       HealthUnknown,
			PowerState:         PowerPending,
			Conditions: []Condition{{
				Type: ConditionAvailable, Status: ConditionFalse, Reason: ReasonProvisioning,
				Message: "Waiting for a worker to provision the instance.", LastTransitionTime: now,
			}},
		},
	}
	return inst, network, p, nil
}

// checkNameFree adds a CONFLICT when an instance holds the name on the network, quoting its
// name as it was given, which may differ from the request's in case only; taken says whether
// it did.
func (s *Service) checkNameFree(ctx context.Context, p *problems, org, networkID, name string) (taken bool, err error) {
	owner, err := s.store.ClaimOwner(ctx, org, NameClaim(networkID, name))
	if err != nil || owner == "" {
		return false, err
	}
	if inst, err := s.store.Peek(ctx, []string{org}, owner); err == nil {
		name = inst.Name
	}
	addNameTaken(p, name, networkID)
	return true, nil
}

func addNameTaken(p *problems, name, networkID string) {
	p.add(CodeConflict, path("name"), "an instance named %q already exists on network %q (names are case-insensitive, like hostnames)", name, networkID)
}

// Get returns an instance the caller may read.
func (s *Service) Get(ctx context.Context, id string) (*Instance, error) {
	pr, err := Principal(ctx)
	if err != nil {
		return nil, err
	}
	return s.peek(ctx, pr, id, auth.RoleViewer)
}

// get finds the instance among the principal's organizations and checks it holds min over
// the instance's project. Looking only where the principal has grants means an instance of
// another organization is never even read.
func (s *Service) get(ctx context.Context, pr auth.Principal, id string, min auth.Role) (*Instance, error) {
	return s.read(ctx, pr, id, min, s.store.Get)
}

// peek is get without reading the large fields until they are asked for (Store.Peek): for
// reads that serve the API.
func (s *Service) peek(ctx context.Context, pr auth.Principal, id string, min auth.Role) (*Instance, error) {
	return s.read(ctx, pr, id, min, s.store.Peek)
}

func (s *Service) read(ctx context.Context, pr auth.Principal, id string, min auth.Role,
	get func(context.Context, []string, string) (*Instance, error)) (*Instance, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	inst, err := get(ctx, pr.Organizations(), id)
	switch {
	case err == ErrNotFound:
		return nil, Errorf(CodeNotFound, "instance %q not found", id)
	case err != nil:
		return nil, internal("get instance", err)
	}
	if err := authorize(pr, inst.OrganizationID, inst.ProjectID, min, "instance "+strconv.Quote(id)); err != nil {
		return nil, err
	}
	return inst, nil
}

func checkID(id string) error {
	if _, err := uuid.Parse(id); err != nil || len(id) != 36 {
		return Errorf(CodeBadUserInput, "%q is not an instance id (a UUID such as 0190c7a4-6b1e-7c3d-9f00-1a2b3c4d5e6f)", truncate(id, 64))
	}
	return nil
}

// Change is an update of a field that can also be cleared: Set says the request names the
// field at all, and a Set change with a nil Value clears it.
type Change struct {
	Set   bool
	Value *string
}

// UpdateRequest is what updateInstance asks for. Nil fields stay as they are.
type UpdateRequest struct {
	ID                        string
	Name                      *string
	Description               *string
	Tags                      []Tag
	TagsSet                   bool
	FlavorID                  *string
	ImageID                   *string
	SSHCertificateAuthorityID Change
	Networking                *NetworkingRequest
	// UserData is base64.
	UserData Change
	// SSHPublicKeys, when SSHPublicKeysSet, replaces the keys (none when empty).
	SSHPublicKeys      []string
	SSHPublicKeysSet   bool
	DeletionProtection *bool
	AllowRebuild       bool
	ExpectedGeneration *int64
	// IdempotencyKey makes a retry safe (see idempotency.go).
	IdempotencyKey *string
	// ExpiresAtSet says the request names expiresAt: ExpiresAt then starts, moves or (nil)
	// ends the lease. ExpiryAction, when given, changes what its end does.
	ExpiresAtSet bool
	ExpiresAt    *time.Time
	ExpiryAction *ExpiryAction
}

// fingerprinted is the request as its idempotency key's fingerprint covers it: without the key.
func (r UpdateRequest) fingerprinted() UpdateRequest {
	r.IdempotencyKey = nil
	return r
}

// Update changes an instance's desired state. Changes that can only be
// realised by rebuilding the server need AllowRebuild; the write is compare-and-set on the
// generation the change was validated against.
func (s *Service) Update(ctx context.Context, req UpdateRequest) (*Instance, error) {
	u, err := s.prepareUpdate(ctx, req)
	if err != nil {
		return nil, err
	}
	// A retry is answered from its key before the update is checked again: its
	// expectedGeneration, for one, is the first call's.
	return s.commit(ctx, u, "updateInstance", req.fingerprinted(), req.IdempotencyKey, req.ExpectedGeneration != nil,
		func(inst *Instance, limits quota.Amounts, idem Idempotency) (*Refusal, error) {
			return s.store.UpdateSpec(ctx, inst, u.delta, limits, nil, SpecChanges(u.cur.Spec, u.next), idem)
		})
}

// DryRunUpdate validates an update as Update does, the quota included, and says what it would
// do, writing nothing.
func (s *Service) DryRunUpdate(ctx context.Context, req UpdateRequest) (*Plan, error) {
	u, err := s.prepareUpdate(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := s.refusePrepared(ctx, u); err != nil {
		return nil, err
	}
	return &Plan{Rebuild: u.next.RebuildGeneration > u.cur.RebuildGeneration, ChangedFields: u.changed(), QuotaChanges: quotaChanges(u.delta)}, nil
}

// preparedChange is an update or a resize checked: the instance, its spec as the change leaves
// it, the quota it takes or gives back, and the problems found.
type preparedChange struct {
	cur   *Instance
	next  Spec
	delta quota.Amounts
	p     problems
}

// changed lists the fields the change changes, [] for none.
func (c *preparedChange) changed() []string {
	if f := SpecChanges(c.cur.Spec, c.next); f != nil {
		return f
	}
	return []string{}
}

// refusePrepared returns the change's problems, with the quota's, as one refusal, or nil when
// there are none.
func (s *Service) refusePrepared(ctx context.Context, c *preparedChange) error {
	if err := s.precheckQuota(ctx, &c.p, c.cur.OrganizationID, c.delta); err != nil {
		return internal("change instance", err)
	}
	return c.p.err()
}

// commit is what an update and a resize do once checked: answer a retry from its idempotency
// key, refuse with every problem found, else write the change with write (compare-and-set on
// the generation, recording the key) and queue the instance.
func (s *Service) commit(ctx context.Context, c *preparedChange, mutation string, req any, key *string, expectedGiven bool,
	write func(inst *Instance, limits quota.Amounts, idem Idempotency) (*Refusal, error)) (*Instance, error) {
	pr, _ := Principal(ctx) // preparing the change had it
	idem, err := newIdempotency(pr, key, mutation, req)
	if err != nil {
		return nil, err
	}
	if inst, done, err := s.replayIn(ctx, pr, c.cur.OrganizationID, idem); done {
		return inst, err
	}
	if c.p.any() {
		return nil, s.refusePrepared(ctx, c)
	}
	inst := *c.cur
	inst.Spec = c.next
	refusal, err := write(&inst, s.limits(c.cur.OrganizationID), idem.record(c.cur.ID))
	if err != nil {
		return nil, internal(mutation, err)
	}
	if refusal != nil && refusal.Replayed != "" {
		return s.replay(ctx, pr, idem, refusal.Replayed)
	}
	if refusal != nil {
		return nil, s.updateRefused(refusal, c.cur.ID, expectedGiven)
	}
	inst.Generation++
	s.enqueue(ctx, &inst)
	return &inst, nil
}

// prepareUpdate checks an update against the instance. An error is a refusal of the whole
// request (not found, not allowed, being deleted).
func (s *Service) prepareUpdate(ctx context.Context, req UpdateRequest) (*preparedChange, error) {
	pr, err := Principal(ctx)
	if err != nil {
		return nil, err
	}
	cur, err := s.get(ctx, pr, req.ID, auth.RoleMember)
	if err != nil {
		return nil, err
	}
	var p problems
	if cur.Deleting() {
		p.add(CodeUnprocessable, path("id"), "instance %q is being deleted and cannot be changed", req.ID)
		return nil, p.err()
	}
	if req.ExpectedGeneration != nil && *req.ExpectedGeneration != cur.Generation {
		p.add(CodeConflict, path("expectedGeneration"), "instance is at generation %d, not %d: re-read it and retry", cur.Generation, *req.ExpectedGeneration)
	}
	if req.Name != nil && *req.Name != cur.Name {
		p.add(CodeUnprocessable, path("name"), "names cannot be changed: the name is the server's hostname")
	}

	next := cur.Spec
	if req.Description != nil {
		next.Description = *req.Description
		checkDescription(&p, next.Description)
	}
	if req.TagsSet {
		next.Tags = req.Tags
		checkTags(&p, next.Tags)
	}
	if req.DeletionProtection != nil {
		next.DeletionProtection = *req.DeletionProtection
	}
	if req.ExpiresAtSet || req.ExpiryAction != nil {
		lease := cur.ExpiresAt
		if req.ExpiresAtSet {
			lease = req.ExpiresAt
		}
		next.ExpiresAt, next.ExpiryAction = checkLease(&p, s.now(), lease, req.ExpiryAction, cur.ExpiresAt, cur.ExpiryAction)
	}
	network, ok := s.cat.Network(cur.NetworkID)
	if !ok {
		// The network was retired: its security groups went with it, and a group of any other
		// network (or organization) must not pass for one of the instance's own.
		network = &region.Network{ID: cur.NetworkID}
	}
	if req.Networking != nil {
		next.Networking = checkNetworking(&p, s.cat, req.Networking.apply(cur.Networking), cur.OrganizationID, cur.ProjectID, network)
	}
	var rebuild []string
	if req.FlavorID != nil && *req.FlavorID != cur.FlavorID {
		next.FlavorID = *req.FlavorID
		rebuild = append(rebuild, "flavorId")
	}
	if req.ImageID != nil && *req.ImageID != cur.ImageID {
		next.ImageID = *req.ImageID
		rebuild = append(rebuild, "imageId")
	}
	if req.SSHCertificateAuthorityID.Set && deref(req.SSHCertificateAuthorityID.Value) != cur.SSHCertificateAuthorityID {
		next.SSHCertificateAuthorityID = deref(req.SSHCertificateAuthorityID.Value)
		rebuild = append(rebuild, "sshCertificateAuthorityId")
		if next.SSHCertificateAuthorityID != "" {
			checkSSHCA(&p, s.cat, next.SSHCertificateAuthorityID, cur.OrganizationID, cur.ProjectID)
		}
	}
	if req.UserData.Set {
		next.UserData = nil
		if req.UserData.Value != nil {
			next.UserData = decodeUserData(&p, *req.UserData.Value, next.SSHCertificateAuthorityID != "")
		}
		if string(next.UserData) != string(cur.UserData) {
			rebuild = append(rebuild, "userData")
		}
	} else if next.SSHCertificateAuthorityID != cur.SSHCertificateAuthorityID && next.SSHCertificateAuthorityID != "" && isGzip(cur.UserData) {
		p.add(CodeUnprocessable, path("userData"), "the current user data is gzip, which cannot be used with an SSH certificate authority: replace it too")
	}
	if req.SSHPublicKeysSet {
		next.SSHPublicKeys = checkSSHPublicKeys(&p, req.SSHPublicKeys)
		if !slices.Equal(next.SSHPublicKeys, cur.SSHPublicKeys) {
			rebuild = append(rebuild, "sshPublicKeys")
		}
	}

	// The flavor and image are checked only when something that needs them changes, so one
	// that was retired after the instance was created does not block unrelated updates.
	cost := cur.Charge
	if len(rebuild) > 0 {
		flavor := checkFlavor(&p, s.cat, next.FlavorID, next.RegionID)
		image, err := s.checkImage(ctx, &p, cur.OrganizationID, cur.ProjectID, next.ImageID, next.RegionID)
		if err != nil {
			return nil, err
		}
		if flavor != nil && image != nil {
			checkCompatible(&p, flavor, image)
		}
		checkRegionOffers(&p, s.cat, next.RegionID, flavor, false)
		if flavor != nil {
			cost = charge(flavor, next.Networking.PublicIP)
		}
		if !req.AllowRebuild {
			for _, f := range rebuild {
				hint := ""
				if f == "flavorId" {
					hint = ", or resize the instance with resizeInstance, which keeps its disk"
				}
				p.add(CodeUnprocessable, path(f), "changing %s rebuilds the server: its disk, IP addresses and MAC address are lost; set allowRebuild: true to proceed%s", f, hint)
			}
		}
	}
	if next.Networking.PublicIP != cur.Networking.PublicIP {
		cost = withPublicIP(cost, next.Networking.PublicIP)
		checkRegionOffers(&p, s.cat, next.RegionID, nil, next.Networking.PublicIP)
	}
	delta := cost.Sub(cur.Charge)
	if len(rebuild) > 0 {
		next.RebuildGeneration = cur.Generation + 1
	}
	next.Charge = cost
	next.UpdatedAt = s.now().UTC()
	next.UpdatedBy = pr.Subject
	return &preparedChange{cur: cur, next: next, delta: delta, p: p}, nil
}

// Plan is what a create or an update would do, as a dry run reports it instead of doing it.
type Plan struct {
	// Rebuild: the server would be destroyed and recreated (its disk, IPs and MAC lost).
	Rebuild bool
	// Restart: the server would be stopped and started again. No change does so today.
	Restart bool
	// ChangedFields are the instance's fields that would change (none for a create).
	ChangedFields []string
	// QuotaChanges is the change of the organization's usage, per kind that changes.
	QuotaChanges []QuotaChange
}

// QuotaChange is how much of one kind of quota a change takes (positive) or gives back.
type QuotaChange struct {
	Kind  quota.Kind
	Delta int64
}

// quotaChanges lists the kinds a delta changes, in the order of quota.Kinds.
func quotaChanges(delta quota.Amounts) []QuotaChange {
	out := []QuotaChange{}
	for _, k := range quota.Kinds {
		if d := delta[k]; d != 0 {
			out = append(out, QuotaChange{Kind: k, Delta: d})
		}
	}
	return out
}

func withPublicIP(a quota.Amounts, on bool) quota.Amounts {
	out := quota.Amounts{}
	for k, v := range a {
		out[k] = v
	}
	delete(out, quota.PublicIPs)
	if on {
		out[quota.PublicIPs] = 1
	}
	return out
}

// updateRefused explains a store's refusal. A lost compare-and-set is reported on
// expectedGeneration when the caller gave one, as when the check fails before the write.
func (s *Service) updateRefused(r *Refusal, id string, expectedGiven bool) error {
	if r.Gone {
		return Errorf(CodeNotFound, "instance %q not found", id)
	}
	var p problems
	if r.Stale {
		f := path("id")
		if expectedGiven {
			f = path("expectedGeneration")
		}
		p.add(CodeConflict, f, "instance %q was changed concurrently: re-read it and retry", id)
	}
	addQuotaProblems(&p, r.Exceeded)
	return p.err()
}

// maxStatusRetries bounds how often Delete re-reads an instance whose status a worker wrote
// between the read and the write; workers write rarely, so a handful always suffices.
const maxStatusRetries = 5

// Delete marks an instance for deletion and shows it deprovisioning at once; workers then
// delete the server, release the quota and forget the instance. Deleting an instance that is
// already being deleted changes nothing.
func (s *Service) Delete(ctx context.Context, id string, idempotencyKey *string) (*Instance, error) {
	pr, err := Principal(ctx)
	if err != nil {
		return nil, err
	}
	idem, err := newIdempotency(pr, idempotencyKey, "deleteInstance", id)
	if err != nil {
		return nil, err
	}
	for range maxStatusRetries {
		cur, err := s.get(ctx, pr, id, auth.RoleMember)
		if CodeOf(err) == CodeNotFound && idem.key != "" && checkID(id) == nil {
			// Gone since the first call, perhaps: its key says so in one of the caller's
			// organizations.
			for _, org := range pr.Organizations() {
				if inst, done, err := s.replayIn(ctx, pr, org, idem); done {
					return inst, err
				}
			}
		}
		if err != nil {
			return nil, err
		}
		if inst, done, err := s.replayIn(ctx, pr, cur.OrganizationID, idem); done {
			return inst, err
		}
		if cur.Deleting() {
			return cur, nil
		}
		if cur.DeletionProtection {
			var p problems
			p.add(CodeUnprocessable, path("id"), "instance %q has deletion protection: clear it with updateInstance(input: {id: %q, deletionProtection: false}), then delete it", id, id)
			return nil, p.err()
		}
		inst, status, changed := cur.MarkDeleting(s.now().UTC(), pr.Subject, "The instance's server is being deleted.")
		refusal, err := s.store.UpdateSpec(ctx, &inst, nil, nil, &status, changed, idem.record(cur.ID))
		if err != nil {
			return nil, internal("delete instance", err)
		}
		switch {
		case refusal != nil && refusal.Replayed != "":
			return s.replay(ctx, pr, idem, refusal.Replayed)
		case refusal == nil:
			inst.Generation++
			inst.StatusVersion++
			inst.Status = status
			s.enqueue(ctx, &inst)
			return &inst, nil
		case refusal.StatusStale, refusal.Stale:
			continue // re-read and decide again: it may even be deleting already
		default:
			return nil, s.updateRefused(refusal, id, false)
		}
	}
	return nil, Errorf(CodeConflict, "instance %q keeps changing; retry", id)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// truncate shortens input echoed in messages to about n bytes, cutting at a character
// boundary so the message stays valid UTF-8.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// EncodeUserData returns user data as the API shows it.
func EncodeUserData(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

// maxLease bounds how far ahead a lease may end: a decade, far beyond any use, near enough
// that a typo of a year is caught.
const maxLease = 10 * 365 * 24 * time.Hour

// checkLease checks a lease as a create or an update leaves it: expiresAt (nil: none) must
// be in the future, unless it is the current one (cur), which may have passed while the
// workers carry it out; action (nil: keep curAction, STOP for a new lease) needs a lease. It
// returns the lease to store.
func checkLease(p *problems, now time.Time, expiresAt *time.Time, action *ExpiryAction, cur *time.Time, curAction ExpiryAction) (*time.Time, ExpiryAction) {
	if expiresAt == nil {
		if action != nil {
			p.add(CodeUnprocessable, path("expiryAction"), "an expiry action needs a lease: set expiresAt too")
		}
		return nil, ""
	}
	at := expiresAt.UTC()
	if !equalTimes(&at, cur) {
		switch {
		case !at.After(now):
			p.add(CodeUnprocessable, path("expiresAt"), "the lease must end in the future, not at %s", at.Format(time.RFC3339))
		case at.Sub(now) > maxLease:
			p.add(CodeBadUserInput, path("expiresAt"), "a lease ends at most ten years ahead")
		}
	}
	a := cmp.Or(curAction, ExpireStop)
	if action != nil {
		a = *action
	}
	if a != ExpireStop && a != ExpireDelete {
		p.add(CodeBadUserInput, path("expiryAction"), "the expiry action is STOP or DELETE")
	}
	return &at, a
}
