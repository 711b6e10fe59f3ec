package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"labkeep/shared/session"
)

// Roles a token may carry.
const (
	RoleStudent = "student"
	RoleAdmin   = "admin"
)

// Principal is the authenticated caller.
type Principal struct {
	// Subject is the token's sub: the student id (or the admin's id).
	Subject string
	Role    string
}

// Admin reports whether the caller may act on any student's session.
func (p Principal) Admin() bool { return p.Role == RoleAdmin }

// Actor is who the caller is when they end a session.
func (p Principal) Actor() session.Actor {
	if p.Admin() {
		return session.ActorAdmin
	}
	return session.ActorStudent
}

// Claims are the JWT claims the portal signs: sub, role and exp.
type Claims struct {
	Role string `json:"role"`
	jwt.RegisteredClaims
}

// Authenticator verifies the portal's HS256 tokens with the shared secret.
type Authenticator struct {
	secret []byte
	now    func() time.Time
}

// NewAuthenticator returns an Authenticator for secret; now is the clock
// used for exp checks.
func NewAuthenticator(secret []byte, now func() time.Time) *Authenticator {
	return &Authenticator{secret: secret, now: now}
}

// Authenticate returns the caller of r. Returns ErrUnauthorized (with the
// reason) if the Authorization header is missing or not a Bearer token, or
// the token is not HS256 with our secret, is expired, or lacks exp, sub or
// a known role.
func (a *Authenticator) Authenticate(r *http.Request) (Principal, error) {
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if h == "" {
		return Principal{}, fmt.Errorf("%w: missing Authorization header", ErrUnauthorized)
	}
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return Principal{}, fmt.Errorf("%w: Authorization must be \"Bearer <token>\"", ErrUnauthorized)
	}
	var c Claims
	_, err := jwt.ParseWithClaims(strings.TrimSpace(token), &c, func(*jwt.Token) (any, error) { return a.secret, nil },
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
		jwt.WithExpirationRequired(),
		jwt.WithTimeFunc(a.now),
	)
	switch {
	case errors.Is(err, jwt.ErrTokenExpired):
		return Principal{}, fmt.Errorf("%w: token expired", ErrUnauthorized)
	case err != nil:
		return Principal{}, fmt.Errorf("%w: invalid token: %v", ErrUnauthorized, err)
	case c.Subject == "":
		return Principal{}, fmt.Errorf("%w: token has no sub", ErrUnauthorized)
	case c.Role != RoleStudent && c.Role != RoleAdmin:
		return Principal{}, fmt.Errorf("%w: token role %q is neither %q nor %q", ErrUnauthorized, c.Role, RoleStudent, RoleAdmin)
	}
	return Principal{Subject: c.Subject, Role: c.Role}, nil
}

// Sign makes a token the portal would send: HS256 with secret, for
// subject and role, expiring at exp. Used by `make run` and tests.
func Sign(secret []byte, subject, role string, exp time.Time) (string, error) {
	return jwt.NewWithClaims(jwt.SigningMethodHS256, Claims{
		Role:             role,
		RegisteredClaims: jwt.RegisteredClaims{Subject: subject, ExpiresAt: jwt.NewNumericDate(exp)},
	}).SignedString(secret)
}
