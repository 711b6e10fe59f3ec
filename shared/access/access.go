// Package access is who calls labkeep's API and how a request is refused
// short of any domain's rule: the caller (Principal, with its role)
// authenticated from the portal's HS256 token (Authenticator, under
// TokenRules), and the refusals every API endpoint shares (ErrUnauthorized,
// ErrForbidden, ErrBadRequest, ...). The HTTP adapters — the session
// functions (httpapi) and the web terminal (terminal) — both authenticate
// and refuse through it, so neither imports the other; httpapi's error
// table stays the one place that gives each refusal its status.
package access

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"labkeep/shared/session"
	"labkeep/shared/setting"
)

// Refusals of a request that are no domain's own; their text is the
// API's error code.
var (
	ErrUnauthorized     = errors.New("unauthorized")
	ErrForbidden        = errors.New("forbidden")
	ErrBadRequest       = errors.New("bad_request")
	ErrTooLarge         = errors.New("too_large")
	ErrUnsupportedMedia = errors.New("unsupported_media_type")
	ErrMethodNotAllowed = errors.New("method_not_allowed")
	ErrNotFound         = errors.New("not_found")
	// ErrBadGateway: a component labkeep called on the student's behalf
	// (a workspace Pod's guardian, a home's reader) refused or failed.
	ErrBadGateway = errors.New("bad_gateway")
)

// Roles a token may carry. An instructor opens their own sessions as a
// student of no course (SeatsIn) and books, lists and cancels the class
// reservations of the courses their token lists (Teaches); an admin acts
// on everything.
const (
	RoleStudent    = "student"
	RoleInstructor = "instructor"
	RoleAdmin      = "admin"
)

// roles are the roles a token may carry, as a refusal names them.
var roles = []string{RoleStudent, RoleInstructor, RoleAdmin}

// Principal is the authenticated caller.
type Principal struct {
	// Subject is the token's sub: the student id (or the admin's id).
	Subject string
	Role    string
	// Courses are the courses the caller is a member of, from the claim
	// TokenRules.CoursesClaim names: a course's reserved seats are theirs,
	// and an instructor teaches them.
	Courses []string
}

// Admin reports whether the caller may act on any student's session.
func (p Principal) Admin() bool { return p.Role == RoleAdmin }

// SeatsIn are the courses whose reserved seats the caller takes when they
// open a lab for themself: a student's courses. An instructor's courses
// are those they teach, and a class's seats are its students': an
// instructor (or an admin) opens in the general line.
func (p Principal) SeatsIn() []string {
	if p.Role != RoleStudent {
		return nil
	}
	return p.Courses
}

// Books reports whether the caller may book class reservations at all:
// an admin or an instructor.
func (p Principal) Books() bool { return p.Role == RoleAdmin || p.Role == RoleInstructor }

// Teaches reports whether the caller may book, see and cancel course's
// reservations: an admin any course's, an instructor only those of the
// courses their token lists.
func (p Principal) Teaches(course string) bool {
	taught := p.Taught()
	return taught == nil || slices.Contains(taught, course)
}

// Taught are the courses whose reservations the caller may book, see and
// cancel: nil for every course (an admin), else the instructor's own
// (none, never nil, for anyone else).
func (p Principal) Taught() []string {
	switch {
	case p.Admin():
		return nil
	case p.Role == RoleInstructor && p.Courses != nil:
		return p.Courses
	}
	return []string{}
}

// Actor is who the caller is when they end a session.
func (p Principal) Actor() session.Actor {
	if p.Admin() {
		return session.ActorAdmin
	}
	return session.ActorStudent
}

// Claims are the JWT claims the portal signs: sub, role and exp; iat, and
// iss and aud where the deployment requires them; the student's courses
// under the claim the deployment names (TokenRules.CoursesClaim).
type Claims struct {
	Role string `json:"role"`
	jwt.RegisteredClaims
	// Extra are the token's other claims by name, the courses claim among
	// them.
	Extra map[string]any `json:"-"`
}

// MarshalJSON writes the claims with Extra beside the named ones (a name
// of both keeps the named claim).
func (c Claims) MarshalJSON() ([]byte, error) {
	type plain Claims
	b, err := json.Marshal(plain(c))
	if err != nil || len(c.Extra) == 0 {
		return b, err
	}
	all := map[string]any{}
	if err := json.Unmarshal(b, &all); err != nil {
		return nil, err
	}
	for k, v := range c.Extra {
		if _, named := all[k]; !named {
			all[k] = v
		}
	}
	return json.Marshal(all)
}

// UnmarshalJSON reads the named claims and keeps every claim in Extra.
func (c *Claims) UnmarshalJSON(b []byte) error {
	type plain Claims
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	var all map[string]any
	if err := json.Unmarshal(b, &all); err != nil {
		return err
	}
	*c = Claims(p)
	c.Extra = all
	return nil
}

// courses reads the courses claim name of c: a list of strings, or one
// string (some identity providers write a single group so); absent is no
// course. Empty names are dropped.
func (c Claims) courses(name string) ([]string, error) {
	v, ok := c.Extra[name]
	if name == "" || !ok || v == nil {
		return nil, nil
	}
	var out []string
	switch v := v.(type) {
	case string:
		out = []string{v}
	case []any:
		for _, e := range v {
			s, ok := e.(string)
			if !ok {
				return nil, fmt.Errorf("claim %s must be a list of strings, and holds %T", name, e)
			}
			out = append(out, s)
		}
	default:
		return nil, fmt.Errorf("claim %s must be a list of strings, and is %T", name, v)
	}
	return slices.DeleteFunc(out, func(s string) bool { return s == "" }), nil
}

// Defaults of TokenRules.
const (
	// DefaultTokenMaxLifetime is as long as a portal login day: a token
	// that leaks is useless a day later at most.
	DefaultTokenMaxLifetime = 24 * time.Hour
	// DefaultTokenLeeway absorbs ordinary clock skew between the portal
	// and the functions.
	DefaultTokenLeeway = 30 * time.Second
	// MaxTokenLeeway is the largest leeway accepted: more is not clock
	// skew but a second, unbounded lifetime.
	MaxTokenLeeway = 5 * time.Minute
)

// TokenRules are what a token must satisfy besides its HS256 signature,
// sub and role. Field names are the setting names Validate reports.
type TokenRules struct {
	// Audience, when set, must be one of the token's aud values; a token
	// without aud is refused. Set it when the secret is shared with
	// anything but this portal, so a token made for another service is
	// not accepted here.
	Audience string
	// Issuer, when set, must be the token's iss; a token without iss is
	// refused.
	Issuer string
	// MaxLifetime bounds how long any token may be valid. A token with
	// iat may have exp − iat up to MaxLifetime: the life its issuer gave
	// it, the same at every check, so a token is acceptable for its whole
	// life or never. A token without iat has no issue time to measure
	// from, so what it has left is bounded instead: exp − now up to
	// MaxLifetime + Leeway (a leaked long-lived token is refused until its
	// remaining life is no longer than one a compliant issuer could mint).
	MaxLifetime time.Duration
	// Leeway is the clock skew tolerated in every time check: exp, nbf
	// and iat (an iat in the future beyond it is refused), and exp − now.
	Leeway time.Duration
	// CoursesClaim names the claim that lists the courses a student is a
	// member of (a list of strings; groups by default, as identity
	// providers commonly write it); empty reads none.
	CoursesClaim string
}

// registered are the claims whose meaning is fixed: none of them lists
// courses.
var registered = []string{"iss", "sub", "aud", "exp", "nbf", "iat", "jti", "role"}

// DefaultTokenRules are the rules with every default: no audience or
// issuer required, courses in groups.
func DefaultTokenRules() TokenRules {
	return TokenRules{MaxLifetime: DefaultTokenMaxLifetime, Leeway: DefaultTokenLeeway, CoursesClaim: "groups"}
}

// Validate reports every invalid rule as a *setting.Error naming its field.
func (r TokenRules) Validate() error {
	var errs []error
	for _, f := range []struct{ field, value string }{{"Audience", r.Audience}, {"Issuer", r.Issuer}} {
		if strings.TrimSpace(f.value) != f.value {
			errs = append(errs, setting.Invalid(f.field, "%q has leading or trailing white space, which no token's claim would match", f.value))
		}
	}
	// JSON matches names regardless of case: "Role" would fill role.
	if slices.ContainsFunc(registered, func(n string) bool { return strings.EqualFold(n, r.CoursesClaim) }) {
		errs = append(errs, setting.Invalid("CoursesClaim", "%q is a claim of its own meaning, not a list of courses", r.CoursesClaim))
	}
	errs = append(errs, setting.Positive("MaxLifetime", r.MaxLifetime))
	switch {
	case r.Leeway < 0:
		errs = append(errs, setting.Invalid("Leeway", "must not be negative, got %s", r.Leeway))
	case r.Leeway > MaxTokenLeeway:
		errs = append(errs, setting.Invalid("Leeway", "%s exceeds %s: a leeway that long is not clock skew but extra token lifetime", r.Leeway, MaxTokenLeeway))
	}
	return errors.Join(errs...)
}

// Issue makes a token as a portal following r would: iss and aud as r
// requires, iat now and exp now + MaxLifetime, and courses, if any, under
// CoursesClaim. Used by `make run` and tests.
func (r TokenRules) Issue(secret []byte, subject, role string, now time.Time, courses ...string) (string, error) {
	c := Claims{Role: role, RegisteredClaims: jwt.RegisteredClaims{
		Subject: subject, Issuer: r.Issuer,
		IssuedAt: jwt.NewNumericDate(now), ExpiresAt: jwt.NewNumericDate(now.Add(r.MaxLifetime)),
	}}
	if len(courses) > 0 && r.CoursesClaim != "" {
		c.Extra = map[string]any{r.CoursesClaim: courses}
	}
	if r.Audience != "" {
		c.Audience = jwt.ClaimStrings{r.Audience}
	}
	return sign(secret, c)
}

// Authenticator verifies the portal's HS256 tokens with the shared secret.
type Authenticator struct {
	secret []byte
	rules  TokenRules
	now    func() time.Time
	// timely checks exp, nbf, iat, aud and iss at every use.
	timely *jwt.Validator
	// read are the tokens whose signature and fixed claims were checked
	// already in this process.
	read readTokens
}

// NewAuthenticator returns an Authenticator for secret under
// DefaultTokenRules; now is the clock of every time check.
func NewAuthenticator(secret []byte, now func() time.Time) *Authenticator {
	return newAuthenticator(secret, DefaultTokenRules(), now)
}

// Authenticator returns an Authenticator for secret that enforces r; now
// is the clock of every time check. Invalid rules are an error.
func (r TokenRules) Authenticator(secret []byte, now func() time.Time) (*Authenticator, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return newAuthenticator(secret, r, now), nil
}

func newAuthenticator(secret []byte, r TokenRules, now func() time.Time) *Authenticator {
	opts := []jwt.ParserOption{jwt.WithExpirationRequired(), jwt.WithIssuedAt(), jwt.WithLeeway(r.Leeway), jwt.WithTimeFunc(now)}
	if r.Audience != "" {
		opts = append(opts, jwt.WithAudience(r.Audience))
	}
	if r.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(r.Issuer))
	}
	return &Authenticator{secret: secret, rules: r, now: now, timely: jwt.NewValidator(opts...)}
}

// readToken is a token whose signature and fixed claims (sub, role,
// courses) passed: what is left to check at each use is its times.
type readToken struct {
	claims    Claims
	principal Principal
}

// readTokens remembers the tokens read, so a student's page polling with
// one token costs one signature check and one JSON decode, not one per
// request. Only a token signed with the secret is kept; at most
// maxReadTokens (then the memory starts again).
type readTokens struct {
	mu     sync.Mutex
	tokens map[string]readToken
}

const maxReadTokens = 10000

func (t *readTokens) get(token string) (readToken, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.tokens[token]
	return r, ok
}

func (t *readTokens) put(token string, r readToken) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.tokens == nil || len(t.tokens) >= maxReadTokens {
		t.tokens = map[string]readToken{}
	}
	t.tokens[token] = r
}

// Authenticate returns the caller of r. Returns ErrUnauthorized (with the
// reason) if the Authorization header is missing or not a Bearer token, or
// the token is not HS256 with our secret, lacks exp, sub or a known role,
// has a sub the platform reserves (session.Reserved),
// is expired, not yet valid or issued in the future, is valid for longer
// than the rules allow, or lacks the audience or issuer they require.
// The times are checked at every call; the rest once per token.
func (a *Authenticator) Authenticate(r *http.Request) (Principal, error) {
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if h == "" {
		return Principal{}, fmt.Errorf("%w: missing Authorization header", ErrUnauthorized)
	}
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return Principal{}, fmt.Errorf("%w: Authorization must be \"Bearer <token>\"", ErrUnauthorized)
	}
	t, ok := a.read.get(token)
	if !ok {
		var err error
		if t, err = a.readToken(token); err != nil {
			return Principal{}, err
		}
		a.read.put(token, t)
	}
	now := a.now()
	err := a.timely.Validate(t.claims)
	switch {
	case errors.Is(err, jwt.ErrTokenExpired):
		return Principal{}, fmt.Errorf("%w: token expired", ErrUnauthorized)
	case errors.Is(err, jwt.ErrTokenNotValidYet):
		return Principal{}, fmt.Errorf("%w: token not valid yet (nbf)", ErrUnauthorized)
	case errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
		return Principal{}, fmt.Errorf("%w: token issued in the future (iat)", ErrUnauthorized)
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return Principal{}, fmt.Errorf("%w: token audience is not %q", ErrUnauthorized, a.rules.Audience)
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return Principal{}, fmt.Errorf("%w: token issuer is not %q", ErrUnauthorized, a.rules.Issuer)
	case err != nil:
		return Principal{}, fmt.Errorf("%w: invalid token: %v", ErrUnauthorized, err)
	}
	if err := a.checkLifetime(t.claims, now); err != nil {
		return Principal{}, err
	}
	// A copy: no request may change the remembered token's courses.
	p := t.principal
	p.Courses = slices.Clone(p.Courses)
	return p, nil
}

// readToken checks token's signature (HS256 with the secret) and the
// claims that never change (sub, role, courses), not its times.
func (a *Authenticator) readToken(token string) (readToken, error) {
	var c Claims
	_, err := jwt.ParseWithClaims(token, &c, func(*jwt.Token) (any, error) { return a.secret, nil },
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}), jwt.WithoutClaimsValidation())
	switch {
	case err != nil:
		return readToken{}, fmt.Errorf("%w: invalid token: %v", ErrUnauthorized, err)
	case c.Subject == "":
		return readToken{}, fmt.Errorf("%w: token has no sub", ErrUnauthorized)
	case session.Reserved(c.Subject):
		return readToken{}, fmt.Errorf("%w: token sub %q is reserved for the platform (%s…)", ErrUnauthorized, c.Subject, session.ReservedPrefix)
	case !slices.Contains(roles, c.Role):
		return readToken{}, fmt.Errorf("%w: token role %q is none of %s", ErrUnauthorized, c.Role, strings.Join(roles, ", "))
	}
	courses, err := c.courses(a.rules.CoursesClaim)
	if err != nil {
		return readToken{}, fmt.Errorf("%w: %v", ErrUnauthorized, err)
	}
	return readToken{claims: c, principal: Principal{Subject: c.Subject, Role: c.Role, Courses: courses}}, nil
}

// checkLifetime applies MaxLifetime (see TokenRules) to a token whose exp
// is known to be set.
func (a *Authenticator) checkLifetime(c Claims, now time.Time) error {
	exp, max := c.ExpiresAt.Time, a.rules.MaxLifetime
	if c.IssuedAt != nil {
		if life := exp.Sub(c.IssuedAt.Time); life > max {
			return fmt.Errorf("%w: token lifetime (exp − iat) %s exceeds the maximum %s", ErrUnauthorized, life, max)
		}
		return nil
	}
	if left := exp.Sub(now); left > max+a.rules.Leeway {
		return fmt.Errorf("%w: token without iat is valid for %s more (exp − now), over the maximum lifetime %s", ErrUnauthorized, left.Round(time.Second), max)
	}
	return nil
}

// Sign makes a token with only sub, role and exp (no iat, iss or aud),
// HS256 with secret. Tests use it for tokens no compliant portal would
// issue; Issue makes the tokens a portal does.
func Sign(secret []byte, subject, role string, exp time.Time) (string, error) {
	return sign(secret, Claims{
		Role:             role,
		RegisteredClaims: jwt.RegisteredClaims{Subject: subject, ExpiresAt: jwt.NewNumericDate(exp)},
	})
}

func sign(secret []byte, c Claims) (string, error) {
	return jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(secret)
}
