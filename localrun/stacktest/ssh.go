package stacktest

import (
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// StrictHosts is an SSH host-key check that trusts only the known_hosts
// lines (a session's knownHosts line), as `ssh -o
// StrictHostKeyChecking=yes` with that file would.
func StrictHosts(t testing.TB, lines ...string) ssh.HostKeyCallback {
	t.Helper()
	f := filepath.Join(t.TempDir(), "known_hosts")
	if err := os.WriteFile(f, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cb, err := knownhosts.New(f)
	if err != nil {
		t.Fatal(err)
	}
	return cb
}

// SSHRun runs cmd over SSH as user at addr with key, checking the host
// key with hosts, and returns its combined output, trimmed.
func SSHRun(addr, user string, key ssh.Signer, hosts ssh.HostKeyCallback, cmd string) (string, error) {
	c, err := ssh.Dial("tcp", addr, &ssh.ClientConfig{
		User: user, Auth: []ssh.AuthMethod{ssh.PublicKeys(key)}, HostKeyCallback: hosts, Timeout: 15 * time.Second,
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	s, err := c.NewSession()
	if err != nil {
		return "", err
	}
	defer s.Close()
	out, err := s.CombinedOutput(cmd)
	return strings.TrimSpace(string(out)), err
}

// NewKey is a fresh ed25519 key, as a student's own.
func NewKey(t testing.TB) ssh.Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	k, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// BuildStatic builds the command pkg as a static binary (it runs in any
// container or guest, whatever its C library) and returns its path.
func BuildStatic(t testing.TB, pkg string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}
