// Package nocloud builds the cloud-init NoCloud seed a libvirt guest boots with: an ISO9660
// image labelled "cidata" holding meta-data, user-data and vendor-data, attached to the domain
// as a CD-ROM. cloud-init's NoCloud datasource finds it by that label and reads the three files.
//
// The image is written here, in pure Go, so that a region host needs neither cgo nor
// genisoimage, xorriso or mkisofs. It carries Joliet and Rock Ridge besides plain ISO9660: the
// plain names are restricted to upper case and eight characters ("META_DAT.;1"), and only the
// extensions give readers the names cloud-init looks for. Linux prefers Rock Ridge and falls
// back to Joliet; either gives "meta-data", "user-data" and "vendor-data". Output depends only
// on the Seed: the image's timestamps are fixed.
//
// What goes where:
//
//   - meta-data is ours: instance-id, local-hostname and public-keys (the authorized keys of
//     the image's default user). Values are YAML double-quoted strings, escaped, so no input
//     can change the document's structure.
//   - user-data is the user's, byte for byte. An empty one becomes an empty #cloud-config
//     document, which cloud-init accepts without a warning.
//   - vendor-data is the platform's: when the seed has SSH certificate authorities, a
//     #cloud-config that writes their keys to /etc/ssh/computeql_user_ca.pub, points sshd at
//     that file with a drop-in in /etc/ssh/sshd_config.d/, and reloads sshd in case it started
//     before the files were written. The drop-in takes effect on images whose sshd_config
//     includes sshd_config.d/*.conf, as current Debian, Ubuntu, Fedora and RHEL images do.
//
// Vendor data never overrides the user's choices. cloud-init merges the vendor cloud-config
// under the user's: a top-level key the user-data sets replaces the vendor's whole value. So a
// user-data with its own write_files or runcmd drops the vendor's, and with them the CA trust
// (the user can write the same files), and "vendor_data: {enabled: false}" in user-data turns
// vendor data off entirely. Authorized keys are not affected: they travel in meta-data.
package nocloud

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/crypto/ssh"
)

// Seed is what a guest learns at first boot.
type Seed struct {
	InstanceID string // meta-data instance-id (required)
	Hostname   string // meta-data local-hostname (required)
	UserData   []byte // user-data, byte for byte as the user gave it (empty allowed)
	// AuthorizedKeys are OpenSSH public keys for the default user (meta-data public-keys).
	AuthorizedKeys []string
	// TrustedUserCAKeys are OpenSSH public keys of SSH certificate authorities whose user
	// certificates sshd accepts.
	TrustedUserCAKeys []string
}

const (
	// VolumeLabel is the label NoCloud looks for.
	VolumeLabel = "cidata"

	// MaxSize bounds the three files together. The caller limits user data to 32 KiB; this is
	// a backstop far above any legitimate seed, so a bug upstream cannot make a host build
	// and attach an image of arbitrary size.
	MaxSize = 1 << 20

	// maxIDLen bounds instance IDs and host names: cloud-init makes a directory of the instance
	// ID, and a host name is at most 253 bytes.
	maxIDLen = 253

	// Where vendor-data puts the CA keys and the sshd drop-in that trusts them.
	CAKeysPath     = "/etc/ssh/computeql_user_ca.pub"
	SSHDDropInPath = "/etc/ssh/sshd_config.d/50-computeql-ca.conf"
)

// ErrInvalid is wrapped by every error that refuses a Seed.
var ErrInvalid = errors.New("invalid NoCloud seed")

// emptyCloudConfig stands in for absent user data and vendor data: a valid, empty
// cloud-config, so that no file of the seed is empty and leaves cloud-init guessing its type.
const emptyCloudConfig = "#cloud-config\n{}\n"

// reloadSSHD applies the drop-in if sshd is already running. Debian and Ubuntu name the unit
// ssh, Fedora and RHEL sshd; try-reload-or-restart leaves a stopped sshd alone, and it will
// read the drop-in when it starts. Failure must not fail the boot: the CA trust is a
// convenience, the authorized keys still work.
const reloadSSHD = "systemctl try-reload-or-restart ssh || systemctl try-reload-or-restart sshd || true"

// ISO returns the seed as an ISO9660 image with volume label "cidata".
func (s Seed) ISO() ([]byte, error) {
	files, err := s.files()
	if err != nil {
		return nil, err
	}
	return buildISO(VolumeLabel, files)
}

// files validates the seed and renders its three files.
func (s Seed) files() ([]isoFile, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	meta := s.metaData()
	user := s.UserData
	if len(user) == 0 {
		user = []byte(emptyCloudConfig)
	}
	vendor := s.vendorData()
	if n := len(meta) + len(user) + len(vendor); n > MaxSize {
		return nil, fmt.Errorf("nocloud: seed is %d bytes, over the limit of %d: %w", n, MaxSize, ErrInvalid)
	}
	return []isoFile{
		{name: "meta-data", data: meta},
		{name: "user-data", data: user},
		{name: "vendor-data", data: vendor},
	}, nil
}

func (s Seed) validate() error {
	// Checked first so that a huge input is refused before anything is built from it.
	if len(s.UserData) > MaxSize {
		return fmt.Errorf("nocloud: user data is %d bytes, over the limit of %d: %w", len(s.UserData), MaxSize, ErrInvalid)
	}
	if err := checkName("instance ID", s.InstanceID, "/"); err != nil {
		return err
	}
	if err := checkName("host name", s.Hostname, ""); err != nil {
		return err
	}
	for i, k := range s.AuthorizedKeys {
		if err := checkKey(k, true); err != nil {
			return fmt.Errorf("nocloud: AuthorizedKeys[%d]: %w: %w", i, err, ErrInvalid)
		}
	}
	for i, k := range s.TrustedUserCAKeys {
		if err := checkKey(k, false); err != nil {
			return fmt.Errorf("nocloud: TrustedUserCAKeys[%d]: %w: %w", i, err, ErrInvalid)
		}
	}
	return nil
}

// checkName refuses what no instance ID or host name should hold, whatever the YAML quoting
// makes of it: cloud-init uses both in file paths and commands. forbidden lists further
// characters to refuse.
func checkName(what, v, forbidden string) error {
	switch {
	case v == "":
		return fmt.Errorf("nocloud: %s is empty: %w", what, ErrInvalid)
	case len(v) > maxIDLen:
		return fmt.Errorf("nocloud: %s is %d bytes, over the limit of %d: %w", what, len(v), maxIDLen, ErrInvalid)
	case !utf8.ValidString(v):
		return fmt.Errorf("nocloud: %s is not valid UTF-8: %w", what, ErrInvalid)
	}
	for _, r := range v {
		if unicode.IsControl(r) || unicode.IsSpace(r) || strings.ContainsRune(forbidden, r) {
			return fmt.Errorf("nocloud: %s %q contains %q: %w", what, v, r, ErrInvalid)
		}
	}
	return nil
}

// checkKey checks that k is one OpenSSH public key on one line. Authorized keys may carry
// options (from="...", no-pty, ...), as authorized_keys lines do; a CA key is a bare key,
// since sshd's TrustedUserCAKeys file takes no options, and not a certificate.
func checkKey(k string, optionsAllowed bool) error {
	if strings.ContainsAny(k, "\r\n") {
		return errors.New("not a single line")
	}
	if !utf8.ValidString(k) {
		return errors.New("not valid UTF-8")
	}
	for _, r := range k {
		if unicode.IsControl(r) && r != '\t' {
			return fmt.Errorf("contains %q", r)
		}
	}
	if strings.TrimSpace(k) == "" {
		return errors.New("empty")
	}
	// With no line break in k, ParseAuthorizedKey sees exactly one line, so nothing is left over.
	key, _, options, _, err := ssh.ParseAuthorizedKey([]byte(k))
	if err != nil {
		return err
	}
	if optionsAllowed {
		return nil
	}
	if len(options) > 0 {
		return errors.New("has options; a CA key must be a bare public key")
	}
	if _, isCert := key.(*ssh.Certificate); isCert {
		return errors.New("is a certificate, not a CA's public key")
	}
	return nil
}

// metaData renders meta-data. Keys are written trimmed, as one line each.
func (s Seed) metaData() []byte {
	var b strings.Builder
	b.WriteString("instance-id: " + yamlQuote(s.InstanceID) + "\n")
	b.WriteString("local-hostname: " + yamlQuote(s.Hostname) + "\n")
	if len(s.AuthorizedKeys) > 0 {
		b.WriteString("public-keys:\n")
		for _, k := range s.AuthorizedKeys {
			b.WriteString("  - " + yamlQuote(strings.TrimSpace(k)) + "\n")
		}
	}
	return []byte(b.String())
}

// vendorData renders vendor-data: see the package documentation.
func (s Seed) vendorData() []byte {
	if len(s.TrustedUserCAKeys) == 0 {
		return []byte(emptyCloudConfig)
	}
	var keys strings.Builder
	for _, k := range s.TrustedUserCAKeys {
		keys.WriteString(strings.TrimSpace(k) + "\n")
	}
	var b strings.Builder
	b.WriteString("#cloud-config\n")
	b.WriteString("write_files:\n")
	writeFile := func(path, content string) {
		b.WriteString("  - path: " + yamlQuote(path) + "\n")
		b.WriteString("    owner: \"root:root\"\n")
		b.WriteString("    permissions: \"0644\"\n")
		b.WriteString("    content: " + yamlQuote(content) + "\n")
	}
	writeFile(CAKeysPath, keys.String())
	writeFile(SSHDDropInPath, "TrustedUserCAKeys "+CAKeysPath+"\n")
	b.WriteString("runcmd:\n")
	b.WriteString("  - " + yamlQuote(reloadSSHD) + "\n")
	return []byte(b.String())
}

// yamlQuote returns s as a YAML double-quoted scalar that parses back to exactly s, whatever
// s holds. Printable ASCII is written as is (but for the quote and the backslash), other
// printable characters as UTF-8, and everything YAML does not allow raw in a document (C0 and
// C1 controls, DEL, the byte order mark, non-characters) or would fold as a line break (NEL,
// U+2028, U+2029) as a \u escape, which JSON and YAML share. The one exception is invalid
// UTF-8, which no YAML document can hold: each such byte becomes U+FFFD. Callers refuse it
// before it gets here.
func yamlQuote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i, w := 0, 0; i < len(s); i += w {
		r, size := utf8.DecodeRuneInString(s[i:])
		w = size
		switch {
		case r == utf8.RuneError && size == 1:
			b.WriteString(`\ufffd`)
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r >= 0x20 && r < 0x7f:
			b.WriteRune(r)
		case yamlPrintable(r):
			b.WriteRune(r)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// yamlPrintable reports whether YAML 1.2's c-printable holds r above ASCII and r is not a
// line break there.
func yamlPrintable(r rune) bool {
	switch {
	case r == 0x85 || r == 0x2028 || r == 0x2029 || r == 0xfeff:
		return false
	case r >= 0xa0 && r <= 0xd7ff, r >= 0xe000 && r <= 0xfffd, r >= 0x10000 && r <= 0x10ffff:
		return true
	}
	return false
}
