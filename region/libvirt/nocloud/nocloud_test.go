package nocloud

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/goccy/go-yaml"
	"golang.org/x/crypto/ssh"
)

// testKey is a deterministic OpenSSH ed25519 public key line.
func testKey(t testing.TB, seed byte, comment string) string {
	t.Helper()
	pub, err := ssh.NewPublicKey(testSigner(seed).Public())
	if err != nil {
		t.Fatal(err)
	}
	line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub)))
	if comment != "" {
		line += " " + comment
	}
	return line
}

func testSigner(seed byte) ed25519.PrivateKey {
	return ed25519.NewKeyFromSeed(bytes.Repeat([]byte{seed}, ed25519.SeedSize))
}

// testCertificate is an OpenSSH user certificate line: what a CA signs, not a CA key.
func testCertificate(t *testing.T) string {
	t.Helper()
	pub, err := ssh.NewPublicKey(testSigner(7).Public())
	if err != nil {
		t.Fatal(err)
	}
	caSigner, err := ssh.NewSignerFromKey(testSigner(8))
	if err != nil {
		t.Fatal(err)
	}
	cert := &ssh.Certificate{Key: pub, CertType: ssh.UserCert, ValidPrincipals: []string{"u"}, ValidBefore: ssh.CertTimeInfinity}
	if err := cert.SignCert(bytes.NewReader(make([]byte, 1024)), caSigner); err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(cert)))
}

func fullSeed(t testing.TB) Seed {
	return Seed{
		InstanceID:        "i-0123456789abcdef",
		Hostname:          "web-1",
		UserData:          []byte("#cloud-config\npackages: [nginx]\n"),
		AuthorizedKeys:    []string{testKey(t, 1, "alice@laptop"), testKey(t, 2, "")},
		TrustedUserCAKeys: []string{testKey(t, 3, "ca-2026"), testKey(t, 4, "ca-next")},
	}
}

// parseYAML parses a document and fails the test if it is not valid YAML.
func parseYAML(t *testing.T, doc []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal(doc, &m); err != nil {
		t.Fatalf("not valid YAML: %v\n%s", err, doc)
	}
	return m
}

func TestMetaData(t *testing.T) {
	k1, k2 := testKey(t, 1, "alice@laptop"), testKey(t, 2, "")
	tests := []struct {
		name string
		seed Seed
		want string
		keys []any
	}{
		{
			name: "no keys",
			seed: Seed{InstanceID: "i-1", Hostname: "web-1"},
			want: "instance-id: \"i-1\"\nlocal-hostname: \"web-1\"\n",
		},
		{
			name: "keys, trimmed",
			seed: Seed{InstanceID: "i-1", Hostname: "web-1", AuthorizedKeys: []string{"  " + k1 + " \t", k2}},
			want: "instance-id: \"i-1\"\nlocal-hostname: \"web-1\"\npublic-keys:\n  - \"" + k1 + "\"\n  - \"" + k2 + "\"\n",
			keys: []any{k1, k2},
		},
		{
			name: "key with options that need quoting",
			seed: Seed{InstanceID: "i-1", Hostname: "web-1", AuthorizedKeys: []string{`from="10.0.0.0/8",no-pty ` + k1}},
			want: "instance-id: \"i-1\"\nlocal-hostname: \"web-1\"\npublic-keys:\n  - \"from=\\\"10.0.0.0/8\\\",no-pty " + k1 + "\"\n",
			keys: []any{`from="10.0.0.0/8",no-pty ` + k1},
		},
		{
			name: "values YAML would misread unquoted",
			seed: Seed{InstanceID: "null", Hostname: "yes: #no"},
			want: "instance-id: \"null\"\nlocal-hostname: \"yes: #no\"\n",
		},
		{
			name: "non-ASCII host name",
			seed: Seed{InstanceID: "i-ü", Hostname: "höst\u00a0"},
			want: "instance-id: \"i-ü\"\nlocal-hostname: \"höst\u00a0\"\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.seed.metaData()
			if string(got) != tt.want {
				t.Fatalf("meta-data:\n%s\nwant:\n%s", got, tt.want)
			}
			m := parseYAML(t, got)
			if m["instance-id"] != tt.seed.InstanceID || m["local-hostname"] != tt.seed.Hostname {
				t.Errorf("parsed %v", m)
			}
			if keys, _ := m["public-keys"].([]any); !equalAny(keys, tt.keys) {
				t.Errorf("public-keys %q, want %q", keys, tt.keys)
			}
		})
	}
}

func equalAny(a, b []any) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestVendorData(t *testing.T) {
	ca1, ca2 := testKey(t, 3, "ca-2026"), testKey(t, 4, "")
	t.Run("no CA keys", func(t *testing.T) {
		got := Seed{InstanceID: "i", Hostname: "h"}.vendorData()
		if string(got) != "#cloud-config\n{}\n" {
			t.Fatalf("vendor-data %q", got)
		}
		if m := parseYAML(t, got); len(m) != 0 {
			t.Fatalf("parsed %v, want an empty mapping", m)
		}
	})
	t.Run("CA keys", func(t *testing.T) {
		got := Seed{InstanceID: "i", Hostname: "h", TrustedUserCAKeys: []string{ca1 + "  ", ca2}}.vendorData()
		want := "#cloud-config\n" +
			"write_files:\n" +
			"  - path: \"/etc/ssh/computeql_user_ca.pub\"\n" +
			"    owner: \"root:root\"\n" +
			"    permissions: \"0644\"\n" +
			"    content: \"" + ca1 + "\\n" + ca2 + "\\n\"\n" +
			"  - path: \"/etc/ssh/sshd_config.d/50-computeql-ca.conf\"\n" +
			"    owner: \"root:root\"\n" +
			"    permissions: \"0644\"\n" +
			"    content: \"TrustedUserCAKeys /etc/ssh/computeql_user_ca.pub\\n\"\n" +
			"runcmd:\n" +
			"  - \"systemctl try-reload-or-restart ssh || systemctl try-reload-or-restart sshd || true\"\n"
		if string(got) != want {
			t.Fatalf("vendor-data:\n%s\nwant:\n%s", got, want)
		}
		m := parseYAML(t, got)
		files, _ := m["write_files"].([]any)
		if len(files) != 2 {
			t.Fatalf("write_files %v", m["write_files"])
		}
		wantFiles := []map[string]any{
			{"path": CAKeysPath, "owner": "root:root", "permissions": "0644", "content": ca1 + "\n" + ca2 + "\n"},
			{"path": SSHDDropInPath, "owner": "root:root", "permissions": "0644", "content": "TrustedUserCAKeys " + CAKeysPath + "\n"},
		}
		for i, f := range files {
			fm, _ := f.(map[string]any)
			for k, v := range wantFiles[i] {
				if fm[k] != v {
					t.Errorf("write_files[%d].%s = %#v, want %#v", i, k, fm[k], v)
				}
			}
		}
		if cmds, _ := m["runcmd"].([]any); len(cmds) != 1 || !strings.Contains(cmds[0].(string), "systemctl try-reload-or-restart ssh ") {
			t.Errorf("runcmd %v", m["runcmd"])
		}
		// The key file must be what sshd's TrustedUserCAKeys reads: one parseable key a line.
		rest := []byte(wantFiles[0]["content"].(string))
		for range 2 {
			var err error
			if _, _, _, rest, err = ssh.ParseAuthorizedKey(rest); err != nil {
				t.Fatal(err)
			}
		}
	})
}

func TestUserData(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 32<<10/16)
	tests := []struct {
		name string
		in   []byte
		want []byte
	}{
		{"empty is an empty cloud-config", nil, []byte("#cloud-config\n{}\n")},
		{"zero-length non-nil too", []byte{}, []byte("#cloud-config\n{}\n")},
		{"shell script, byte for byte", []byte("#!/bin/sh\r\necho hi\x00\xff\n"), []byte("#!/bin/sh\r\necho hi\x00\xff\n")},
		{"32 KiB", big, big},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := Seed{InstanceID: "i", Hostname: "h", UserData: tt.in}
			img, err := s.ISO()
			if err != nil {
				t.Fatal(err)
			}
			p, err := readISO(img)
			if err != nil {
				t.Fatal(err)
			}
			if got := p.rockRidge.files["user-data"]; !bytes.Equal(got, tt.want) {
				t.Fatalf("user-data %q, want %q", got, tt.want)
			}
		})
	}
}

func TestISOContents(t *testing.T) {
	s := fullSeed(t)
	img, err := s.ISO()
	if err != nil {
		t.Fatal(err)
	}
	p, err := readISO(img)
	if err != nil {
		t.Fatal(err)
	}
	if p.volumeID != "cidata" || p.jolietVolumeID != "cidata" {
		t.Errorf("volume ids %q, %q", p.volumeID, p.jolietVolumeID)
	}
	want := map[string][]byte{"meta-data": s.metaData(), "user-data": s.UserData, "vendor-data": s.vendorData()}
	for view, v := range map[string]isoView{"rock ridge": p.rockRidge, "joliet": p.joliet} {
		if strings.Join(v.names, " ") != "meta-data user-data vendor-data" {
			t.Errorf("%s names %q", view, v.names)
		}
		for name, data := range want {
			if !bytes.Equal(v.files[name], data) {
				t.Errorf("%s %s = %q, want %q", view, name, v.files[name], data)
			}
		}
	}
	if strings.Join(p.primary.names, " ") != "META_DAT.;1 USER_DAT.;1 VENDOR_D.;1" {
		t.Errorf("primary names %q", p.primary.names)
	}
}

func TestRefusals(t *testing.T) {
	ok := fullSeed(t)
	with := func(f func(*Seed)) Seed { s := ok; f(&s); return s }
	key := testKey(t, 1, "")
	// What the seed holds besides user data.
	overhead := len(ok.metaData()) + len(ok.vendorData())
	tests := []struct {
		name string
		seed Seed
		want string
	}{
		{"empty instance ID", with(func(s *Seed) { s.InstanceID = "" }), `nocloud: instance ID is empty: invalid NoCloud seed`},
		{"empty host name", with(func(s *Seed) { s.Hostname = "" }), `nocloud: host name is empty: invalid NoCloud seed`},
		{"newline in host name", with(func(s *Seed) { s.Hostname = "a\nb" }), `nocloud: host name "a\nb" contains '\n': invalid NoCloud seed`},
		{"space in host name", with(func(s *Seed) { s.Hostname = "a b" }), `nocloud: host name "a b" contains ' ': invalid NoCloud seed`},
		{"NUL in instance ID", with(func(s *Seed) { s.InstanceID = "i\x00" }), `nocloud: instance ID "i\x00" contains '\x00': invalid NoCloud seed`},
		{"slash in instance ID", with(func(s *Seed) { s.InstanceID = "../etc" }), `nocloud: instance ID "../etc" contains '/': invalid NoCloud seed`},
		{"long instance ID", with(func(s *Seed) { s.InstanceID = strings.Repeat("i", 254) }), `nocloud: instance ID is 254 bytes, over the limit of 253: invalid NoCloud seed`},
		{"invalid UTF-8 host name", with(func(s *Seed) { s.Hostname = "h\xff" }), `nocloud: host name is not valid UTF-8: invalid NoCloud seed`},
		{"two-line authorized key", with(func(s *Seed) { s.AuthorizedKeys = []string{key, key + "\n" + key} }), `nocloud: AuthorizedKeys[1]: not a single line: invalid NoCloud seed`},
		{"CR in authorized key", with(func(s *Seed) { s.AuthorizedKeys = []string{key + "\r"} }), `nocloud: AuthorizedKeys[0]: not a single line: invalid NoCloud seed`},
		{"empty authorized key", with(func(s *Seed) { s.AuthorizedKeys = []string{" "} }), `nocloud: AuthorizedKeys[0]: empty: invalid NoCloud seed`},
		{"garbage authorized key", with(func(s *Seed) { s.AuthorizedKeys = []string{"ssh-rsa not-base64"} }), `nocloud: AuthorizedKeys[0]: ssh: no key found; last parsing error for ignored line: illegal base64 data at input byte 3: invalid NoCloud seed`},
		{"comment line as key", with(func(s *Seed) { s.AuthorizedKeys = []string{"# " + key} }), `nocloud: AuthorizedKeys[0]: ssh: no key found: invalid NoCloud seed`},
		{"control character in key", with(func(s *Seed) { s.AuthorizedKeys = []string{key + " \x1b[2J"} }), `nocloud: AuthorizedKeys[0]: contains '\x1b': invalid NoCloud seed`},
		{"invalid UTF-8 in key comment", with(func(s *Seed) { s.AuthorizedKeys = []string{key + " \xff"} }), `nocloud: AuthorizedKeys[0]: not valid UTF-8: invalid NoCloud seed`},
		{"two-line CA key", with(func(s *Seed) { s.TrustedUserCAKeys = []string{key + "\n"} }), `nocloud: TrustedUserCAKeys[0]: not a single line: invalid NoCloud seed`},
		{"CA key with options", with(func(s *Seed) { s.TrustedUserCAKeys = []string{"cert-authority " + key} }), `nocloud: TrustedUserCAKeys[0]: has options; a CA key must be a bare public key: invalid NoCloud seed`},
		{"certificate as CA key", with(func(s *Seed) { s.TrustedUserCAKeys = []string{testCertificate(t)} }), `nocloud: TrustedUserCAKeys[0]: is a certificate, not a CA's public key: invalid NoCloud seed`},
		{"user data over the limit", with(func(s *Seed) { s.UserData = make([]byte, MaxSize+1) }), `nocloud: user data is 1048577 bytes, over the limit of 1048576: invalid NoCloud seed`},
		{"seed over the limit", with(func(s *Seed) { s.UserData = make([]byte, MaxSize) }), fmt.Sprintf("nocloud: seed is %d bytes, over the limit of 1048576: invalid NoCloud seed", MaxSize+overhead)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			img, err := tt.seed.ISO()
			if err == nil {
				t.Fatalf("accepted, %d bytes", len(img))
			}
			if err.Error() != tt.want {
				t.Errorf("error\n%s\nwant\n%s", err, tt.want)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%v does not wrap ErrInvalid", err)
			}
		})
	}
	// The limit is on the seed, not on user data alone: this one is just under.
	s := ok
	s.UserData = make([]byte, MaxSize-overhead)
	if _, err := s.ISO(); err != nil {
		t.Errorf("seed of exactly %d bytes refused: %v", MaxSize, err)
	}
}

func TestAccepts(t *testing.T) {
	key := testKey(t, 1, "")
	tests := []struct {
		name string
		seed Seed
	}{
		{"authorized key with options", Seed{InstanceID: "i", Hostname: "h", AuthorizedKeys: []string{`no-pty,command="echo \"hi\"" ` + key}}},
		{"tab-separated key", Seed{InstanceID: "i", Hostname: "h", AuthorizedKeys: []string{strings.Replace(key, " ", "\t", 1)}}},
		{"CA key with a comment", Seed{InstanceID: "i", Hostname: "h", TrustedUserCAKeys: []string{key + " my CA"}}},
		{"longest names", Seed{InstanceID: strings.Repeat("i", 253), Hostname: strings.Repeat("h", 253)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			img, err := tt.seed.ISO()
			if err != nil {
				t.Fatal(err)
			}
			p, err := readISO(img)
			if err != nil {
				t.Fatal(err)
			}
			parseYAML(t, p.rockRidge.files["meta-data"])
			parseYAML(t, p.rockRidge.files["vendor-data"])
		})
	}
}

func TestDeterministic(t *testing.T) {
	s := fullSeed(t)
	first, err := s.ISO()
	if err != nil {
		t.Fatal(err)
	}
	// Concurrent builds too: nothing may depend on shared state or the clock.
	var wg sync.WaitGroup
	results := make([][]byte, 8)
	for i := range results {
		wg.Go(func() {
			results[i], _ = s.ISO()
		})
	}
	wg.Wait()
	for i, r := range results {
		if !bytes.Equal(r, first) {
			t.Fatalf("build %d differs from the first", i)
		}
	}
	other := s
	other.Hostname = "web-2"
	if img, _ := other.ISO(); bytes.Equal(img, first) {
		t.Fatal("a different seed gave the same image")
	}
}

func TestYAMLQuote(t *testing.T) {
	tests := []string{
		"", "plain", `a"b\c`, "line\nbreak\r\n", "tab\there",
		"\x00\x01\x1f\x7f", "\u0080\u0085\u009f", "\u2028\u2029\ufeff", "\ufffe\uffff",
		"é ü 日本", "😀 \U0010fffd", "\u00a0nbsp", "  lead and trail  ",
		"#comment", "key: value", "- item", "{[]}", "*alias", "&anchor", "!tag", "%TAG", "@", "`", "'",
		"null", "~", "yes", "No", "0644", "1e3", ".inf", "---", "...", "<<",
	}
	for _, s := range tests {
		q := yamlQuote(s)
		for _, r := range q {
			if !(r >= 0x20 && r < 0x7f) && !yamlPrintable(r) {
				t.Errorf("yamlQuote(%q) = %q holds raw %U", s, q, r)
			}
		}
		m := parseYAML(t, []byte("k: "+q+"\n"))
		if got, ok := m["k"].(string); !ok || got != s {
			t.Errorf("yamlQuote(%q) = %s parses to %#v", s, q, m["k"])
		}
	}
	if got := yamlQuote("a\xffb"); got != `"a\ufffdb"` {
		t.Errorf("invalid UTF-8 quoted as %s", got)
	}
	if !utf8.ValidString(yamlQuote("\xc0\x80")) {
		t.Error("quoting invalid UTF-8 produced invalid UTF-8")
	}
}
