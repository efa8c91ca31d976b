package libvirt

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/computeql/computeql/region"
)

// sshThrough returns how to reach a host's daemon through an SSH connection to host address:
// log in with the key, the host's key checked against known hosts, and open the daemon's socket
// on the host. The key and the known hosts are read at each dial, so that a key rotated on disk
// is used from the next connection on.
func sshThrough(cfg region.LibvirtSSH, address string, timeout time.Duration) func(net.Conn) (net.Conn, error) {
	return func(c net.Conn) (net.Conn, error) {
		config, err := sshConfig(cfg, timeout)
		if err != nil {
			return nil, err
		}
		config.HostKeyAlgorithms = knownAlgorithms(config.HostKeyCallback, address, c.RemoteAddr())
		// The handshake has no deadline of its own: a server that accepts and says nothing
		// would hold it for ever.
		if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
			return nil, err
		}
		conn, chans, reqs, err := ssh.NewClientConn(c, address, config)
		if err != nil {
			return nil, fmt.Errorf("ssh %s: %w", address, err)
		}
		if err := c.SetDeadline(time.Time{}); err != nil {
			return nil, err
		}
		client := ssh.NewClient(conn, chans, reqs)
		stream, err := client.Dial("unix", cfg.Socket)
		if err != nil {
			client.Close()
			return nil, fmt.Errorf("ssh %s: open the daemon's socket %s: %w", address, cfg.Socket, err)
		}
		return &sshStream{Conn: stream, client: client}, nil
	}
}

// sshStream is the daemon's socket through SSH; closing it closes the SSH connection too.
type sshStream struct {
	net.Conn
	client *ssh.Client
}

func (s *sshStream) Close() error { return errors.Join(s.Conn.Close(), s.client.Close()) }

// sshConfig is the login of cfg: its user (else the process's), its key file (else the first of
// ~/.ssh/id_ed25519, id_ecdsa, id_rsa), and its known hosts (else ~/.ssh/known_hosts).
func sshConfig(cfg region.LibvirtSSH, timeout time.Duration) (*ssh.ClientConfig, error) {
	home, _ := os.UserHomeDir()
	name := cfg.User
	if name == "" {
		u, err := user.Current()
		if err != nil {
			return nil, fmt.Errorf("ssh: the user to log in as: %w", err)
		}
		name = u.Username
	}
	keys := []string{cfg.KeyFile}
	if cfg.KeyFile == "" {
		keys = []string{filepath.Join(home, ".ssh", "id_ed25519"), filepath.Join(home, ".ssh", "id_ecdsa"), filepath.Join(home, ".ssh", "id_rsa")}
	}
	var signer ssh.Signer
	var tried []error
	for _, path := range keys {
		pem, err := os.ReadFile(path)
		if err == nil {
			signer, err = ssh.ParsePrivateKey(pem)
		}
		if err == nil {
			break
		}
		tried = append(tried, err)
	}
	if signer == nil {
		return nil, fmt.Errorf("ssh: no usable private key: %w", errors.Join(tried...))
	}
	known := cfg.KnownHosts
	if known == "" {
		known = filepath.Join(home, ".ssh", "known_hosts")
	}
	hostKey, err := knownhosts.New(known)
	if err != nil {
		return nil, fmt.Errorf("ssh: known hosts: %w", err)
	}
	return &ssh.ClientConfig{User: name, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}, HostKeyCallback: hostKey, Timeout: timeout}, nil
}

// probeKey is a key no known hosts file holds, shown to a known-hosts check to learn which keys
// it holds for a host.
var probeKey = sync.OnceValue(func() ssh.PublicKey {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	key, err := ssh.NewPublicKey(pub)
	if err != nil {
		panic(err)
	}
	return key
})

// knownAlgorithms are the algorithms of the keys known hosts holds for the host, for the host
// to show one of them: a host has keys of several kinds, and shown a kind known hosts does
// not hold for it, the check would refuse the host as if its key had changed. Nil when known
// hosts holds none (the check then refuses it as unknown).
func knownAlgorithms(check ssh.HostKeyCallback, address string, remote net.Addr) []string {
	var known *knownhosts.KeyError
	if !errors.As(check(address, remote, probeKey()), &known) {
		return nil
	}
	var algorithms []string
	for _, k := range known.Want {
		switch t := k.Key.Type(); t {
		case ssh.KeyAlgoRSA:
			algorithms = append(algorithms, ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256, ssh.KeyAlgoRSA)
		default:
			algorithms = append(algorithms, t)
		}
	}
	return algorithms
}
