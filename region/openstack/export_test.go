package openstack

import "testing"

// GuestParts splits the user data Nova was given as cloud-init would: the user's own part, the
// SSH keys of the driver's cloud-config, and the CA keys file it writes ("" for none).
func GuestParts(t *testing.T, data []byte) (user []byte, keys []string, caKeys string) {
	t.Helper()
	parts := splitMIME(t, data)
	if len(parts) == 0 {
		t.Fatalf("user data %q has no parts", data)
	}
	if len(parts) == 2 {
		user = parts[0].body
	}
	c := parseSSHConfig(t, parts[len(parts)-1])
	for _, f := range c.WriteFiles {
		if f["path"] == caKeysPath {
			caKeys = f["content"]
		}
	}
	return user, c.Keys, caKeys
}
