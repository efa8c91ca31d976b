package openstack

import (
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/computeql/computeql/region"
)

// novaMetadataKey is what Nova takes as a metadata key.
var novaMetadataKey = regexp.MustCompile(`^[a-zA-Z0-9\-_:. ]{1,255}$`)

func TestTagKeyEncoding(t *testing.T) {
	for _, tc := range []struct{ tag, key string }{
		{"made/by", "compute:tag:made.2Fby"},
		{"plain-key_1", "compute:tag:plain-key_1"},
		{"a.b", "compute:tag:a.2Eb"},
		{"a:b c", "compute:tag:a.3Ab.20c"},
		{"a,b", "compute:tag:a.2Cb"},
		{"ü", "compute:tag:.C3.BC"},
	} {
		t.Run(tc.tag, func(t *testing.T) {
			key := encodeTagKey(tc.tag)
			if key != tc.key {
				t.Errorf("encodeTagKey(%q) = %q, want %q", tc.tag, key, tc.key)
			}
			if !novaMetadataKey.MatchString(key) {
				t.Errorf("%q is not a metadata key Nova takes", key)
			}
			if got, ok := decodeTagKey(key); !ok || got != tc.tag {
				t.Errorf("decodeTagKey(%q) = %q, %t; want %q", key, got, ok, tc.tag)
			}
		})
	}
	for _, key := range []string{"compute:org", "compute:tag:a.2", "compute:tag:a.ZZb", "compute:tag:.", "other:tag:x"} {
		if got, ok := decodeTagKey(key); ok {
			t.Errorf("decodeTagKey(%q) = %q, want no tag", key, got)
		}
	}
}

func fullSpec() region.ServerSpec {
	return region.ServerSpec{
		Scope: region.Scope{OrganizationID: "acme", ProjectID: "web", RegionID: "os", NetworkID: "os-web"},
		Name:  "web-1", FlavorID: "tiny", ImageID: "cirros", SSHCertificateAuthorityID: "ca-web",
		Networking: region.ServerNetworking{SecurityGroupIDs: []string{"ssh", "web"}, AllowedSourceAddresses: []string{"192.0.2.0/24", "10.0.0.0/8"},
			PublicIP: true},
		Tags: map[string]string{region.InstanceTag: "0d6f3b52-5a0e-4d4c-9c1e-6f8a2b3c4d5e", "made/by": "me, myself", "env": ""},
	}
}

func TestSpecRoundTrip(t *testing.T) {
	for name, spec := range map[string]region.ServerSpec{
		"everything": fullSpec(),
		"nothing optional": {
			Scope: region.Scope{OrganizationID: "o", ProjectID: "p", RegionID: "r", NetworkID: "n"}, FlavorID: "f", ImageID: "i",
			Tags: map[string]string{region.InstanceTag: "i-1"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			md, tags, desc, err := encodeSpec(spec)
			if err != nil {
				t.Fatalf("encodeSpec: %v", err)
			}
			for k, v := range md {
				if !novaMetadataKey.MatchString(k) || len(v) > maxMetadataLen {
					t.Errorf("metadata %q=%q is not what Nova takes", k, v)
				}
			}
			if want := []string{"instance-id=" + spec.Tags[region.InstanceTag]}; !slices.Equal(tags, want) {
				t.Errorf("Nova tags %v, want %v", tags, want)
			}
			for _, tag := range tags {
				if len(tag) > maxTagLen || strings.ContainsAny(tag, "/,") {
					t.Errorf("Nova tag %q is not one Nova takes", tag)
				}
			}
			got := decodeSpec(md)
			got.Name = spec.Name
			if got.Scope != spec.Scope || got.FlavorID != spec.FlavorID || got.ImageID != spec.ImageID ||
				got.SSHCertificateAuthorityID != spec.SSHCertificateAuthorityID || !maps.Equal(got.Tags, spec.Tags) ||
				!slices.Equal(got.Networking.SecurityGroupIDs, spec.Networking.SecurityGroupIDs) ||
				!slices.Equal(got.Networking.AllowedSourceAddresses, spec.Networking.AllowedSourceAddresses) ||
				got.Networking.PublicIP != spec.Networking.PublicIP {
				t.Errorf("decoded\n%+v\nwant\n%+v", got, spec)
			}
			scope, value, ok := decodeDescription(desc)
			if !ok || scope != spec.Scope || value != spec.Tags[region.InstanceTag] {
				t.Errorf("description %q decodes to %+v, %q, %t", desc, scope, value, ok)
			}
		})
	}
}

func TestNetworkingUpdateClears(t *testing.T) {
	md, _, _, err := encodeSpec(fullSpec())
	if err != nil {
		t.Fatal(err)
	}
	maps.Copy(md, encodeNetworking(region.ServerNetworking{}))
	if n := decodeSpec(md).Networking; n.SecurityGroupIDs != nil || n.AllowedSourceAddresses != nil || n.PublicIP {
		t.Errorf("after an update to no networking the metadata records %+v", n)
	}
}

func TestSpecRefused(t *testing.T) {
	for name, edit := range map[string]func(*region.ServerSpec){
		"no instance tag":             func(s *region.ServerSpec) { delete(s.Tags, region.InstanceTag) },
		"instance tag with a slash":   func(s *region.ServerSpec) { s.Tags[region.InstanceTag] = "a/b" },
		"instance tag with a comma":   func(s *region.ServerSpec) { s.Tags[region.InstanceTag] = "a,b" },
		"instance tag too long":       func(s *region.ServerSpec) { s.Tags[region.InstanceTag] = strings.Repeat("x", 49) },
		"tag value over 255":          func(s *region.ServerSpec) { s.Tags["note"] = strings.Repeat("x", 256) },
		"tag key over 255 as encoded": func(s *region.ServerSpec) { s.Tags[strings.Repeat("/", 90)] = "x" },
	} {
		t.Run(name, func(t *testing.T) {
			spec := fullSpec()
			edit(&spec)
			if _, _, _, err := encodeSpec(spec); err == nil || !strings.Contains(err.Error(), region.ErrRefused.Error()) {
				t.Errorf("encodeSpec: %v, want a refusal", err)
			}
		})
	}
	spec := fullSpec()
	spec.Tags[region.InstanceTag] = strings.Repeat("x", 48)
	if _, _, _, err := encodeSpec(spec); err != nil {
		t.Errorf("an instance tag of 48 characters, which fits Nova's 60 with its prefix: %v", err)
	}
}

func TestDescriptionOfAnotherServer(t *testing.T) {
	for _, desc := range []string{"", "a server someone made", "computeql acme/web/os i-1", "computeql acme/web/os/net"} {
		if scope, value, ok := decodeDescription(desc); ok {
			t.Errorf("decodeDescription(%q) = %+v, %q; want none", desc, scope, value)
		}
	}
}

func TestServerState(t *testing.T) {
	for _, tc := range []struct {
		status, task string
		power        int
		fault        string
		want         region.ServerState
		msg          string
	}{
		{"BUILD", "scheduling", 0, "", region.ServerBuilding, ""},
		{"BUILD", "spawning", 0, "", region.ServerBuilding, ""},
		{"BUILD", "", 0, "", region.ServerBuilding, ""},
		{"ACTIVE", "", 1, "", region.ServerRunning, ""},
		{"ACTIVE", "powering-off", 1, "", region.ServerStopping, ""},
		{"SHUTOFF", "", 4, "", region.ServerStopped, ""},
		{"SHUTOFF", "powering-on", 4, "", region.ServerStarting, ""},
		{"REBOOT", "reboot_started", 1, "", region.ServerRebooting, ""},
		{"HARD_REBOOT", "reboot_started_hard", 1, "", region.ServerRebooting, ""},
		{"REBOOT", "", 1, "", region.ServerRebooting, ""},
		{"ACTIVE", "rebooting", 1, "", region.ServerRebooting, ""},
		{"ACTIVE", "deleting", 1, "", region.ServerDeleting, ""},
		{"SHUTOFF", "deleting", 4, "", region.ServerDeleting, ""},
		{"DELETED", "", 0, "", region.ServerDeleting, ""},
		{"SOFT_DELETED", "", 4, "", region.ServerDeleting, ""},
		{"ERROR", "", 0, "No valid host was found.", region.ServerError, "No valid host was found."},
		{"ERROR", "deleting", 0, "boom", region.ServerError, "boom"},
		{"ERROR", "", 0, "", region.ServerError, "the cloud reports the server in error"},
		{"UNKNOWN", "", 0, "", region.ServerError, "the cloud has lost track of the server"},
		{"RESIZE", "resize_prep", 4, "", region.ServerStopped, ""},
		{"VERIFY_RESIZE", "", 4, "", region.ServerStopped, ""},
		{"MIGRATING", "migrating", 1, "", region.ServerRunning, ""},
		{"PAUSED", "", 3, "", region.ServerStopped, ""},
	} {
		got, msg := serverState(tc.status, tc.task, tc.power, tc.fault)
		if got != tc.want || msg != tc.msg {
			t.Errorf("status %s, task %q, power %d: %s %q, want %s %q", tc.status, tc.task, tc.power, got, msg, tc.want, tc.msg)
		}
	}
}
