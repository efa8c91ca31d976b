// Package sshtest makes SSH keys for tests.
package sshtest

import (
	"crypto/ed25519"
	"crypto/rand"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
)

// Signer returns a new ed25519 key to sign with: a user's own key, an SSH certificate
// authority's.
func Signer(tb testing.TB) ssh.Signer {
	tb.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		tb.Fatal(err)
	}
	return signer
}

// PublicKey returns a new ed25519 public key as an authorized_keys line without a comment or a
// newline: a key for a catalogue's SSH certificate authority, or one a user hands in.
func PublicKey(tb testing.TB) string {
	tb.Helper()
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(Signer(tb).PublicKey())))
}
