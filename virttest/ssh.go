package virttest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// sshd is where Debian's openssh-server puts the daemon.
const sshd = "/usr/sbin/sshd"

// SSH is an sshd the test started on a free loopback port, through which the host's daemon is
// reached: the way a region reaches a remote host with a qemu+ssh URI.
type SSH struct {
	// URI is qemu+ssh://root@127.0.0.1:<port>/system with the host's socket, the client's
	// key file and a known-hosts file that holds the sshd's key.
	URI string
	// KeyFile is the client's private key; KnownHosts holds the sshd's host key.
	KeyFile, KnownHosts string
	// Address is the sshd's host:port.
	Address string
}

// SSH starts an sshd on loopback that lets root in with a key of its own, for the test's
// duration, and returns a qemu+ssh URI of the host through it. The sshd is the machine's
// binary with a configuration, keys and pid file in a temporary directory; the test's cleanup
// kills it. It skips (fails under CI) when openssh-server is not installed.
func (h *Host) SSH(tb testing.TB) SSH {
	tb.Helper()
	if _, err := os.Stat(sshd); err != nil {
		msg := fmt.Sprintf("virttest: no %s: install openssh-server", sshd)
		if os.Getenv("CI") != "" {
			tb.Fatal(msg)
		}
		tb.Skip(msg)
	}
	dir := tb.TempDir()
	// Host keys of every kind, as a real host has, and only the ed25519 one known to the
	// client: the client must ask for the kind it knows.
	hostKey, hostPub := writeKey(tb, filepath.Join(dir, "host_ed25519"), newEd25519(tb))
	ecdsaKey, _ := writeKey(tb, filepath.Join(dir, "host_ecdsa"), newECDSA(tb))
	rsaKey, _ := writeKey(tb, filepath.Join(dir, "host_rsa"), newRSA(tb))
	clientKey, clientPub := writeKey(tb, filepath.Join(dir, "client_key"), newEd25519(tb))
	writeFile(tb, filepath.Join(dir, "authorized_keys"), string(ssh.MarshalAuthorizedKey(clientPub)))
	// sshd wants its privilege separation directory; Debian's package makes it only at boot.
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		tb.Fatal(err)
	}
	port, err := freeTCPPort()
	if err != nil {
		tb.Fatal(err)
	}
	address := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	writeFile(tb, filepath.Join(dir, "known_hosts"), "[127.0.0.1]:"+strconv.Itoa(port)+" "+string(ssh.MarshalAuthorizedKey(hostPub)))
	config := strings.Join([]string{
		"Port " + strconv.Itoa(port), "ListenAddress 127.0.0.1", "HostKey " + ecdsaKey, "HostKey " + rsaKey, "HostKey " + hostKey,
		"AuthorizedKeysFile " + filepath.Join(dir, "authorized_keys"), "PidFile " + filepath.Join(dir, "sshd.pid"),
		"StrictModes no", "PermitRootLogin prohibit-password", "PasswordAuthentication no",
		"KbdInteractiveAuthentication no", "UsePAM no", "AllowStreamLocalForwarding yes",
	}, "\n") + "\n"
	writeFile(tb, filepath.Join(dir, "sshd_config"), config)
	logFile, err := os.Create(filepath.Join(dir, "sshd.log"))
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(sshd, "-D", "-e", "-f", filepath.Join(dir, "sshd_config"))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	tb.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		logFile.Close()
	})
	if err := awaitListening(address, exited); err != nil {
		log, _ := os.ReadFile(logFile.Name())
		tb.Fatalf("virttest: sshd: %v\n%s", err, log)
	}
	q := url.Values{"socket": {h.Socket}, "keyfile": {clientKey}, "known_hosts": {filepath.Join(dir, "known_hosts")}}
	return SSH{
		URI:     "qemu+ssh://root@" + address + "/system?" + q.Encode(),
		KeyFile: clientKey, KnownHosts: filepath.Join(dir, "known_hosts"), Address: address,
	}
}

// writeKey writes a private key in OpenSSH's form, readable by its owner alone, and returns its
// path and public key.
func writeKey(tb testing.TB, path string, priv crypto.Signer) (string, ssh.PublicKey) {
	tb.Helper()
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		tb.Fatal(err)
	}
	pub, err := ssh.NewPublicKey(priv.Public())
	if err != nil {
		tb.Fatal(err)
	}
	return path, pub
}

func newEd25519(tb testing.TB) crypto.Signer {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	return priv
}

func newECDSA(tb testing.TB) crypto.Signer {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	return priv
}

func newRSA(tb testing.TB) crypto.Signer {
	priv, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		tb.Fatal(err)
	}
	return priv
}

func writeFile(tb testing.TB, path, content string) {
	tb.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		tb.Fatal(err)
	}
}

// freeTCPPort is a loopback port nothing listens on now.
func freeTCPPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// awaitListening polls until the address accepts connections: sshd says nothing when it is
// ready. It fails at once when sshd exits.
func awaitListening(address string, exited <-chan struct{}) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return errors.New("sshd exited")
		default:
		}
		if c, err := net.DialTimeout("tcp", address, time.Second); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.New("not listening after 10s")
}
