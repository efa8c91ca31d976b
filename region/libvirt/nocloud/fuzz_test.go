package nocloud

import (
	"bytes"
	"errors"
	"testing"

	"github.com/goccy/go-yaml"
)

// FuzzSeed: whatever the user data, host name and instance ID, ISO either refuses the seed
// with ErrInvalid or returns a whole number of sectors that reads back to the same files,
// with a meta-data that is valid YAML holding exactly the given names.
func FuzzSeed(f *testing.F) {
	f.Add([]byte("#cloud-config\n{}\n"), "web-1", "i-1")
	f.Add([]byte{}, "", "")
	f.Add(bytes.Repeat([]byte{0xff}, 2049), "h\u2028\"\\", "i\x00")
	f.Add([]byte("#!/bin/sh\n"), "höst\u0085", "ïd\ufeff")
	f.Fuzz(func(t *testing.T, userData []byte, hostname, instanceID string) {
		s := Seed{InstanceID: instanceID, Hostname: hostname, UserData: userData, AuthorizedKeys: []string{testKey(t, 1, hostname)}}
		img, err := s.ISO()
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		if len(img)%sectorSize != 0 {
			t.Fatalf("image of %d bytes", len(img))
		}
		p, err := readISO(img)
		if err != nil {
			t.Fatal(err)
		}
		wantUser := userData
		if len(wantUser) == 0 {
			wantUser = []byte(emptyCloudConfig)
		}
		if !bytes.Equal(p.rockRidge.files["user-data"], wantUser) || !bytes.Equal(p.joliet.files["user-data"], wantUser) {
			t.Fatal("user-data does not read back")
		}
		var meta struct {
			InstanceID    string   `yaml:"instance-id"`
			LocalHostname string   `yaml:"local-hostname"`
			PublicKeys    []string `yaml:"public-keys"`
		}
		if err := yaml.Unmarshal(p.rockRidge.files["meta-data"], &meta); err != nil {
			t.Fatalf("meta-data is not valid YAML: %v\n%s", err, p.rockRidge.files["meta-data"])
		}
		if meta.InstanceID != instanceID || meta.LocalHostname != hostname || len(meta.PublicKeys) != 1 || meta.PublicKeys[0] != s.AuthorizedKeys[0] {
			t.Fatalf("meta-data reads back as %+v", meta)
		}
	})
}
