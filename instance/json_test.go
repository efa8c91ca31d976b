package instance

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/computeql/computeql/quota"
)

// tricky is a string every escape of encoding/json's applies to.
const tricky = "a\"b\\c/<d>&e\n\r\t\b\f\x01\x1f é \u2028\u2029 \xff\xc3 中"

// fullSpec sets every field of a Spec, so that a field added to Spec and left out of its
// AppendJSON fails TestAppendJSONIsEncodingJSONs (which checks that none is zero).
func fullSpec() Spec {
	at := time.Date(2026, 11, 27, 12, 30, 0, 123456789, time.FixedZone("x", 5*3600+1800))
	deleted := at.Add(time.Hour).UTC()
	return Spec{
		Name: "web-1", Description: tricky, Tags: []Tag{{Name: "env", Value: tricky}, {Name: "<", Value: ""}},
		RegionID: "r", NetworkID: "n", FlavorID: "f", ImageID: "i", SSHCertificateAuthorityID: "ca",
		Networking: Networking{SecurityGroupIDs: []string{"sg-1", tricky}, PublicIP: true, AllowedSourceAddresses: []string{"10.0.0.0/8"}},
		UserData:   []byte("#cloud-config\x00\xff"), SSHPublicKeys: []string{"ssh-ed25519 AAAA x"},
		RebuildGeneration: 3, ResizeGeneration: -4, ResizeRestart: true, DeletionProtection: true,
		ExpiresAt: &at, ExpiryAction: ExpiryAction("DELETE"), Power: PowerIntent("STOPPED"),
		Charge:    quota.Amounts{quota.Kind("servers"): 1, quota.Kind("cpus"): 2, quota.Kind("memoryGiB"): -8},
		CreatedAt: at, CreatedBy: tricky, UpdatedAt: at.UTC(), UpdatedBy: "u", DeletedAt: &deleted,
	}
}

func fullStatus() Status {
	return Status{
		ProvisioningStatus: ProvisioningStatus("PROVISIONED"), HealthStatus: HealthStatus("HEALTHY"), PowerState: PowerState("RUNNING"),
		PrivateIP: "10.0.0.2", PublicIP: "203.0.113.9", MACAddress: "52:54:00:00:00:01",
		Conditions: []Condition{
			{Type: "Available", Status: ConditionStatus("True"), Reason: tricky, Message: "m", LastTransitionTime: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)},
			{Type: "Ready", LastTransitionTime: time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("y", -7*3600))},
		},
		ObservedGeneration: 7,
	}
}

// checkAllSet fails for a zero field of v, a struct, or of the structs it holds.
func checkAllSet(t *testing.T, v reflect.Value) {
	t.Helper()
	for i := range v.NumField() {
		f := v.Field(i)
		if f.IsZero() {
			t.Errorf("%s.%s is zero: set it in the test's full value", v.Type().Name(), v.Type().Field(i).Name)
		}
		if f.Kind() == reflect.Struct && f.Type().PkgPath() == v.Type().PkgPath() {
			checkAllSet(t, f)
		}
	}
}

// TestAppendJSONIsEncodingJSONs: Spec and Status append the bytes encoding/json encodes them
// to, with every field set, with none, and with the edges of omitempty.
func TestAppendJSONIsEncodingJSONs(t *testing.T) {
	checkAllSet(t, reflect.ValueOf(fullSpec()))
	checkAllSet(t, reflect.ValueOf(fullStatus()))
	emptySlices := Spec{Tags: []Tag{}, SSHPublicKeys: []string{}, UserData: []byte{}, Charge: quota.Amounts{},
		Networking: Networking{SecurityGroupIDs: []string{}}}
	type appender interface{ AppendJSON([]byte) ([]byte, error) }
	for name, v := range map[string]appender{
		"full spec": new(fullSpec()), "zero spec": &Spec{}, "empty slices and map": &emptySlices,
		"full status": new(fullStatus()), "zero status": &Status{}, "status without conditions": &Status{Conditions: []Condition{}},
	} {
		want, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		got, err := v.AppendJSON([]byte("prefix"))
		if err != nil || string(got) != "prefix"+string(want) {
			t.Errorf("%s: AppendJSON = %s, %v\nwant prefix%s", name, got, err, want)
		}
	}
}

// A time encoding/json cannot encode (a year past 9999) is the same error, not bytes.
func TestAppendJSONRefusesWhatEncodingJSONRefuses(t *testing.T) {
	far := time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
	for name, v := range map[string]interface {
		AppendJSON([]byte) ([]byte, error)
	}{
		"spec":   &Spec{CreatedAt: far},
		"status": &Status{Conditions: []Condition{{LastTransitionTime: far}}},
	} {
		if _, err := json.Marshal(v); err == nil {
			t.Fatalf("%s: encoding/json encodes year 10000", name)
		}
		if _, err := v.AppendJSON(nil); err == nil {
			t.Errorf("%s: AppendJSON of year 10000: no error", name)
		}
	}
}
