package openstack

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"mime/multipart"
	"net/textproto"
	"strings"

	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/libvirt/nocloud"
)

// The trust of an SSH certificate authority is written where a libvirt region's guests have it,
// so that one image behaves alike in both.
const (
	caKeysPath     = nocloud.CAKeysPath
	sshdDropInPath = nocloud.SSHDDropInPath
)

// reloadSSHD applies the drop-in if sshd started before cloud-init wrote it, as a libvirt
// region's vendor data does: Debian and Ubuntu name the unit ssh, Fedora and RHEL sshd, and a
// failure must not fail the boot (the CA trust is a convenience, the keys still work).
const reloadSSHD = "systemctl try-reload-or-restart ssh || systemctl try-reload-or-restart sshd || true"

// sshMergeType is how cloud-init merges the driver's cloud-config into the user's (its
// MIME part comes last): lists such as the user's own write_files, runcmd or
// ssh_authorized_keys are appended to, and any other key the user set is kept.
const sshMergeType = "list(append)+dict(recurse_array)+str()"

// novaUserDataMax is the most user data Nova takes: 65535 characters of base64.
const novaUserDataMax = 65535 / 4 * 3

// guestUserData is the user data Nova is given. Nova's only way to a guest's keys is one key
// pair, the project's, so the spec's SSH certificate authority (caKey, "" for none) and extra
// SSH keys reach the guest through cloud-init: the user data becomes a MIME multipart, the
// user's own part first and unchanged (base64 in transit, so any bytes survive), then a
// #cloud-config of the driver's. Without either, the user data is sent as it is. A multipart
// too large for Nova (base64 grows the user's part by a third) is sent gzipped, which
// cloud-init undoes before it reads the parts.
func guestUserData(userData []byte, caKey string, keys []string) ([]byte, error) {
	if caKey == "" && len(keys) == 0 {
		return userData, nil
	}
	cfg := map[string]any{}
	if len(keys) > 0 {
		cfg["ssh_authorized_keys"] = keys
	}
	if caKey != "" {
		file := func(path, content string) map[string]string {
			return map[string]string{"path": path, "owner": "root:root", "permissions": "0644", "content": content}
		}
		cfg["write_files"] = []map[string]string{
			file(caKeysPath, strings.TrimSpace(caKey)+"\n"),
			file(sshdDropInPath, "TrustedUserCAKeys "+caKeysPath+"\n"),
		}
		cfg["runcmd"] = []string{reloadSSHD}
	}
	// JSON is YAML, and quotes whatever a key's comment holds.
	doc, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("openstack: the guest's SSH cloud-config: %w", err)
	}
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	fmt.Fprintf(&b, "Content-Type: multipart/mixed; boundary=%q\r\nMIME-Version: 1.0\r\n\r\n", w.Boundary())
	part := func(h textproto.MIMEHeader, body []byte) error {
		p, err := w.CreatePart(h)
		if err != nil {
			return err
		}
		_, err = p.Write(body)
		return err
	}
	if len(userData) > 0 {
		// text/plain has cloud-init tell the part's kind by its first line, as it does for user
		// data that is not multipart.
		enc := base64.StdEncoding.EncodeToString(userData)
		if err := part(textproto.MIMEHeader{
			"Content-Type":              {"text/plain"},
			"Content-Transfer-Encoding": {"base64"},
			"Content-Disposition":       {`attachment; filename="user-data"`},
		}, []byte(wrap(enc, 76))); err != nil {
			return nil, fmt.Errorf("openstack: the guest's user data: %w", err)
		}
	}
	if err := part(textproto.MIMEHeader{
		"Content-Type":              {`text/cloud-config; charset="utf-8"`},
		"Content-Transfer-Encoding": {"8bit"},
		"Content-Disposition":       {`attachment; filename="computeql-ssh.cfg"`},
		"Merge-Type":                {sshMergeType},
	}, append([]byte("#cloud-config\n"), doc...)); err != nil {
		return nil, fmt.Errorf("openstack: the guest's SSH cloud-config: %w", err)
	}
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("openstack: the guest's user data: %w", err)
	}
	if b.Len() <= novaUserDataMax {
		return b.Bytes(), nil
	}
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	if _, err := zw.Write(b.Bytes()); err != nil {
		return nil, fmt.Errorf("openstack: gzip the guest's user data: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("openstack: gzip the guest's user data: %w", err)
	}
	return z.Bytes(), nil
}

// wrap breaks s into lines of n characters, as MIME wants of base64.
func wrap(s string, n int) string {
	var b strings.Builder
	for len(s) > n {
		b.WriteString(s[:n] + "\r\n")
		s = s[n:]
	}
	b.WriteString(s)
	return b.String()
}

// caPublicKey is the public key of the spec's SSH certificate authority, "" for none.
func (d *Driver) caPublicKey(spec region.ServerSpec) (string, error) {
	id := spec.SSHCertificateAuthorityID
	if id == "" {
		return "", nil
	}
	ca, ok := d.opts.Catalog.SSHCertificateAuthority(id)
	if !ok {
		return "", fmt.Errorf("SSH certificate authority %q does not exist: %w", id, region.ErrRefused)
	}
	return ca.PublicKey, nil
}
