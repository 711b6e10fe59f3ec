package workspacekey

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var key = Key{Secret: []byte("0123456789abcdef0123456789abcdef"), Env: "prod"}

const sessionA, sessionB = "6f1c9f0e-8a51-4d7e-9a43-0e4f2b7c1d20", "0b7d2e11-3c4f-4a5b-8c6d-7e8f9a0b1c2d"

// hmacOf is the derivation written out independently of Token: hex
// HMAC-SHA256 under secret of input.
func hmacOf(t *testing.T, secret, input string) string {
	t.Helper()
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(input))
	return hex.EncodeToString(m.Sum(nil))
}

// Token is the documented HMAC of use, environment and session; the alert
// credential is the one workspaces held before the cleanup use was added
// (same label and layout), so live sessions' webhooks keep working when the
// key they were derived from is kept.
func TestTokenIsTheDocumentedHMAC(t *testing.T) {
	tests := []struct {
		name    string
		key     Key
		use     Use
		session string
		want    string
	}{
		{"alert", key, Alert, sessionA, hmacOf(t, string(key.Secret), "labkeep guardian alert\x00prod\x00"+sessionA)},
		{"cleanup", key, Cleanup, sessionA, hmacOf(t, string(key.Secret), "labkeep guardian cleanup\x00prod\x00"+sessionA)},
		{"another environment", Key{Secret: key.Secret, Env: "dev"}, Cleanup, sessionA,
			hmacOf(t, string(key.Secret), "labkeep guardian cleanup\x00dev\x00"+sessionA)},
		{"no key derives nothing", Key{Env: "prod"}, Cleanup, sessionA, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, tt.key.Token(tt.use, tt.session)); diff != "" {
				t.Errorf("Token (-want +got):\n%s", diff)
			}
		})
	}
}

// A token is worth its own use, session, environment and key alone: a
// workspace's cleanup token (which its root can read) opens no other
// session's guardian and is no alert credential.
func TestVerifyAcceptsOnlyItsOwnUseAndSession(t *testing.T) {
	cleanupA := key.Token(Cleanup, sessionA)
	tests := []struct {
		name    string
		key     Key
		use     Use
		session string
		token   string
		want    bool
	}{
		{"its own session", key, Cleanup, sessionA, cleanupA, true},
		{"another session", key, Cleanup, sessionB, cleanupA, false},
		{"another use", key, Alert, sessionA, cleanupA, false},
		{"another environment", Key{Secret: key.Secret, Env: "dev"}, Cleanup, sessionA, cleanupA, false},
		{"another secret", Key{Secret: []byte("another secret, 32 bytes long!!!"), Env: "prod"}, Cleanup, sessionA, cleanupA, false},
		{"no key", Key{}, Cleanup, sessionA, Key{}.Token(Cleanup, sessionA), false},
		{"empty token", key, Cleanup, sessionA, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, tt.key.Verify(tt.use, tt.session, tt.token)); diff != "" {
				t.Errorf("Verify (-want +got):\n%s", diff)
			}
		})
	}
}
