// Package sshtest makes SSH keys for tests.
package sshtest

import (
	"crypto/ed25519"
	"crypto/rand"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
)

// PublicKey returns a new ed25519 public key as an authorized_keys line without a comment or a
// newline: a key for a catalogue's SSH certificate authority, or one a user hands in.
func PublicKey(tb testing.TB) string {
	tb.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	key, err := ssh.NewPublicKey(pub)
	if err != nil {
		tb.Fatal(err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(key)))
}
