package openstack

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"io"
	"maps"
	"mime"
	"mime/multipart"
	"slices"
	"strings"
	"testing"
)

// mimePart is one part of a multipart user data, its body decoded.
type mimePart struct {
	header map[string][]string
	body   []byte
}

// splitMIME parses user data as cloud-init does a MIME multipart, gzipped or not, failing the
// test when it is not one.
func splitMIME(t *testing.T, data []byte) []mimePart {
	t.Helper()
	if zr, err := gzip.NewReader(bytes.NewReader(data)); err == nil {
		if data, err = io.ReadAll(zr); err != nil {
			t.Fatalf("gunzip the user data: %v", err)
		}
	}
	head, rest, ok := bytes.Cut(data, []byte("\r\n\r\n"))
	if !ok {
		t.Fatalf("user data %q has no MIME header", data)
	}
	var ctype string
	for line := range strings.SplitSeq(string(head), "\r\n") {
		if v, ok := strings.CutPrefix(line, "Content-Type: "); ok {
			ctype = v
		}
	}
	media, params, err := mime.ParseMediaType(ctype)
	if err != nil || media != "multipart/mixed" {
		t.Fatalf("user data of type %q (%v), want multipart/mixed", ctype, err)
	}
	r := multipart.NewReader(bytes.NewReader(rest), params["boundary"])
	var parts []mimePart
	for {
		p, err := r.NextPart()
		if err == io.EOF {
			return parts
		}
		if err != nil {
			t.Fatalf("part %d: %v", len(parts), err)
		}
		body, err := io.ReadAll(p)
		if err != nil {
			t.Fatal(err)
		}
		if p.Header.Get("Content-Transfer-Encoding") == "base64" {
			if body, err = base64.StdEncoding.DecodeString(strings.ReplaceAll(string(body), "\r\n", "")); err != nil {
				t.Fatalf("part %d: base64: %v", len(parts), err)
			}
		}
		parts = append(parts, mimePart{header: p.Header, body: body})
	}
}

// sshConfig is the driver's cloud-config part.
type sshConfig struct {
	Keys       []string            `json:"ssh_authorized_keys"`
	WriteFiles []map[string]string `json:"write_files"`
	RunCmd     []string            `json:"runcmd"`
}

func parseSSHConfig(t *testing.T, p mimePart) sshConfig {
	t.Helper()
	if ct := p.header["Content-Type"]; len(ct) != 1 || !strings.HasPrefix(ct[0], "text/cloud-config") {
		t.Errorf("the driver's part has Content-Type %q, want text/cloud-config", ct)
	}
	if mt := p.header["Merge-Type"]; !slices.Equal(mt, []string{sshMergeType}) {
		t.Errorf("the driver's part has Merge-Type %q, want %q, or cloud-init lets it replace the user's lists", mt, sshMergeType)
	}
	doc, ok := bytes.CutPrefix(p.body, []byte("#cloud-config\n"))
	if !ok {
		t.Fatalf("the driver's part %q does not start with #cloud-config", p.body)
	}
	var c sshConfig
	if err := json.Unmarshal(doc, &c); err != nil {
		t.Fatalf("the driver's cloud-config %q: %v", doc, err)
	}
	return c
}

func TestGuestUserDataUnchanged(t *testing.T) {
	for _, ud := range [][]byte{nil, []byte("#!/bin/sh\necho hi\r\n")} {
		got, err := guestUserData(ud, "", nil)
		if err != nil || !bytes.Equal(got, ud) {
			t.Errorf("guestUserData(%q) without CA or keys = %q, %v; want it unchanged", ud, got, err)
		}
	}
}

func TestGuestUserDataMultipart(t *testing.T) {
	const ca = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl web CA"
	keys := []string{`from="192.0.2.0/24" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHx1 me "quoted" é`, "ssh-rsa AAAAB3Nza other"}
	// Bytes that a MIME part sent as they are would not carry: CRLF, a lone CR, NUL, invalid
	// UTF-8, and a line that looks like a boundary.
	ud := []byte("#cloud-config\r\nruncmd: [echo]\r\n--boundary\n\x00\xff\r")
	got, err := guestUserData(ud, ca+"\n", keys)
	if err != nil {
		t.Fatalf("guestUserData: %v", err)
	}
	parts := splitMIME(t, got)
	if len(parts) != 2 {
		t.Fatalf("%d parts, want the user's and the driver's", len(parts))
	}
	if !bytes.Equal(parts[0].body, ud) {
		t.Errorf("the user's part is %q, want %q byte for byte", parts[0].body, ud)
	}
	if ct := parts[0].header["Content-Type"]; !slices.Equal(ct, []string{"text/plain"}) {
		t.Errorf("the user's part has Content-Type %q, want text/plain, which cloud-init tells by its first line", ct)
	}
	c := parseSSHConfig(t, parts[1])
	if !slices.Equal(c.Keys, keys) {
		t.Errorf("ssh_authorized_keys %q, want %q", c.Keys, keys)
	}
	wantFiles := []map[string]string{
		{"path": "/etc/ssh/computeql_user_ca.pub", "owner": "root:root", "permissions": "0644", "content": ca + "\n"},
		{"path": "/etc/ssh/sshd_config.d/50-computeql-ca.conf", "owner": "root:root", "permissions": "0644",
			"content": "TrustedUserCAKeys /etc/ssh/computeql_user_ca.pub\n"},
	}
	if !slices.EqualFunc(c.WriteFiles, wantFiles, maps.Equal[map[string]string]) {
		t.Errorf("write_files %q, want %q", c.WriteFiles, wantFiles)
	}
	if !slices.Equal(c.RunCmd, []string{reloadSSHD}) {
		t.Errorf("runcmd %q, want sshd reloaded", c.RunCmd)
	}
}

func TestGuestUserDataKeysOnly(t *testing.T) {
	keys := []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHx1 me"}
	got, err := guestUserData(nil, "", keys)
	if err != nil {
		t.Fatalf("guestUserData: %v", err)
	}
	parts := splitMIME(t, got)
	if len(parts) != 1 {
		t.Fatalf("%d parts, want the driver's only: there is no user data", len(parts))
	}
	c := parseSSHConfig(t, parts[0])
	if !slices.Equal(c.Keys, keys) || c.WriteFiles != nil || c.RunCmd != nil {
		t.Errorf("cloud-config %+v, want the keys and nothing of a CA", c)
	}
}

// TestGuestUserDataLarge: the largest user data the API takes (32 KiB), random so that it
// compresses badly, with many keys, still fits Nova's limit, and reaches cloud-init unchanged;
// a small one is not compressed, so that it stays readable.
func TestGuestUserDataLarge(t *testing.T) {
	ud := make([]byte, 32<<10)
	rand.Read(ud)
	keys := make([]string, 20)
	for i := range keys {
		keys[i] = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQ" + strings.Repeat("x", 500)
	}
	got, err := guestUserData(ud, "", keys)
	if err != nil {
		t.Fatalf("guestUserData: %v", err)
	}
	if len(got) > novaUserDataMax {
		t.Errorf("%d bytes of user data, over Nova's %d", len(got), novaUserDataMax)
	}
	parts := splitMIME(t, got)
	if len(parts) != 2 || !bytes.Equal(parts[0].body, ud) || !slices.Equal(parseSSHConfig(t, parts[1]).Keys, keys) {
		t.Errorf("the gzipped multipart does not hold the user data and the keys as given")
	}
	small, err := guestUserData([]byte("#!/bin/sh\n"), "", keys[:1])
	if err != nil {
		t.Fatalf("guestUserData: %v", err)
	}
	if !bytes.HasPrefix(small, []byte("Content-Type: multipart/mixed")) {
		t.Errorf("a small multipart was sent as %q, want it as it is", small[:min(len(small), 40)])
	}
}
