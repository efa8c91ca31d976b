package server

import (
	"context"
	"crypto/dsa"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"maps"
	"slices"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/redistest"
	"github.com/computeql/computeql/region"
)

// authorizedKey returns the authorized_keys line of a public key, with the comment.
func authorizedKey(tb testing.TB, pub any, comment string) string {
	tb.Helper()
	k, err := ssh.NewPublicKey(pub)
	if err != nil {
		tb.Fatal(err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k))) + " " + comment
}

// testKeys makes one key of each kind a test needs.
type testKeys struct {
	ed25519, ecdsa, rsa2048, rsa1024, dsa string
}

func newTestKeys(tb testing.TB) testKeys {
	tb.Helper()
	edPub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	rsaKey := func(bits int) *rsa.PublicKey {
		// Go refuses to generate RSA keys under 1024 bits, and 1024 is enough to be refused.
		k, err := rsa.GenerateKey(rand.Reader, bits)
		if err != nil {
			tb.Fatal(err)
		}
		return &k.PublicKey
	}
	var d dsa.PrivateKey
	if err := dsa.GenerateParameters(&d.Parameters, rand.Reader, dsa.L1024N160); err != nil {
		tb.Fatal(err)
	}
	if err := dsa.GenerateKey(&d, rand.Reader); err != nil {
		tb.Fatal(err)
	}
	return testKeys{
		ed25519: authorizedKey(tb, edPub, "ed@laptop"),
		ecdsa:   `from="10.0.0.0/8" ` + authorizedKey(tb, &ec.PublicKey, "ec@ci"),
		rsa2048: authorizedKey(tb, rsaKey(2048), "rsa@old-box"),
		rsa1024: authorizedKey(tb, rsaKey(1024), "weak"),
		dsa:     authorizedKey(tb, &d.PublicKey, "ancient"),
	}
}

const sshKeysCreate = `mutation($in: CreateInstanceInput!) { createInstance(input: $in) {
  instance { id sshPublicKeys generation } userErrors { field code message } } }`

const sshKeysUpdate = `mutation($in: UpdateInstanceInput!) { updateInstance(input: $in) {
  instance { id sshPublicKeys generation } userErrors { field code message } } }`

// sshKeysPayload is a create or update payload as the documents above select it.
type sshKeysPayload struct {
	Instance *struct {
		ID            string   `json:"id"`
		SSHPublicKeys []string `json:"sshPublicKeys"`
	} `json:"instance"`
	UserErrors []userError `json:"userErrors"`
}

// TestSSHPublicKeys: Ed25519, ECDSA (with options) and RSA of 2048 bits are accepted, shown
// on the instance and given to its server; a DSA key, a short RSA key, garbage, two keys on
// one line, a duplicate, too many or too long keys are refused by index with BAD_USER_INPUT,
// writing nothing; changing the keys later rebuilds the server and needs allowRebuild.
func TestSSHPublicKeys(t *testing.T) {
	a := newAPI(t)
	tok := a.admin(t)
	keys := newTestKeys(t)
	send := func(t *testing.T, doc, field string, in map[string]any) (*gqlResponse, sshKeysPayload) {
		t.Helper()
		res := a.post(t, tok, doc, map[string]any{"in": in})
		var p sshKeysPayload
		if res.Data != nil && res.Data[field] != nil {
			decode(t, res.Data[field], &p)
		}
		return res, p
	}
	refused := func(t *testing.T, doc, field string, in map[string]any, want ...fieldCode) {
		t.Helper()
		before := redistest.State(t, a.rdb)
		res, p := send(t, doc, field, in)
		wantUserErrors(t, res, payload{UserErrors: p.UserErrors}, want...)
		if !maps.Equal(before, redistest.State(t, a.rdb)) {
			t.Error("refused SSH public keys changed Redis")
		}
	}
	keysOf := func(name string, ks ...string) map[string]any {
		return with(name, map[string]any{"sshPublicKeys": ks})
	}

	good := []string{keys.ed25519, "  " + keys.ecdsa + "\n", keys.rsa2048}
	res, p := send(t, sshKeysCreate, "createInstance", keysOf("keyed", good...))
	if p.Instance == nil {
		t.Fatalf("create with good keys: %s", res.Raw)
	}
	trimmed := []string{keys.ed25519, keys.ecdsa, keys.rsa2048}
	if !slices.Equal(p.Instance.SSHPublicKeys, trimmed) {
		t.Errorf("sshPublicKeys %q, want the keys trimmed %q", p.Instance.SSHPublicKeys, trimmed)
	}
	id := p.Instance.ID

	bad := func(i int) fieldCode { return fc("BAD_USER_INPUT", "input", "sshPublicKeys", string(rune('0'+i))) }
	refused(t, sshKeysCreate, "createInstance", keysOf("dsa", keys.ed25519, keys.dsa), bad(1))
	refused(t, sshKeysCreate, "createInstance", keysOf("weak", keys.rsa1024), bad(0))
	refused(t, sshKeysCreate, "createInstance", keysOf("garbage", "ssh-ed25519 not-base64!", ""), bad(0), bad(1))
	refused(t, sshKeysCreate, "createInstance", keysOf("two", keys.ed25519+"\n"+keys.rsa2048), bad(0))
	refused(t, sshKeysCreate, "createInstance", keysOf("dup", keys.ed25519, strings.Replace(keys.ed25519, "ed@laptop", "other", 1)), bad(1))
	refused(t, sshKeysCreate, "createInstance", keysOf("long", keys.ed25519+" "+strings.Repeat("c", 4<<10)), bad(0))
	many := make([]string, 17)
	for i := range many {
		edPub, _, _ := ed25519.GenerateKey(rand.Reader)
		many[i] = authorizedKey(t, edPub, "k")
	}
	refused(t, sshKeysCreate, "createInstance", keysOf("many", many...), fc("BAD_USER_INPUT", "input", "sshPublicKeys"))
	// 16 keys of 1.2 KiB each are within the count and each key's bound, not the total's.
	long := make([]string, 16)
	for i := range long {
		long[i] = many[i] + " " + strings.Repeat("c", 1200)
	}
	refused(t, sshKeysCreate, "createInstance", keysOf("total", long...), fc("BAD_USER_INPUT", "input", "sshPublicKeys"))

	// The workers run only until the server is made: the refusals below compare all of
	// Redis before and after.
	stop := a.runWorkers(t)
	var srv region.Server
	eventually.Holds(t, verbLimit, func() bool {
		servers, err := a.region.FindServers(context.Background(), region.Scope{OrganizationID: "acme", ProjectID: "web", RegionID: "eu-west", NetworkID: "net-acme-web-eu"},
			region.InstanceTag, id)
		if err == nil && len(servers) == 1 {
			srv = servers[0]
		}
		return srv.ID != ""
	}, "a server for %s", id)
	stop()
	if !slices.Equal(srv.SSHPublicKeys, trimmed) {
		t.Errorf("the server was given %q, want %q", srv.SSHPublicKeys, trimmed)
	}

	t.Run("update", func(t *testing.T) {
		refused(t, sshKeysUpdate, "updateInstance", map[string]any{"id": id, "sshPublicKeys": []string{keys.ed25519}},
			fc("UNPROCESSABLE", "input", "sshPublicKeys"))
		refused(t, sshKeysUpdate, "updateInstance", map[string]any{"id": id, "sshPublicKeys": []string{keys.dsa}, "allowRebuild": true},
			bad(0))
		// The same keys again change nothing: no rebuild, no consent needed.
		if res, p := send(t, sshKeysUpdate, "updateInstance", map[string]any{"id": id, "sshPublicKeys": good}); p.Instance == nil {
			t.Errorf("the same keys again: %s", res.Raw)
		}
		res, p := send(t, sshKeysUpdate, "updateInstance", map[string]any{"id": id, "sshPublicKeys": []string{}, "allowRebuild": true})
		if p.Instance == nil || len(p.Instance.SSHPublicKeys) != 0 {
			t.Fatalf("removing the keys: %s", res.Raw)
		}
	})
}
