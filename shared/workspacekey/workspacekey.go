// Package workspacekey derives the credentials a workspace Pod's guardian
// holds for its own session: the alert webhook's (shared/alerts) and the
// cleanup token of guardian's POST /cleanup (shared/terminal calls it,
// shared/kube puts it into the session's Secret).
//
// Each is an HMAC of the session id under labkeep's workspace key
// (LABKEEP_WORKSPACE_KEY), a secret of its own, not the portal's JWT
// secret: the workspace's root can read its own session's credentials
// (the cleanup token sits in the session's Secret, which the workspace
// mounts; a program bound to guardian's port while guardian restarts
// receives it), so a credential must be worth that one session and
// nothing else. Derived, not stored: nothing secret sits in the database
// or in a Secret shared by sessions, and a token of one session (or of one
// environment sharing the key) opens nothing for another.
package workspacekey

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
)

// MinSecretBytes is the shortest workspace key accepted.
const MinSecretBytes = 32

// Use is what a credential is for; each use derives different tokens from
// the same key, so an alert credential is no cleanup token.
type Use string

// The credentials guardian holds. The labels are part of every derived
// token: changing one invalidates every credential live workspaces hold.
const (
	// Alert is guardian's webhook credential (GUARDIAN_WEBHOOK_URL).
	Alert Use = "labkeep guardian alert"
	// Cleanup is guardian's cleanup token (GUARDIAN_CLEANUP_TOKEN).
	Cleanup Use = "labkeep guardian cleanup"
)

// Key derives the per-session workspace credentials. Its zero value
// derives none (Enabled is false).
type Key struct {
	// Secret is labkeep's workspace key; Env is the environment, so two
	// environments sharing a key still give a session different tokens.
	Secret []byte
	Env    string
}

// Enabled reports whether the key can derive tokens.
func (k Key) Enabled() bool { return len(k.Secret) > 0 }

// Token is session's credential for use: hex HMAC-SHA256 of the use, the
// environment and the session id, NUL-separated (no label, environment
// or session id holds a NUL, so no two inputs read alike). A zero Key
// gives "" (no credential, never an HMAC under an empty key).
func (k Key) Token(use Use, session string) string {
	if !k.Enabled() {
		return ""
	}
	m := hmac.New(sha256.New, k.Secret)
	m.Write([]byte(string(use) + "\x00" + k.Env + "\x00" + session))
	return hex.EncodeToString(m.Sum(nil))
}

// Verify reports, in constant time, whether token is session's for use.
func (k Key) Verify(use Use, session, token string) bool {
	return k.Enabled() && hmac.Equal([]byte(k.Token(use, session)), []byte(token))
}
