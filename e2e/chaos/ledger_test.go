package chaos

import (
	"strings"
	"testing"
	"time"

	"github.com/computeql/computeql/instance"
)

func TestLedgerCheck(t *testing.T) {
	ref := Ref{"acme", "web", "net-acme-web-eu", "vm-1"}
	a := Spec{Description: "vm-1 op 1", FlavorID: "g1.small"}
	b := Spec{Description: "vm-1 op 2", FlavorID: "g1.medium", PublicIP: true}
	stored := func(s Spec) []*instance.Instance {
		return []*instance.Instance{{ID: "i1", OrganizationID: "acme", ProjectID: "web", Spec: instance.Spec{
			Name: "vm-1", NetworkID: "net-acme-web-eu", Description: s.Description, FlavorID: s.FlavorID, Networking: instance.Networking{PublicIP: s.PublicIP}}}}
	}
	absent := []*instance.Instance(nil)
	kill := t0.Add(10 * time.Second)
	everysec := func(at time.Time) bool { return !at.Before(kill.Add(-everysecLoss)) && !at.After(kill) }
	create := func(o Outcome, at time.Time) Op { return Op{Kind: OpCreate, Outcome: o, At: at, Spec: a} }
	update := func(o Outcome, at time.Time) Op { return Op{Kind: OpUpdate, Outcome: o, At: at, Spec: b} }
	del := func(o Outcome, at time.Time) Op { return Op{Kind: OpDelete, Outcome: o, At: at} }
	resize := func(o Outcome, at time.Time) Op {
		return Op{Kind: OpResize, Outcome: o, At: at, Spec: Spec{FlavorID: "g1.medium"}}
	}
	aResized := Spec{Description: a.Description, FlavorID: "g1.medium"}
	for _, tc := range []struct {
		name   string
		ops    []Op
		stored []*instance.Instance
		lost   func(time.Time) bool
		want   string // "" for no violation
	}{
		{"acked create present", []Op{create(Acked, t0)}, stored(a), nil, ""},
		{"acked create missing", []Op{create(Acked, t0)}, absent, nil, "the store holds absent"},
		{"acked update applied", []Op{create(Acked, t0), update(Acked, t0)}, stored(b), nil, ""},
		{"acked update lost", []Op{create(Acked, t0), update(Acked, t0)}, stored(a), nil, "the store holds {Description:vm-1 op 1"},
		{"acked delete done", []Op{create(Acked, t0), del(Acked, t0)}, absent, nil, ""},
		{"acked delete undone", []Op{create(Acked, t0), del(Acked, t0)}, stored(a), nil, "the store holds {Description:vm-1 op 1"},
		{"refused update changes nothing", []Op{create(Acked, t0), update(Refused, t0)}, stored(a), nil, ""},
		{"refused update applied anyway", []Op{create(Acked, t0), update(Refused, t0)}, stored(b), nil, "may hold only"},
		{"unknown update, applied", []Op{create(Acked, t0), update(Unknown, t0)}, stored(b), nil, ""},
		{"unknown update, not applied", []Op{create(Acked, t0), update(Unknown, t0)}, stored(a), nil, ""},
		{"unknown create, absent", []Op{create(Unknown, t0)}, absent, nil, ""},
		{"unknown create, present", []Op{create(Unknown, t0)}, stored(a), nil, ""},
		{"unknown delete then acked update", []Op{create(Acked, t0), del(Unknown, t0), update(Acked, t0)}, absent, nil, "the store holds absent"},
		{"not found after an acked create", []Op{create(Acked, t0), update(NotFound, t0)}, absent, nil, "answered NOT_FOUND, but"},
		{"acked resize applied", []Op{create(Acked, t0), resize(Acked, t0)}, stored(aResized), nil, ""},
		{"acked resize lost", []Op{create(Acked, t0), resize(Acked, t0)}, stored(a), nil, "may hold only"},
		{"refused resize changes nothing", []Op{create(Acked, t0), resize(Refused, t0)}, stored(a), nil, ""},
		{"unknown resize, applied", []Op{create(Acked, t0), resize(Unknown, t0)}, stored(aResized), nil, ""},
		{"unknown resize, not applied", []Op{create(Acked, t0), resize(Unknown, t0)}, stored(a), nil, ""},
		{"resize after an unknown update keeps either", []Op{create(Acked, t0), update(Unknown, t0), resize(Acked, t0)}, stored(b), nil, ""},
		{"acked resize of what cannot exist", []Op{create(Acked, t0), del(Acked, t0), resize(Acked, t0)}, absent, nil, "cannot exist"},
		{"unknown create retried with its key", []Op{create(Unknown, t0), create(Acked, t0)}, stored(a), nil, ""},
		{"still being deleted", []Op{create(Acked, t0), del(Acked, t0)}, func() []*instance.Instance {
			s := stored(a)
			s[0].DeletedAt = &t0
			return s
		}(), nil, "is still being deleted"},
		{"everysec: create acked just before the kill lost", []Op{create(Acked, kill.Add(-time.Second))}, absent, everysec, ""},
		{"everysec: lost create, then NOT_FOUND", []Op{create(Acked, kill.Add(-time.Second)), update(NotFound, kill.Add(time.Minute))}, absent, everysec, ""},
		{"everysec: create acked long before the kill lost", []Op{create(Acked, kill.Add(-3*time.Second))}, absent, everysec, "the store holds absent"},
		{"everysec: update after the restart lost", []Op{create(Acked, t0), update(Acked, kill.Add(time.Second))}, stored(a), everysec, "may hold only"},
		{"always: create acked just before the kill lost", []Op{create(Acked, kill.Add(-time.Second))}, absent, nil, "the store holds absent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLedger()
			for _, op := range tc.ops {
				l.Record(ref, "i1", op)
			}
			v := l.Check(tc.stored, tc.lost)
			switch {
			case tc.want == "" && len(v) > 0:
				t.Fatalf("violations:\n%s", summarize(v))
			case tc.want != "" && !strings.Contains(summarize(v), tc.want):
				t.Fatalf("violations:\n%s\nwant one saying %q", summarize(v), tc.want)
			}
		})
	}
}

func TestLedgerCheckWrongID(t *testing.T) {
	l := NewLedger()
	spec := Spec{Description: "d", FlavorID: "g1.small"}
	l.Record(Ref{"acme", "web", "net-acme-web-eu", "vm-1"}, "i1", Op{Kind: OpCreate, Outcome: Acked, At: t0, Spec: spec})
	other := &instance.Instance{ID: "i2", OrganizationID: "acme", ProjectID: "web", Spec: instance.Spec{Name: "vm-1", NetworkID: "net-acme-web-eu", Description: "d", FlavorID: "g1.small"}}
	if v := l.Check([]*instance.Instance{other}, nil); !strings.Contains(summarize(v), "the store holds id i2, the create acknowledged i1") {
		t.Fatalf("violations:\n%s", summarize(v))
	}
}
