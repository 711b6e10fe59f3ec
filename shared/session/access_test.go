package session

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

func authorizedKey(t *testing.T, key any) string {
	t.Helper()
	pub, err := ssh.NewPublicKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub)))
}

// A student's key is one authorized_keys line of an accepted type and
// size, without options; anything else is refused with the reason.
func TestNormalizeStudentKey(t *testing.T) {
	ed, _, err := newKeyPair("")
	if err != nil {
		t.Fatal(err)
	}
	rsa1024, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	rsa2048, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rsaOK, ecOK := authorizedKey(t, &rsa2048.PublicKey), authorizedKey(t, &ec.PublicKey)
	tests := []struct {
		name    string
		in      string
		want    string // normalized; "" = refused
		wantWhy string
	}{
		{"ed25519 with a comment: the comment goes", ed + " ann@laptop", ed, ""},
		{"surrounding space", "  " + ed + "\n", ed, ""},
		{"RSA 2048", rsaOK, rsaOK, ""},
		{"ECDSA P-256", ecOK, ecOK, ""},
		{"empty", "  ", "", "empty"},
		{"two keys on two lines", ed + "\n" + rsaOK, "", "exactly one key, on one line"},
		{"two keys on one line", ed + " c " + rsaOK, "", "exactly one key"},
		{"options", `command="/bin/true" ` + ed, "", "options"},
		{"garbage", "hello world", "", "not an OpenSSH public key"},
		{"private key pasted", "-----BEGIN OPENSSH PRIVATE KEY-----", "", "not an OpenSSH public key"},
		{"too long", ed + " " + strings.Repeat("x", MaxPublicKeyBytes), "", "at most"},
		{"RSA 1024", authorizedKey(t, &rsa1024.PublicKey), "", "at least 2048 bits"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := NormalizeStudentKey(tc.in)
			if tc.want == "" {
				if !errors.Is(err, ErrInvalidKey) || !strings.Contains(err.Error(), tc.wantWhy) {
					t.Fatalf("NormalizeStudentKey = %q, %v; want ErrInvalidKey saying %q", got, err, tc.wantWhy)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("NormalizeStudentKey = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// Every open gives the session its own host key; a student without a key
// of their own gets a generated pair, whose private half only the open's
// response carries and no store ever sees; a student's own key is used as
// is; a bad key refuses the open and creates nothing.
func TestOpenIssuesSessionKeys(t *testing.T) {
	now := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	own, _, err := newKeyPair("")
	if err != nil {
		t.Fatal(err)
	}
	hostKeys := map[string]bool{}
	for _, tc := range []struct {
		name, key   string
		wantPrivate bool
	}{
		{"no key: one is generated", "", true},
		{"own key", own + " me@home", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc, store := newService(t, &fakeCluster{}, &now)
			opened, err := svc.Open(context.Background(), "ann", "shell", tc.key)
			if err != nil {
				t.Fatal(err)
			}
			s := opened.Session
			if (s.Issued.StudentPrivateKey != "") != tc.wantPrivate || s.Issued.HostPrivateKey != "" {
				t.Fatalf("issued %+v; want a student private key %v and never the host key", s.Issued, tc.wantPrivate)
			}
			if tc.wantPrivate {
				signer, err := ssh.ParsePrivateKey([]byte(s.Issued.StudentPrivateKey))
				if err != nil {
					t.Fatal(err)
				}
				if got := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey()))); got != s.StudentKey {
					t.Errorf("private key's public half %q, session's student key %q", got, s.StudentKey)
				}
			} else if s.StudentKey != own {
				t.Errorf("student key %q, want the student's own %q", s.StudentKey, own)
			}
			stored := store.rows[s.ID]
			if stored.HostKey == "" || hostKeys[stored.HostKey] {
				t.Errorf("host key %q: want one of the session's own", stored.HostKey)
			}
			hostKeys[stored.HostKey] = true
			line := stored.KnownHostsLine("10.1.2.3", 22)
			if !strings.HasPrefix(line, "10.1.2.3 ssh-ed25519 ") || stored.KnownHostsLine("10.1.2.3", 2222)[:16] != "[10.1.2.3]:2222 " {
				t.Errorf("known_hosts lines %q / %q", line, stored.KnownHostsLine("10.1.2.3", 2222))
			}
		})
	}
	svc, store := newService(t, &fakeCluster{}, &now)
	if _, err := svc.Open(context.Background(), "bob", "shell", "ssh-dss AAAA"); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("open with a bad key = %v, want ErrInvalidKey", err)
	}
	if len(store.rows) != 0 {
		t.Errorf("a refused open left rows: %v", store.rows)
	}
}
