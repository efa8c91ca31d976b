package instance

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/computeql/computeql/region"
)

// wantName is the name rule written out by hand rather than as a regular expression, so
// that the fuzzer compares two independent readings of the rule.
func wantName(s string) bool {
	alnum := func(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }
	if len(s) < 1 || len(s) > 63 || !alnum(s[0]) || !alnum(s[len(s)-1]) {
		return false
	}
	for i := range len(s) {
		if c := s[i]; !alnum(c) && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return true
}

// onlyProblem fails unless p holds exactly one problem, with the code and field.
func onlyProblem(t *testing.T, p problems, code Code, field []string) {
	t.Helper()
	if len(p.list) != 1 || p.list[0].Code != code || !slices.Equal(p.list[0].Field, field) {
		t.Fatalf("problems %+v, want one %s at %v", p.list, code, field)
	}
}

// FuzzName: the name validator agrees with the name rule; an accepted name survives the
// stored JSON form unchanged, and its claim ignores case (names are hostnames) and is a
// UUID v5, as the store's atomic uniqueness check relies on.
func FuzzName(f *testing.F) {
	for _, s := range []string{
		"web-1", "a", "9", "A.b_c-9", "-web", "web-", "web_", ".web", "web.", "",
		strings.Repeat("a", 63), strings.Repeat("a", 64), "wéb", "web\n", "web 1", "a\x00b", "z-_",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		var p problems
		checkName(&p, name)
		if accepted, want := !p.any(), wantName(name); accepted != want {
			t.Fatalf("checkName(%q) accepted = %v, the rule says %v", name, accepted, want)
		}
		if p.any() {
			onlyProblem(t, p, CodeBadUserInput, path("name"))
			return
		}
		b, err := json.Marshal(Spec{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		var back Spec
		if err := json.Unmarshal(b, &back); err != nil || back.Name != name {
			t.Fatalf("name %q stored as %s reads back as %q (%v)", name, b, back.Name, err)
		}
		claim := NameClaim("net-1", name)
		if other := NameClaim("net-1", strings.ToUpper(name)); other != claim {
			t.Fatalf("claims of %q and its upper case differ: %s, %s", name, claim, other)
		}
		if u, err := uuid.Parse(claim); err != nil || u.Version() != 5 || u.String() != claim {
			t.Fatalf("claim %q of %q is not a canonical UUID v5 (%v)", claim, name, err)
		}
	})
}

// FuzzTags: tags are given one per line as name=value. Every tag breaking a rule (1 to 63
// characters, no reserved prefix, given once, value at most 255 characters) is reported at its
// own index, and no tag keeping them is; more than MaxTags is one problem for the list.
func FuzzTags(f *testing.F) {
	for _, s := range []string{
		"env=prod", "env=prod\nteam=web", "env=a\nenv=b", "=empty", "compute/instance-id=x",
		"compute=ok", strings.Repeat("n", 64) + "=v", "n=" + strings.Repeat("v", 256), "ü=ü",
		strings.Repeat("t=\n", MaxTags+1), "a=1\nb=2\na=3\n\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		var tags []Tag
		for line := range strings.SplitSeq(raw, "\n") {
			name, value, _ := strings.Cut(line, "=")
			tags = append(tags, Tag{Name: name, Value: value})
		}
		var p problems
		checkTags(&p, tags)
		if len(tags) > MaxTags {
			onlyProblem(t, p, CodeBadUserInput, path("tags"))
			return
		}
		reported := map[string]bool{}
		for _, pr := range p.list {
			if pr.Code != CodeBadUserInput {
				t.Fatalf("problem %+v: want %s", pr, CodeBadUserInput)
			}
			reported[strings.Join(pr.Field, ".")] = true
		}
		seen := map[string]bool{}
		for i, tag := range tags {
			n := utf8.RuneCountInString(tag.Name)
			badName := n == 0 || n > MaxTagName || strings.HasPrefix(tag.Name, "compute/") || seen[tag.Name]
			seen[tag.Name] = true
			badValue := utf8.RuneCountInString(tag.Value) > MaxTagValue
			at := "input.tags." + strconv.Itoa(i)
			if reported[at+".name"] != badName || reported[at+".value"] != badValue {
				t.Fatalf("tag %d %+v: name reported %v, breaks a rule %v; value reported %v, too long %v (%+v)",
					i, tag, reported[at+".name"], badName, reported[at+".value"], badValue, p.list)
			}
			delete(reported, at+".name")
			delete(reported, at+".value")
		}
		if len(reported) > 0 {
			t.Fatalf("problems at fields no tag has: %v", reported)
		}
	})
}

// cloudInitMarkers are the first-line markers of recognisable cloud-init, listed from the rule.
var cloudInitMarkers = []string{"#cloud-config", "#!", "#cloud-boothook", "#cloud-config-archive", "#include", "#part-handler", "## template: jinja"}

// FuzzUserData: accepted user data is exactly the decoded input, within the size cap, and
// recognisable cloud-init (gzip only without an SSH CA); refused user
// data is one problem on input.userData, UNPROCESSABLE only for gzip with a CA, and only for
// a reason that holds.
func FuzzUserData(f *testing.F) {
	enc := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	for _, s := range []string{
		enc("#cloud-config\npackages: [nginx]\n"), enc("#!/bin/sh\necho hi\r\n"), enc("## template: jinja\n#cloud-config"),
		enc("Content-Type: multipart/mixed; boundary=x\n\n--x--"), enc("MIME-Version: 1.0\r\n"), enc("\x1f\x8b\x08\x00"),
		enc("#Cloud-Config\n"), enc("echo hi"), enc(""), enc(" #cloud-config"), "!!!", "I2Nsb3VkLWNvbmZpZw", "I2Nsb3Vk\nLWNvbmZpZw==",
		enc(strings.Repeat("#", MaxUserDataBytes+1)),
	} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, encoded string, withCA bool) {
		var p problems
		data := decodeUserData(&p, encoded, withCA)
		decoded, decodeErr := base64.StdEncoding.DecodeString(encoded)
		gzip := bytes.HasPrefix(decoded, []byte{0x1f, 0x8b})
		first, _, _ := bytes.Cut(decoded, []byte("\n"))
		first = bytes.TrimSuffix(first, []byte("\r"))
		lower := strings.ToLower(string(first))
		recognised := gzip || strings.HasPrefix(lower, "content-type: multipart/") || strings.HasPrefix(lower, "mime-version:") ||
			slices.ContainsFunc(cloudInitMarkers, func(m string) bool { return bytes.HasPrefix(first, []byte(m)) })
		if !p.any() {
			switch {
			case decodeErr != nil:
				t.Fatalf("%q accepted but is not base64: %v", encoded, decodeErr)
			case !bytes.Equal(data, decoded) && len(decoded) > 0:
				t.Fatalf("accepted %q as %q, not as its decoding", encoded, data)
			case len(decoded) == 0 && data != nil:
				t.Fatalf("empty user data returned as %q", data)
			case len(data) > MaxUserDataBytes:
				t.Fatalf("accepted %d bytes, over the cap of %d", len(data), MaxUserDataBytes)
			case len(data) > 0 && (!recognised || gzip && withCA):
				t.Fatalf("accepted %q (ssh CA %v), which the rule refuses", data, withCA)
			}
			return
		}
		if data != nil {
			t.Fatalf("refused user data returned %q", data)
		}
		// The size check before decoding may refuse input padded with line breaks that
		// decodes to less.
		tooLong := len(decoded) > MaxUserDataBytes || len(encoded) > 2*base64.StdEncoding.EncodedLen(MaxUserDataBytes)
		if gzip && withCA && decodeErr == nil && !tooLong {
			onlyProblem(t, p, CodeUnprocessable, path("userData"))
			return
		}
		onlyProblem(t, p, CodeBadUserInput, path("userData"))
		if decodeErr == nil && !tooLong && recognised {
			t.Fatalf("refused %q, which is recognisable cloud-init within the cap: %+v", decoded, p.list)
		}
	})
}

// FuzzSourceCIDR: an allowed source address is accepted exactly when it is a CIDR (as the
// standard library's net.ParseCIDR reads one, bar lengths with a leading zero), and is then
// stored canonical: masked, in the
// family's bounds, containing the address given, and unchanged by validating it again.
func FuzzSourceCIDR(f *testing.F) {
	for _, s := range []string{
		"203.0.113.0/24", "203.0.113.7/24", " 10.0.0.0/8 ", "0.0.0.0/0", "1.2.3.4/32", "1.2.3.4/33", "1.2.3.4",
		"2001:db8::/32", "2001:DB8::1/64", "::/0", "::1/128", "::1/129", "::ffff:1.2.3.4/120", "fe80::1%eth0/64",
		"01.2.3.4/8", "1.2.3.4/08", "1.2.3.4/-1", "", "/", "1.2.3.4/24\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var p problems
		out := checkNetworking(&p, region.Demo(), Networking{AllowedSourceAddresses: []string{s}}, "acme", "web", nil)
		trimmed := strings.TrimSpace(s)
		_, ipnet, stdErr := net.ParseCIDR(trimmed)
		if p.any() {
			onlyProblem(t, p, CodeBadUserInput, path("networking", "allowedSourceAddresses", "0"))
			// net/netip refuses a length written with a leading zero ("/08"), which net reads.
			_, bits, _ := strings.Cut(trimmed, "/")
			if stdErr == nil && !(len(bits) > 1 && bits[0] == '0') {
				t.Fatalf("%q refused, but net.ParseCIDR reads it as %v", s, ipnet)
			}
			return
		}
		if stdErr != nil {
			t.Fatalf("%q accepted as %v, but net.ParseCIDR refuses it: %v", s, out.AllowedSourceAddresses, stdErr)
		}
		if len(out.AllowedSourceAddresses) != 1 {
			t.Fatalf("%q accepted as %v", s, out.AllowedSourceAddresses)
		}
		c := out.AllowedSourceAddresses[0]
		given, _ := netip.ParsePrefix(trimmed)
		prefix, err := netip.ParsePrefix(c)
		switch {
		case err != nil:
			t.Fatalf("%q stored as %q, which does not parse: %v", s, c, err)
		case prefix != prefix.Masked() || prefix.String() != c:
			t.Fatalf("%q stored as %q, which is not canonical (%s)", s, c, prefix.Masked())
		case prefix.Bits() < 0 || prefix.Bits() > prefix.Addr().BitLen():
			t.Fatalf("%q stored as %q, out of its family's bounds", s, c)
		case prefix.Bits() != given.Bits() || !prefix.Contains(given.Addr()):
			t.Fatalf("%q stored as %q, which is not the network of %s", s, c, given)
		}
		var again problems
		if re := checkNetworking(&again, region.Demo(), out, "acme", "web", nil); again.any() || !slices.Equal(re.AllowedSourceAddresses, out.AllowedSourceAddresses) {
			t.Fatalf("%q: validating the stored %q again gives %v %+v", s, c, re.AllowedSourceAddresses, again.list)
		}
	})
}
