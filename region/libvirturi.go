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
	// Network and Address are what to dial: "unix" and a socket path, or "tcp" and host:port.
	Network, Address string
	// Name is the URI the libvirt daemon is asked to open once connected, e.g. qemu:///system.
	Name string
}

// Defaults of libvirt's own clients: the system daemon's socket and its plain TCP port.
const (
	libvirtSocket  = "/var/run/libvirt/libvirt-sock"
	libvirtTCPPort = "16509"
)

// ParseLibvirtURI reads the URIs a libvirt region supports: qemu:///system and
// qemu+unix:///system (the local system daemon, optionally ?socket=/path/to/libvirt-sock), and
// qemu+tcp://host[:port]/system. The session daemon (qemu:///session) is refused, since it
// cannot make the NAT networks instances need; so is ssh, which this driver does not speak.
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
	return LibvirtURI{}, fmt.Errorf("uri %q: scheme %q is not supported (want qemu, qemu+unix or qemu+tcp)", s, u.Scheme)
}
