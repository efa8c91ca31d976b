package libvirt

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/libvirt/dial"
	"github.com/computeql/computeql/virttest"
)

// The SSH login of a qemu+ssh URI: with the right key and the host's key known, the daemon
// answers through it; a host whose key is not known, or a key the host does not accept, is
// refused before anything is sent to a daemon.
func TestLibvirtSSHLogin(t *testing.T) {
	host := virttest.Start(t, virttest.Options{})
	through := host.SSH(t)
	uri, err := region.ParseLibvirtURI(through.URI)
	if err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(t.TempDir(), "known_hosts")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(*region.LibvirtSSH)
		want string // "" for a login that reaches the daemon
	}{
		{"known host, accepted key", func(*region.LibvirtSSH) {}, ""},
		{"unknown host key", func(s *region.LibvirtSSH) { s.KnownHosts = empty }, "knownhosts: key is unknown"},
		{"key the host does not accept", func(s *region.LibvirtSSH) { s.KeyFile = filepath.Join(filepath.Dir(through.KeyFile), "host_ed25519") },
			"unable to authenticate"},
		{"no such socket on the host", func(s *region.LibvirtSSH) { s.Socket = "/nonexistent/libvirt-sock" }, "open the daemon's socket"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := uri.SSH
			tc.edit(&cfg)
			cut := &dial.CutDialer{Network: "tcp", Address: uri.Address, Timeout: 5 * time.Second, Through: sshThrough(cfg, uri.Address, 5*time.Second)}
			conn := golibvirt.NewWithDialer(cut)
			err := conn.ConnectToURI(golibvirt.ConnectURI(uri.Name))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("connect: %v", err)
				}
				defer func() { _ = conn.Disconnect() }()
				if _, err := conn.ConnectGetLibVersion(); err != nil {
					t.Errorf("the daemon did not answer through SSH: %v", err)
				}
				return
			}
			cut.Cut()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("connect: %v, want an error with %q", err, tc.want)
			}
		})
	}
}
