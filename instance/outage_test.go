package instance_test

import (
	"testing"

	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/redistest"
	"github.com/computeql/computeql/region"
)

// TestStoreOutageIsUnavailable: with Redis gone, every operation that needs the store fails
// with UNAVAILABLE, which tells a caller to retry, not with INTERNAL, which tells it the
// request is broken.
func TestStoreOutageIsUnavailable(t *testing.T) {
	srv, err := redistest.Start()
	if err != nil {
		t.Fatal(err)
	}
	e := serviceOn(t, srv.Client(t), region.Demo())
	inst := e.create(t, acmeMember, validCreate())
	srv.Stop()

	second := validCreate()
	second.Name = "web-2"
	desc := "changed"
	tests := []struct {
		name string
		call func() error
	}{
		{"create", func() error { _, err := e.svc.Create(acmeMember, second); return err }},
		{"get", func() error { _, err := e.svc.Get(acmeMember, inst.ID); return err }},
		{"list", func() error {
			_, err := e.svc.List(acmeMember, instance.ListRequest{OrganizationID: "acme"})
			return err
		}},
		{"update", func() error {
			_, err := e.svc.Update(acmeMember, instance.UpdateRequest{ID: inst.ID, Description: &desc})
			return err
		}},
		{"delete", func() error { _, err := e.svc.Delete(acmeMember, inst.ID); return err }},
		{"quota", func() error { _, err := e.svc.Quota(acmeMember, "acme"); return err }},
	}
	for _, tt := range tests {
		if got := instance.CodeOf(tt.call()); got != instance.CodeUnavailable {
			t.Errorf("%s with Redis gone: %s, want UNAVAILABLE", tt.name, got)
		}
	}
}
