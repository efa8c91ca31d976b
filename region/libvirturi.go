package region

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
)

// LibvirtURI is a libvirt connection URI as a libvirt region dials it.
type LibvirtURI struct {
	// Network and Address are what to dial: "unix" and a socket path, "tcp" and host:port,
	// or "ssh" and the SSH server's host:port, through which SSH's socket is reached.
	Network, Address string
	// Name is the URI the libvirt daemon is asked to open once connected, e.g. qemu:///system.
	Name string
	// SSH is how a qemu+ssh URI reaches the daemon; zero for the others.
	SSH LibvirtSSH
}

// LibvirtSSH is the SSH side of a qemu+ssh URI, with the parameters libvirt's own clients
// take. The daemon's socket is reached through the SSH connection (a stream-local forward,
// which OpenSSH's sshd allows by default), so the host needs no netcat and no shell.
type LibvirtSSH struct {
	// User logs in; "" is the user the process runs as, as libvirt's clients have it.
	User string
	// Socket is the daemon's socket on the host.
	Socket string
	// KeyFile is the private key to log in with (keyfile=); "" tries ~/.ssh/id_ed25519,
	// id_ecdsa and id_rsa.
	KeyFile string
	// KnownHosts holds the host's key (known_hosts=); "" is ~/.ssh/known_hosts. A host whose
	// key it does not hold is refused.
	KnownHosts string
}

// Defaults of libvirt's own clients: the system daemon's socket, its plain TCP port and SSH's.
const (
	libvirtSocket  = "/var/run/libvirt/libvirt-sock"
	libvirtTCPPort = "16509"
	sshPort        = "22"
)

// ParseLibvirtURI reads the URIs a libvirt region supports: qemu:///system and
// qemu+unix:///system (the local system daemon, optionally ?socket=/path/to/libvirt-sock), and
// qemu+tcp://host[:port]/system, and qemu+ssh://[user@]host[:port]/system (see LibvirtSSH). The
// session daemon (qemu:///session) is refused, since it cannot make the NAT networks instances
// need.
func ParseLibvirtURI(s string) (LibvirtURI, error) {
	if s == "" {
		return LibvirtURI{}, errors.New("uri is missing")
	}
	u, err := url.Parse(s)
	if err != nil {
		return LibvirtURI{}, fmt.Errorf("uri %q: %w", s, err)
	}
	if u.Path != "/system" {
		return LibvirtURI{}, fmt.Errorf("uri %q: want the system daemon (path /system): a session daemon cannot make networks", s)
	}
	name := "qemu:///system"
	switch u.Scheme {
	case "qemu", "qemu+unix":
		if u.Host != "" {
			return LibvirtURI{}, fmt.Errorf("uri %q: a local URI has no host; use qemu+tcp://%s/system", s, u.Host)
		}
		socket := libvirtSocket
		for k, v := range u.Query() {
			if k != "socket" || len(v) != 1 {
				return LibvirtURI{}, fmt.Errorf("uri %q: only the parameter socket is supported", s)
			}
			socket = v[0]
		}
		if !filepath.IsAbs(socket) {
			return LibvirtURI{}, fmt.Errorf("uri %q: socket %q is not an absolute path", s, socket)
		}
		return LibvirtURI{Network: "unix", Address: socket, Name: name}, nil
	case "qemu+ssh":
		return parseSSH(s, u)
	case "qemu+tcp":
		if u.Hostname() == "" {
			return LibvirtURI{}, fmt.Errorf("uri %q: qemu+tcp needs a host", s)
		}
		if u.RawQuery != "" {
			return LibvirtURI{}, fmt.Errorf("uri %q: parameters are not supported over tcp", s)
		}
		port := u.Port()
		if port == "" {
			port = libvirtTCPPort
		}
		return LibvirtURI{Network: "tcp", Address: net.JoinHostPort(u.Hostname(), port), Name: name}, nil
	}
	return LibvirtURI{}, fmt.Errorf("uri %q: scheme %q is not supported (want qemu, qemu+unix, qemu+tcp or qemu+ssh)", s, u.Scheme)
}

// parseSSH reads a qemu+ssh URI: qemu+ssh://[user@]host[:port]/system with the parameters
// socket, keyfile and known_hosts, each an absolute path.
func parseSSH(s string, u *url.URL) (LibvirtURI, error) {
	if u.Hostname() == "" {
		return LibvirtURI{}, fmt.Errorf("uri %q: qemu+ssh needs a host", s)
	}
	if _, set := u.User.Password(); set {
		return LibvirtURI{}, fmt.Errorf("uri %q: a password does not belong in the catalogue; log in with a key (keyfile=)", s)
	}
	ssh := LibvirtSSH{User: u.User.Username(), Socket: libvirtSocket}
	for k, v := range u.Query() {
		if len(v) != 1 {
			return LibvirtURI{}, fmt.Errorf("uri %q: parameter %s given %d times", s, k, len(v))
		}
		var field *string
		switch k {
		case "socket":
			field = &ssh.Socket
		case "keyfile":
			field = &ssh.KeyFile
		case "known_hosts":
			field = &ssh.KnownHosts
		default:
			return LibvirtURI{}, fmt.Errorf("uri %q: parameter %s is not supported over ssh (want socket, keyfile or known_hosts)", s, k)
		}
		if !filepath.IsAbs(v[0]) {
			return LibvirtURI{}, fmt.Errorf("uri %q: %s %q is not an absolute path", s, k, v[0])
		}
		*field = v[0]
	}
	port := u.Port()
	if port == "" {
		port = sshPort
	}
	return LibvirtURI{Network: "ssh", Address: net.JoinHostPort(u.Hostname(), port), Name: "qemu:///system", SSH: ssh}, nil
}
