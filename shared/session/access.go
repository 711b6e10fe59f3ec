package session

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// ErrInvalidKey: the public key sent with an open is not one key labkeep
// accepts (type, size, one key, no options).
var ErrInvalidKey = errors.New("invalid_public_key")

// Limits of a student's public key.
const (
	// MaxPublicKeyBytes bounds the authorized_keys line a student may send
	// (an RSA 16384-bit key is about 2.8 KB).
	MaxPublicKeyBytes = 4096
	// MinRSABits is the smallest RSA key accepted.
	MinRSABits = 2048
)

// Issued holds the secrets an Open creates for a session. They exist only
// in the value Open returns (and, for the host key, in the node's Secret in
// the cluster): labkeep never stores them and can never show them again.
type Issued struct {
	// StudentPrivateKey is the private key (OpenSSH PEM) of the key pair
	// labkeep generated because the student sent no public key; empty
	// when the student brought their own.
	StudentPrivateKey string
	// HostPrivateKey is the session's SSH host key (OpenSSH PEM), which
	// every node of the session presents.
	HostPrivateKey string
}

// NormalizeStudentKey validates a student's public key and returns it as
// one authorized_keys line without options or comment: exactly one key of
// type ed25519, ECDSA, a FIDO security key, or RSA of at least MinRSABits,
// at most MaxPublicKeyBytes long. Errors wrap ErrInvalidKey and say why.
func NormalizeStudentKey(line string) (string, error) {
	line = strings.TrimSpace(line)
	switch {
	case line == "":
		return "", fmt.Errorf("%w: the key is empty", ErrInvalidKey)
	case len(line) > MaxPublicKeyBytes:
		return "", fmt.Errorf("%w: the key is %d bytes, at most %d are accepted", ErrInvalidKey, len(line), MaxPublicKeyBytes)
	case strings.ContainsAny(line, "\r\n"):
		return "", fmt.Errorf("%w: send exactly one key, on one line", ErrInvalidKey)
	}
	pub, comment, options, rest, err := ssh.ParseAuthorizedKey([]byte(line))
	switch {
	case err != nil:
		return "", fmt.Errorf("%w: not an OpenSSH public key (\"ssh-ed25519 AAAA…\")", ErrInvalidKey)
	case len(options) > 0:
		return "", fmt.Errorf("%w: authorized_keys options are not accepted", ErrInvalidKey)
	case len(strings.TrimSpace(string(rest))) > 0 || holdsKey(comment):
		return "", fmt.Errorf("%w: send exactly one key", ErrInvalidKey)
	}
	switch pub.Type() {
	case ssh.KeyAlgoED25519, ssh.KeyAlgoECDSA256, ssh.KeyAlgoECDSA384, ssh.KeyAlgoECDSA521,
		ssh.KeyAlgoSKED25519, ssh.KeyAlgoSKECDSA256:
	case ssh.KeyAlgoRSA:
		ck, ok := pub.(ssh.CryptoPublicKey)
		if !ok {
			return "", fmt.Errorf("%w: unreadable RSA key", ErrInvalidKey)
		}
		rk, ok := ck.CryptoPublicKey().(*rsa.PublicKey)
		if !ok || rk.N.BitLen() < MinRSABits {
			return "", fmt.Errorf("%w: RSA keys must have at least %d bits", ErrInvalidKey, MinRSABits)
		}
	default:
		return "", fmt.Errorf("%w: key type %s is not accepted; use ssh-ed25519, ECDSA or RSA (at least %d bits)", ErrInvalidKey, pub.Type(), MinRSABits)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub))), nil
}

// holdsKey reports whether a key's comment is, from some word on, another
// key: two keys pasted on one line, of which sshd would use the first only.
func holdsKey(comment string) bool {
	words := strings.Fields(comment)
	for i := range words {
		if _, _, _, _, err := ssh.ParseAuthorizedKey([]byte(strings.Join(words[i:], " "))); err == nil {
			return true
		}
	}
	return false
}

// newKeyPair generates an ed25519 key pair: the public key as an
// authorized_keys line and the private key in OpenSSH PEM format.
func newKeyPair(comment string) (public, private string, err error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", "", err
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		return "", "", err
	}
	block, err := ssh.MarshalPrivateKey(priv, comment)
	if err != nil {
		return "", "", err
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sshPub))), string(pem.EncodeToMemory(block)), nil
}

// KnownHostsLine is the known_hosts line that verifies a node of the
// session at host:port: the session's host key under that address, so
// `ssh -o StrictHostKeyChecking=yes` trusts the first connection only if
// the node presents exactly that key. Empty until host is known.
func (s Session) KnownHostsLine(host string, port int32) string {
	if host == "" || s.HostKey == "" {
		return ""
	}
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(s.HostKey))
	if err != nil {
		return ""
	}
	addr := host
	if port != 22 && port != 0 {
		addr = net.JoinHostPort(host, strconv.Itoa(int(port)))
	}
	return knownhosts.Line([]string{knownhosts.Normalize(addr)}, pub)
}
