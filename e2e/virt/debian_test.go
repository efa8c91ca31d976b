package virt

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"golang.org/x/crypto/ssh"

	"github.com/computeql/computeql/e2e/harness"
	"github.com/computeql/computeql/sshtest"
	"github.com/computeql/computeql/virttest"
)

// Debian reaches SSH in 25–40 s under TCG with 1 GiB on an idle machine; two at once beside
// the other tests' guests take longer. These limits only say the step did not happen.
const (
	debianBootLimit = 4 * time.Minute
	sshLimit        = 4 * time.Minute
)

// TestLibvirtDebianSSH boots two Debian cloud images and logs in to each the ways a user can:
// one without an SSH certificate authority, with the project key pair's private key from
// instanceSSHKey, reading what its cloud-init user data wrote; one with the project's SSH
// certificate authority, with a user certificate the CA signed, and with a key of the user's
// own given in sshPublicKeys. Each refuses the other's way in. Then the first one's console
// output shows its boot; a snapshot of it is made while it runs, which it runs through, and
// the second is rebuilt from the snapshot, finding on its disk what was written on the first;
// meanwhile a resize gives the first more CPUs and a larger disk, keeping what was written on
// it and its address.
func TestLibvirtDebianSSH(t *testing.T) {
	t.Parallel()
	paths := imagePaths(t, "debian", "disk.qcow2", "vmlinuz", "initrd.img", "cmdline")
	cmdline, err := os.ReadFile(paths[3])
	if err != nil {
		t.Fatal(err)
	}
	ca := newCA(t)
	host := virttest.Start(t, virttest.Options{})
	catalog := writeCatalog(t, host, catalogue{
		// The image's disk is 2 GiB; the flavor's 4 GB holds it, and cloud-init grows the
		// filesystem to it.
		flavors: []map[string]any{flavor("small", 1, 1, 4, nil), flavor("medium", 2, 1, 6, nil)},
		images: []map[string]any{image("debian-12", 2, map[string]any{
			"file": paths[0], "kernel": paths[1], "initrd": paths[2], "cmdline": strings.TrimSpace(string(cmdline))})},
		cas: []map[string]any{{"id": "ca-web", "name": "web CA", "organizationId": org, "projectId": project,
			"publicKey": strings.TrimSpace(string(ssh.MarshalAuthorizedKey(ca.signer.PublicKey())))}},
	})
	lab := deploy(t, catalog)
	f := lab.follow(t)
	clock := newStopwatch(t)
	ctx := context.Background()

	const tokenFile = "/var/tmp/computeql-e2e-token"
	token := randomToken("cloud-init-")
	script := "#!/bin/sh\necho " + token + " >" + tokenFile + "\n"
	// Created together: they boot at the same time, so the second costs little more.
	withKey := lab.mustCreate(ctx, t, map[string]any{"name": "deb-key", "flavorId": "small", "imageId": "debian-12",
		"userData": base64.StdEncoding.EncodeToString([]byte(script))})
	ownKey := sshtest.Signer(t)
	withCA := lab.mustCreate(ctx, t, map[string]any{"name": "deb-ca", "flavorId": "small", "imageId": "debian-12",
		"sshCertificateAuthorityId": "ca-web", "sshPublicKeys": []string{strings.TrimSpace(string(ssh.MarshalAuthorizedKey(ownKey.PublicKey()))) + " me@laptop"}})
	clock.step("created deb-key %s and deb-ca %s", withKey, withCA)
	running := map[string]instance{}
	f.until(t, debianBootLimit, "both RUNNING", func(ev event) bool {
		if (ev.Instance.ID == withKey || ev.Instance.ID == withCA) && ev.Instance.running() {
			running[ev.Instance.ID] = ev.Instance
		}
		return len(running) == 2
	})
	for _, inst := range running {
		inPrefix(t, inst)
	}
	keyIP, caIP := running[withKey].Status.PrivateIP, running[withCA].Status.PrivateIP
	clock.step("both RUNNING: deb-key at %s, deb-ca at %s", keyIP, caIP)

	projectKey := sshKey(ctx, t, lab, withKey)
	userCert := ca.userCert(t, "debian")

	step(t, "with the project key pair", func(t *testing.T) {
		// cloud-init runs user scripts in its last stage, after sshd starts: wait for it.
		out := sshRun(t, host, keyIP, "debian", ssh.PublicKeys(projectKey),
			"cloud-init status --wait >/dev/null 2>&1; hostname; cat "+tokenFile)
		if want := "deb-key\n" + token + "\n"; out != want {
			t.Errorf("output %q, want %q (the hostname, then the user data's token)", out, want)
		}
		clock.step("deb-key: logged in with the project key; the user data's token is there")
		if err := sshRefused(host, keyIP, "debian", ssh.PublicKeys(userCert)); err != nil {
			t.Errorf("deb-key trusts no CA, yet: %v", err)
		}
	})

	step(t, "with a certificate of the project's SSH CA", func(t *testing.T) {
		out := sshRun(t, host, caIP, "debian", ssh.PublicKeys(userCert), "hostname; id -un")
		if want := "deb-ca\ndebian\n"; out != want {
			t.Errorf("output %q, want %q", out, want)
		}
		clock.step("deb-ca: logged in with a certificate of the CA")
		if err := sshRefused(host, caIP, "debian", ssh.PublicKeys(projectKey)); err != nil {
			t.Errorf("deb-ca has an SSH CA and must not authorize the project key, yet: %v", err)
		}
		// There is no key pair to hand out for it.
		var data struct{}
		err := lab.client.Do(ctx, `query($id: ID!) { instanceSSHKey(id: $id) { privateKey } }`, map[string]any{"id": withCA}, &data)
		var errs harness.Errors
		if !errors.As(err, &errs) || len(errs) != 1 || errs[0].Code() != "UNPROCESSABLE" {
			t.Errorf("instanceSSHKey of an instance with an SSH CA: %v, want one UNPROCESSABLE error", err)
		}
	})

	step(t, "with a key of its own", func(t *testing.T) {
		if out := sshRun(t, host, caIP, "debian", ssh.PublicKeys(ownKey), "id -un"); out != "debian\n" {
			t.Errorf("output %q, want debian", out)
		}
		clock.step("deb-ca: logged in with the key given in sshPublicKeys")
	})

	step(t, "console output", func(t *testing.T) {
		var data struct {
			InstanceConsoleOutput struct {
				Text      string `json:"text"`
				Truncated bool   `json:"truncated"`
			} `json:"instanceConsoleOutput"`
		}
		if err := lab.client.Do(ctx, `query($id: ID!) { instanceConsoleOutput(id: $id) { text truncated } }`, map[string]any{"id": withKey}, &data); err != nil {
			t.Fatal(err)
		}
		// The kernel's first line and the login prompt systemd starts on the serial port.
		if text := data.InstanceConsoleOutput.Text; !strings.Contains(text, "Linux version") || !strings.Contains(text, "deb-key login:") {
			t.Errorf("console output (%d bytes, truncated %t) lacks the kernel's banner or the login prompt; its end: %q",
				len(text), data.InstanceConsoleOutput.Truncated, text[max(0, len(text)-2000):])
		}
		clock.step("deb-key: its console output shows the boot")
	})

	snapshotToken := randomToken("snapshot-")
	var snapshot string
	step(t, "snapshot while running", func(t *testing.T) {
		in := inspect(t, host)
		dom, ok := in.domainByMAC(t, running[withKey].Status.MACAddress)
		if !ok {
			t.Fatalf("no domain has deb-key's MAC %s", running[withKey].Status.MACAddress)
		}
		baseFile := filepath.Join(host.Dir, "pool", "computeql-image-debian-12")
		baseBefore, err := os.Stat(baseFile)
		if err != nil {
			t.Fatal(err)
		}
		auth := ssh.PublicKeys(projectKey)
		sshRun(t, host, keyIP, "debian", auth, "echo "+snapshotToken+" >/var/tmp/snapshotted; sync")
		var data struct {
			SnapshotInstance struct {
				Image *struct {
					ID    string `json:"id"`
					State string `json:"state"`
				} `json:"image"`
				UserErrors []userError `json:"userErrors"`
			} `json:"snapshotInstance"`
		}
		if err := lab.client.Do(ctx, `mutation($id: ID!) { snapshotInstance(input: {id: $id, name: "deb-key-golden"}) { image { id state } userErrors { field code message } } }`,
			map[string]any{"id": withKey}, &data); err != nil {
			t.Fatal(err)
		}
		img := data.SnapshotInstance.Image
		if img == nil || img.State != "CREATING" {
			t.Fatalf("snapshotInstance: image %+v, userErrors %+v; want an image CREATING", img, data.SnapshotInstance.UserErrors)
		}
		snapshot = img.ID
		clock.step("deb-key: snapshot %s CREATING", snapshot)
		await(t, 4*time.Minute, time.Second, "snapshot "+snapshot+" READY", func() error {
			var images struct {
				Images []struct {
					ID    string `json:"id"`
					State string `json:"state"`
				} `json:"images"`
			}
			if err := lab.client.Do(ctx, `{ images { id state } }`, nil, &images); err != nil {
				return err
			}
			for _, im := range images.Images {
				if im.ID == snapshot && im.State == "READY" {
					return nil
				}
				if im.ID == snapshot {
					return fmt.Errorf("it is %s", im.State)
				}
			}
			return errors.New("not listed")
		})
		clock.step("deb-key: snapshot %s READY", snapshot)
		// The guest ran throughout: the same QEMU process (a domain's id changes whenever it
		// starts), still running, and the instance RUNNING.
		after, ok := in.domainByMAC(t, running[withKey].Status.MACAddress)
		if state, _ := in.state(t, after); !ok || after.ID != dom.ID || state != libvirt.DomainRunning {
			t.Errorf("after the snapshot deb-key's domain has id %d (before %d), state %d; want the same domain running", after.ID, dom.ID, state)
		}
		if got := lab.get(ctx, t, withKey); !got.running() {
			t.Errorf("after the snapshot deb-key is %s, want RUNNING", got)
		}
		// Its disk is its own overlay again, the snapshot's overlay merged and gone, and the
		// shared base image untouched.
		if disk := in.disk(t, after); disk != filepath.Join(host.Dir, "pool", after.Name+".qcow2") {
			t.Errorf("deb-key's disk is %s, want its own overlay %s.qcow2", disk, after.Name)
		}
		if vols := in.volumes(t); slices.Contains(vols, after.Name+"-snap.qcow2") || !slices.Contains(vols, "computeql-snap-"+snapshot+".qcow2") {
			t.Errorf("volumes %v: want the image's computeql-snap-%s.qcow2 and no %s-snap.qcow2", vols, snapshot, after.Name)
		}
		if baseAfter, err := os.Stat(baseFile); err != nil || !baseAfter.ModTime().Equal(baseBefore.ModTime()) || baseAfter.Size() != baseBefore.Size() {
			t.Errorf("the shared base image changed: %v (%v), before %v", baseAfter, err, baseBefore)
		}
		// deb-ca is rebuilt from it, while deb-key is resized.
		lab.verb(ctx, t, "updateInstance", withCA, map[string]any{"imageId": snapshot, "allowRebuild": true})
		clock.step("deb-ca: rebuilding from snapshot %s", snapshot)
	})

	step(t, "resize keeps the disk", func(t *testing.T) {
		auth := ssh.PublicKeys(projectKey)
		if out := sshRun(t, host, keyIP, "debian", auth, "echo "+token+" >/var/tmp/kept; sync; nproc"); out != "1\n" {
			t.Fatalf("before the resize: %q, want 1 CPU", out)
		}
		lab.verb(ctx, t, "resizeInstance", withKey, map[string]any{"flavorId": "medium", "allowRestart": true})
		f.until(t, time.Minute, "ACTION RESIZE", of(withKey, action("RESIZE")))
		resized := f.until(t, debianBootLimit, "deb-key RUNNING with flavor medium", of(withKey, func(ev event) bool {
			return ev.Instance.FlavorID == "medium" && ev.Instance.running() && hasReason(ev.Instance, "Provisioned")
		}))
		if resized.Instance.Status.PrivateIP != keyIP || resized.Instance.Status.MACAddress != running[withKey].Status.MACAddress {
			t.Errorf("after the resize: %s, want address %s and MAC %s kept", resized.Instance, keyIP, running[withKey].Status.MACAddress)
		}
		clock.step("deb-key: resized and RUNNING again")
		out := sshRun(t, host, keyIP, "debian", auth, "cat /var/tmp/kept; nproc; lsblk -bdno SIZE /dev/vda")
		if want := token + "\n2\n6000000000\n"; out != want {
			t.Errorf("after the resize: %q, want %q (what was written, 2 CPUs, a 6 GB disk)", out, want)
		}
		clock.step("deb-key: the file written before is there, with 2 CPUs and a 6 GB disk")
	})

	step(t, "the guest rebuilt from the snapshot has its disk", func(t *testing.T) {
		if snapshot == "" {
			t.Skip("no snapshot was made")
		}
		var rebuilt instance
		await(t, debianBootLimit, time.Second, "deb-ca RUNNING on the snapshot", func() error {
			rebuilt = lab.get(ctx, t, withCA)
			if rebuilt.ImageID != snapshot || !rebuilt.running() || !hasReason(rebuilt, "Provisioned") {
				return fmt.Errorf("it is %s with image %s", rebuilt, rebuilt.ImageID)
			}
			return nil
		})
		clock.step("deb-ca: RUNNING from the snapshot at %s", rebuilt.Status.PrivateIP)
		out := sshRun(t, host, rebuilt.Status.PrivateIP, "debian", ssh.PublicKeys(userCert), "cat /var/tmp/snapshotted; hostname")
		if want := snapshotToken + "\ndeb-ca\n"; out != want {
			t.Errorf("on the guest rebuilt from the snapshot: %q, want %q (what deb-key wrote before the snapshot, its own hostname)", out, want)
		}
		clock.step("deb-ca: the file written on deb-key before the snapshot is there")
	})
}

// sshKey reads the instance's project key pair through instanceSSHKey.
func sshKey(ctx context.Context, t *testing.T, lab *lab, id string) ssh.Signer {
	t.Helper()
	var data struct {
		InstanceSSHKey struct {
			PrivateKey string `json:"privateKey"`
		} `json:"instanceSSHKey"`
	}
	if err := lab.client.Do(ctx, `query($id: ID!) { instanceSSHKey(id: $id) { privateKey } }`, map[string]any{"id": id}, &data); err != nil {
		t.Fatalf("instanceSSHKey %s: %v", id, err)
	}
	signer, err := ssh.ParsePrivateKey([]byte(data.InstanceSSHKey.PrivateKey))
	if err != nil {
		t.Fatalf("instanceSSHKey %s: %v", id, err)
	}
	return signer
}

// certificateAuthority is the project's SSH CA, made by the test.
type certificateAuthority struct {
	signer ssh.Signer
}

func newCA(t *testing.T) *certificateAuthority {
	t.Helper()
	return &certificateAuthority{signer: sshtest.Signer(t)}
}

// userCert makes a new ed25519 key and a user certificate of it for the principal, signed by
// the CA, and returns the signer that presents the certificate.
func (ca *certificateAuthority) userCert(t *testing.T, principal string) ssh.Signer {
	t.Helper()
	userSigner := sshtest.Signer(t)
	now := time.Now()
	cert := &ssh.Certificate{
		Key: userSigner.PublicKey(), Serial: 1, CertType: ssh.UserCert, KeyId: "computeql-e2e", ValidPrincipals: []string{principal},
		// The guest's clock comes from the host's, but a few minutes of slack cost nothing.
		ValidAfter: uint64(now.Add(-10 * time.Minute).Unix()), ValidBefore: uint64(now.Add(time.Hour).Unix()),
		Permissions: ssh.Permissions{Extensions: map[string]string{"permit-pty": ""}},
	}
	if err := cert.SignCert(rand.Reader, ca.signer); err != nil {
		t.Fatal(err)
	}
	certSigner, err := ssh.NewCertSigner(cert, userSigner)
	if err != nil {
		t.Fatal(err)
	}
	return certSigner
}

// sshDial logs in to the guest at ip from inside the host's network namespace. The session's
// whole life is bounded: a guest that stops answering fails the attempt instead of hanging it.
func sshDial(host *virttest.Host, ip, user string, auth ssh.AuthMethod) (*ssh.Client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addr := net.JoinHostPort(ip, "22")
	conn, err := host.Dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	_ = conn.SetDeadline(time.Now().Add(2 * time.Minute))
	c, chans, reqs, err := ssh.NewClientConn(conn, addr, &ssh.ClientConfig{
		User: user, Auth: []ssh.AuthMethod{auth},
		// The guest makes its host keys at first boot: there is nothing to pin them to.
		HostKeyCallback: ssh.InsecureIgnoreHostKey(),
	})
	if err != nil {
		conn.Close()
		return nil, err
	}
	return ssh.NewClient(c, chans, reqs), nil
}

// sshRun runs the command on the guest, trying again until sshd answers, lets the user in and
// the command succeeds, and returns its output.
func sshRun(t *testing.T, host *virttest.Host, ip, user string, auth ssh.AuthMethod, cmd string) string {
	t.Helper()
	var out string
	await(t, sshLimit, time.Second, fmt.Sprintf("ssh %s@%s %q", user, ip, cmd), func() error {
		client, err := sshDial(host, ip, user, auth)
		if err != nil {
			return err
		}
		defer client.Close()
		sess, err := client.NewSession()
		if err != nil {
			return err
		}
		defer sess.Close()
		b, err := sess.CombinedOutput(cmd)
		if err != nil {
			return fmt.Errorf("%v: %s", err, b)
		}
		out = string(b)
		return nil
	})
	return out
}

// sshRefused reports nil when the guest's sshd, which has let someone in already, refuses the
// user with auth; otherwise an error saying what happened instead.
func sshRefused(host *virttest.Host, ip, user string, auth ssh.AuthMethod) error {
	client, err := sshDial(host, ip, user, auth)
	if err == nil {
		client.Close()
		return errors.New("it let the user in")
	}
	if !strings.Contains(err.Error(), "unable to authenticate") {
		return fmt.Errorf("it failed otherwise than by refusing the user: %w", err)
	}
	return nil
}
