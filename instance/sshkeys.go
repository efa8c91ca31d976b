package instance

import (
	"crypto/rsa"
	"strconv"
	"strings"
	"unicode"

	"golang.org/x/crypto/ssh"
)

// Bounds on sshPublicKeys. A key line of the largest RSA keys in use (8192 bits) with a
// comment is under 2 KiB; the total keeps the instance record, which every event copies,
// small.
const (
	MaxSSHPublicKeys      = 16
	MaxSSHPublicKeyBytes  = 4 << 10
	MaxSSHPublicKeysBytes = 16 << 10
	// MinRSABits is the smallest RSA key accepted, as OpenSSH 9 refuses smaller ones.
	MinRSABits = 2048
)

// sshKeyTypes are the key types accepted, by the name an authorized_keys line gives them:
// Ed25519 and ECDSA, on security keys too, and RSA of MinRSABits or more. DSA is refused
// (OpenSSH removed it), and so are certificates, which a certificate authority signs instead.
var sshKeyTypes = map[string]bool{
	ssh.KeyAlgoED25519: true, ssh.KeyAlgoSKED25519: true,
	ssh.KeyAlgoECDSA256: true, ssh.KeyAlgoECDSA384: true, ssh.KeyAlgoECDSA521: true, ssh.KeyAlgoSKECDSA256: true,
	ssh.KeyAlgoRSA: true,
}

// checkSSHPublicKeys checks OpenSSH authorized_keys lines, one key each (options such as
// from="…" allowed), and returns them trimmed; each problem names the key by its index.
func checkSSHPublicKeys(p *problems, keys []string) []string {
	if len(keys) > MaxSSHPublicKeys {
		p.add(CodeBadUserInput, path("sshPublicKeys"), "at most %d SSH public keys are allowed", MaxSSHPublicKeys)
		return nil
	}
	out := make([]string, 0, len(keys))
	total := 0
	seen := map[string]int{}
	for i, line := range keys {
		f := path("sshPublicKeys", strconv.Itoa(i))
		line = strings.TrimSpace(line)
		total += len(line)
		if len(line) > MaxSSHPublicKeyBytes {
			p.add(CodeBadUserInput, f, "SSH public key %d is longer than %d bytes", i, MaxSSHPublicKeyBytes)
			continue
		}
		if why := sshKeyProblem(line); why != "" {
			p.add(CodeBadUserInput, f, "SSH public key %d %s", i, why)
			continue
		}
		key, _, _, _, _ := ssh.ParseAuthorizedKey([]byte(line)) // sshKeyProblem parsed it
		if j, dup := seen[string(key.Marshal())]; dup {
			p.add(CodeBadUserInput, f, "SSH public key %d is the same key as key %d", i, j)
			continue
		}
		seen[string(key.Marshal())] = i
		out = append(out, line)
	}
	if total > MaxSSHPublicKeysBytes {
		p.add(CodeBadUserInput, path("sshPublicKeys"), "the SSH public keys are longer than %d bytes in all", MaxSSHPublicKeysBytes)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// sshKeyProblem says what is wrong with an authorized_keys line, "" for nothing.
func sshKeyProblem(line string) string {
	if line == "" {
		return "is empty"
	}
	for _, r := range line {
		if unicode.IsControl(r) && r != '\t' {
			return "must be one line of printable characters"
		}
	}
	key, _, _, rest, err := ssh.ParseAuthorizedKey([]byte(line))
	if err != nil {
		return "is not an OpenSSH public key (an authorized_keys line such as \"ssh-ed25519 AAAA… comment\")"
	}
	if len(rest) > 0 {
		return "must be a single key"
	}
	if !sshKeyTypes[key.Type()] {
		return "is of type " + key.Type() + ", which is not accepted: use Ed25519, ECDSA or RSA of at least " + strconv.Itoa(MinRSABits) + " bits"
	}
	if ck, ok := key.(ssh.CryptoPublicKey); ok {
		if rk, ok := ck.CryptoPublicKey().(*rsa.PublicKey); ok && rk.N.BitLen() < MinRSABits {
			return "is an RSA key of " + strconv.Itoa(rk.N.BitLen()) + " bits: at least " + strconv.Itoa(MinRSABits) + " are needed"
		}
	}
	return ""
}
