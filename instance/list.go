package instance

import (
	"context"
	"encoding/base64"
	"slices"
	"strings"

	"github.com/computeql/computeql/auth"
)

// Page sizes of instance listings.
const (
	DefaultPageSize = 20
	MaxPageSize     = 100
	// scanBatch is how many instances a filtered listing reads from the store per round trip.
	scanBatch = 200
)

// Filter narrows a listing; every field given must match.
type Filter struct {
	ProjectID          *string
	Region             *string
	NetworkID          *string
	Name               *string
	NameContains       *string
	Tags               []Tag
	ProvisioningStatus []ProvisioningStatus
	PowerState         []PowerState
}

// ListRequest asks for one page of an organization's instances.
type ListRequest struct {
	OrganizationID string
	Filter         *Filter
	First          *int
	After          *string
	// WantTotal asks for the number of matches in all pages, which can mean reading them all.
	WantTotal bool
}

// Page is one page of a listing.
type Page struct {
	Instances   []*Instance
	HasNextPage bool
	// TotalCount is set when asked for.
	TotalCount int
}

// Cursor returns the opaque cursor of a listed instance.
func Cursor(inst *Instance) string {
	return base64.RawURLEncoding.EncodeToString([]byte("i1:" + inst.ID))
}

// decodeCursor accepts only cursors as Cursor writes them: the base64 decoder alone also
// reads them with line breaks or stray low bits, and checkID also takes upper-case ids, which
// sort before every stored one and would restart the listing.
func decodeCursor(c string) (string, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	id, ok := strings.CutPrefix(string(b), "i1:")
	if err != nil || !ok || checkID(id) != nil || id != strings.ToLower(id) || base64.RawURLEncoding.EncodeToString(b) != c {
		return "", Errorf(CodeBadUserInput, "after: %q is not a cursor of this listing", truncate(c, 64))
	}
	return id, nil
}

// List returns a page of the organization's instances the caller may read, oldest first.
func (s *Service) List(ctx context.Context, req ListRequest) (*Page, error) {
	pr, err := Principal(ctx)
	if err != nil {
		return nil, err
	}
	org := req.OrganizationID
	if !pr.SeesOrganization(org) {
		return nil, Errorf(CodeNotFound, "organization %q not found", org)
	}
	first := DefaultPageSize
	if req.First != nil {
		first = *req.First
	}
	if first < 1 || first > MaxPageSize {
		return nil, Errorf(CodeBadUserInput, "first must be between 1 and %d", MaxPageSize)
	}
	after := ""
	if req.After != nil && *req.After != "" {
		if after, err = decodeCursor(*req.After); err != nil {
			return nil, err
		}
	}
	f := req.Filter
	if f == nil {
		f = &Filter{}
	}
	// GraphQL accepts enum values in variables regardless of case but binds only exact ones,
	// so "pending" arrives as an empty value; it must not silently match nothing.
	for _, s := range f.ProvisioningStatus {
		if !s.Valid() {
			return nil, Errorf(CodeBadUserInput, "filter.provisioningStatus: unknown value (values are upper case, e.g. PENDING)")
		}
	}
	for _, s := range f.PowerState {
		if !s.Valid() {
			return nil, Errorf(CodeBadUserInput, "filter.powerState: unknown value (values are upper case, e.g. RUNNING)")
		}
	}
	project := deref(f.ProjectID)
	if project != "" && !pr.Allows(org, project, auth.RoleViewer) {
		return nil, Errorf(CodeNotFound, "project %q not found", project)
	}
	// When the caller reads the whole scope and nothing else narrows it, the store counts
	// without reading every instance.
	unfiltered := f.Region == nil && f.NetworkID == nil && f.Name == nil && f.NameContains == nil &&
		len(f.Tags) == 0 && len(f.ProvisioningStatus) == 0 && len(f.PowerState) == 0 &&
		pr.Allows(org, project, auth.RoleViewer)

	page := &Page{}
	batch := first + 1
	if !unfiltered {
		batch = scanBatch
	}
	for cursor := after; ; {
		insts, err := s.store.List(ctx, org, project, cursor, batch)
		if err != nil {
			return nil, internal("list instances", err)
		}
		for _, inst := range insts {
			if !pr.Allows(org, inst.ProjectID, auth.RoleViewer) {
				continue
			}
			ok, err := f.matches(ctx, inst)
			if err != nil {
				return nil, err
			}
			if !ok {
				continue
			}
			if len(page.Instances) < first {
				page.Instances = append(page.Instances, inst)
			} else {
				page.HasNextPage = true
			}
		}
		// The total, when asked for, is counted by its own scan from the start; reading past
		// the page here would only read instances that are then thrown away.
		if len(insts) < batch || page.HasNextPage {
			break
		}
		cursor = insts[len(insts)-1].ID
	}
	if req.WantTotal {
		if page.TotalCount, err = s.count(ctx, pr, org, project, f, unfiltered); err != nil {
			return nil, err
		}
	}
	return page, nil
}

func (s *Service) count(ctx context.Context, pr auth.Principal, org, project string, f *Filter, unfiltered bool) (int, error) {
	if unfiltered {
		n, err := s.store.Count(ctx, org, project)
		if err != nil {
			return 0, internal("count instances", err)
		}
		return n, nil
	}
	n := 0
	for cursor := ""; ; {
		insts, err := s.store.List(ctx, org, project, cursor, scanBatch)
		if err != nil {
			return 0, internal("count instances", err)
		}
		for _, inst := range insts {
			if !pr.Allows(org, inst.ProjectID, auth.RoleViewer) {
				continue
			}
			ok, err := f.matches(ctx, inst)
			if err != nil {
				return 0, err
			}
			if ok {
				n++
			}
		}
		if len(insts) < scanBatch {
			return n, nil
		}
		cursor = insts[len(insts)-1].ID
	}
}

func (f *Filter) matches(ctx context.Context, inst *Instance) (bool, error) {
	switch {
	case f.ProjectID != nil && *f.ProjectID != inst.ProjectID,
		f.Region != nil && *f.Region != inst.RegionID,
		f.NetworkID != nil && *f.NetworkID != inst.NetworkID,
		f.Name != nil && *f.Name != inst.Name,
		f.NameContains != nil && !strings.Contains(strings.ToLower(inst.Name), strings.ToLower(*f.NameContains)),
		len(f.ProvisioningStatus) > 0 && !slices.Contains(f.ProvisioningStatus, inst.Status.ProvisioningStatus),
		len(f.PowerState) > 0 && !slices.Contains(f.PowerState, inst.Status.PowerState):
		return false, nil
	}
	if len(f.Tags) == 0 {
		return true, nil
	}
	// Tags are read only for instances that match everything else.
	l, err := inst.Large(ctx, FieldTags)
	if err != nil {
		return false, err
	}
	for _, want := range f.Tags {
		if !slices.Contains(l.Tags, want) {
			return false, nil
		}
	}
	return true, nil
}
