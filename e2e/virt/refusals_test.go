package virt

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/computeql/computeql/virttest"
)

// TestLibvirtRefusals checks what a libvirt region cannot do, without booting a guest: what
// its hosts can never give is refused at create with UNPROCESSABLE on the field that asks for
// it; a flavor larger than the host is accepted and waits, saying what is short; an image
// whose volume is missing makes the instance ERROR, naming the volume, and leaves nothing on
// the host.
func TestLibvirtRefusals(t *testing.T) {
	t.Parallel()
	host := virttest.Start(t, virttest.Options{})
	const missingVolume = "missing-base.qcow2"
	catalog := writeCatalog(t, host, catalogue{
		flavors: []map[string]any{
			flavor("small", 1, 1, 2, nil),
			flavor("gpu", 1, 1, 2, func(f map[string]any) {
				f["gpu"] = map[string]any{"vendor": "NVIDIA", "model": "A100", "memoryGiB": 80, "physicalCount": 1}
			}),
			flavor("metal", 1, 1, 2, func(f map[string]any) { f["baremetal"] = true }),
			// No host has 4 TiB of memory; the quota has room for it.
			flavor("huge", 1, 4096, 2, nil),
		},
		images: []map[string]any{
			// Never booted here: only its volume's absence matters. Virtualization "any", so
			// the bare-metal flavor's refusal is the region's, not the image's.
			image("gone", 1, map[string]any{"volume": missingVolume}),
		},
	})
	lab := deploy(t, catalog)
	lv := inspect(t, host)
	f := lab.follow(t)
	ctx := context.Background()

	for _, tc := range []struct {
		name  string
		input map[string]any
		field []string
	}{
		{"a public IP", map[string]any{"flavorId": "small", "networking": map[string]any{"publicIP": true}},
			[]string{"input", "networking", "publicIP"}},
		{"a GPU flavor", map[string]any{"flavorId": "gpu"}, []string{"input", "flavorId"}},
		{"a bare-metal flavor", map[string]any{"flavorId": "metal"}, []string{"input", "flavorId"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := map[string]any{"name": "refused", "imageId": "gone"}
			for k, v := range tc.input {
				in[k] = v
			}
			id, errs := lab.create(ctx, t, in)
			if id != "" {
				t.Fatalf("createInstance accepted it as %s", id)
			}
			if len(errs) != 1 || errs[0].Code != "UNPROCESSABLE" || !slices.Equal(errs[0].Field, tc.field) {
				t.Fatalf("userErrors %+v, want one UNPROCESSABLE on %q", errs, tc.field)
			}
			if !strings.Contains(errs[0].Message, `"lab"`) {
				t.Errorf("message %q does not name the region", errs[0].Message)
			}
		})
	}

	var huge, broken string
	step(t, "a flavor larger than the host waits for capacity", func(t *testing.T) {
		huge = lab.mustCreate(ctx, t, map[string]any{"name": "huge", "flavorId": "huge", "imageId": "gone"})
		ev := f.until(t, stepLimit, "a NoCapacity condition", of(huge, func(ev event) bool { return hasReason(ev.Instance, "NoCapacity") }))
		checkNoCapacity(t, ev.Instance)
		t.Logf("waiting: %s", ev.Instance)
		if doms := lv.domains(t); len(doms) > 0 {
			t.Errorf("domains defined for a server that does not fit: %v", names(doms))
		}
	})

	step(t, "an image whose volume is missing", func(t *testing.T) {
		broken = lab.mustCreate(ctx, t, map[string]any{"name": "no-volume", "flavorId": "small", "imageId": "gone"})
		ev := f.until(t, stepLimit, "ERROR", of(broken, func(ev event) bool { return ev.Instance.Status.ProvisioningStatus == "ERROR" }))
		named := false
		for _, c := range ev.Instance.Status.Conditions {
			named = named || strings.Contains(c.Message, missingVolume)
		}
		if !named {
			t.Errorf("no condition names the missing volume %q: %s", missingVolume, ev.Instance)
		}
		t.Logf("failed: %s", ev.Instance)
		if vols := lv.serverVolumes(t); len(vols) > 0 {
			t.Errorf("volumes left in pool %s: %v", poolName, vols)
		}
		// The address was reserved before the volume was looked for: it must be released.
		if res := lv.reservations(t); len(res) > 0 {
			t.Errorf("DHCP reservations left in network %s: %v", libvirtNetwork, res)
		}
	})

	step(t, "still waiting for capacity", func(t *testing.T) {
		// Retried meanwhile (every 15 s) or not, it is no closer to fitting.
		checkNoCapacity(t, lab.get(ctx, t, huge))
	})

	step(t, "deleting them leaves nothing behind", func(t *testing.T) {
		for _, id := range []string{huge, broken} {
			lab.verb(ctx, t, "deleteInstance", id, nil)
		}
		gone := map[string]bool{}
		f.until(t, stepLimit, "both DELETED", func(ev event) bool {
			if ev.Kind == "DELETED" {
				gone[ev.Instance.ID] = true
			}
			return gone[huge] && gone[broken]
		})
		// The failed server's domain only recorded why it failed; it goes with its instance.
		if doms := lv.domains(t); len(doms) > 0 {
			t.Errorf("domains left on the host: %v", names(doms))
		}
		for kind, used := range lab.quotaUsed(ctx, t) {
			if used != 0 {
				t.Errorf("quota %s: %d in use after the deletes, want 0", kind, used)
			}
		}
	})
}

func hasReason(inst instance, reason string) bool {
	return slices.ContainsFunc(inst.Status.Conditions, func(c condition) bool { return c.Reason == reason })
}

// checkNoCapacity checks an instance of flavor huge waits, saying the host lacks memory for it.
func checkNoCapacity(t *testing.T, inst instance) {
	t.Helper()
	if inst.Status.ProvisioningStatus != "PROVISIONING" {
		t.Errorf("%s: provisioning status %s, want PROVISIONING", inst.Name, inst.Status.ProvisioningStatus)
	}
	for _, c := range inst.Status.Conditions {
		if c.Reason == "NoCapacity" && !(strings.Contains(c.Message, "memory") && strings.Contains(c.Message, "huge")) {
			t.Errorf("%s: NoCapacity message %q does not say that memory is short for flavor huge", inst.Name, c.Message)
		}
	}
	if !hasReason(inst, "NoCapacity") {
		t.Errorf("%s: no NoCapacity condition", inst)
	}
}
