package access

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/go-cmp/cmp"
)

var (
	authSecret = []byte("auth-test-secret-0123456789abcdef-0123")
	authT0     = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
)

// mint signs claims with method and key as any issuer could, so a test
// controls exactly which claims a token has.
func mint(t *testing.T, method jwt.SigningMethod, key any, claims jwt.MapClaims) string {
	t.Helper()
	tok, err := jwt.NewWithClaims(method, claims).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// hs256 is a token with claims signed with authSecret; times are Unix
// seconds of authT0 + the given offsets.
func hs256(t *testing.T, claims jwt.MapClaims) string {
	t.Helper()
	return mint(t, jwt.SigningMethodHS256, authSecret, claims)
}

func at(d time.Duration) int64 { return authT0.Add(d).Unix() }

// outcome is what Authenticate decided: the caller, or why not.
type outcome struct {
	Principal Principal
	// Refused holds the reason if the token was refused (ErrUnauthorized).
	Refused string
}

func authenticate(t *testing.T, a *Authenticator, header string) outcome {
	t.Helper()
	r := httptest.NewRequest("GET", "/getSession", nil)
	if header != "" {
		r.Header.Set("Authorization", header)
	}
	p, err := a.Authenticate(r)
	if err == nil {
		return outcome{Principal: p}
	}
	if !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("Authenticate error %v is not ErrUnauthorized", err)
	}
	return outcome{Refused: err.Error()}
}

// Every rule a token is held to, each shown by a token that just passes
// and one that just fails it. The clock reads authT0 unless a case moves it.
func TestAuthenticate(t *testing.T) {
	student := Principal{Subject: "alice", Role: RoleStudent}
	claims := func(extra jwt.MapClaims) jwt.MapClaims {
		c := jwt.MapClaims{"sub": "alice", "role": RoleStudent}
		for k, v := range extra {
			c[k] = v
		}
		return c
	}
	defaults := DefaultTokenRules()
	withAud := TokenRules{Audience: "labkeep", MaxLifetime: DefaultTokenMaxLifetime, Leeway: DefaultTokenLeeway}
	withIss := TokenRules{Issuer: "https://portal.example", MaxLifetime: DefaultTokenMaxLifetime, Leeway: DefaultTokenLeeway}
	noLeeway := TokenRules{MaxLifetime: DefaultTokenMaxLifetime}
	oneHour := TokenRules{MaxLifetime: time.Hour, Leeway: DefaultTokenLeeway}
	issued := func(r TokenRules, at time.Time) string {
		tok, err := r.Issue(authSecret, "alice", RoleStudent, at)
		if err != nil {
			t.Fatal(err)
		}
		return "Bearer " + tok
	}

	tests := []struct {
		name   string
		rules  TokenRules
		now    time.Duration // clock = authT0 + now
		header string
		want   outcome
	}{
		// The header.
		{"no Authorization header", defaults, 0, "", outcome{Refused: "unauthorized: missing Authorization header"}},
		{"not a Bearer token", defaults, 0, "Basic YWxpY2U6cHc=", outcome{Refused: `unauthorized: Authorization must be "Bearer <token>"`}},
		{"Bearer without a token", defaults, 0, "Bearer  ", outcome{Refused: `unauthorized: Authorization must be "Bearer <token>"`}},

		// Signature and algorithm.
		{"garbage token", defaults, 0, "Bearer not.a.jwt", outcome{Refused: "invalid token"}},
		{"another key", defaults, 0, "Bearer " + mint(t, jwt.SigningMethodHS256, []byte("another-secret-0123456789abcdef-xyz"), claims(jwt.MapClaims{"exp": at(time.Hour)})),
			outcome{Refused: "signature is invalid"}},
		{"HS512", defaults, 0, "Bearer " + mint(t, jwt.SigningMethodHS512, authSecret, claims(jwt.MapClaims{"exp": at(time.Hour)})),
			outcome{Refused: "signing method HS512 is invalid"}},
		{"alg none", defaults, 0, "Bearer " + mint(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, claims(jwt.MapClaims{"exp": at(time.Hour)})),
			outcome{Refused: "invalid token"}},

		// Courses.
		{"courses as a list", defaults, 0, "Bearer " + hs256(t, claims(jwt.MapClaims{"exp": at(time.Hour), "groups": []string{"cs-101", "", "math"}})),
			outcome{Principal: Principal{Subject: "alice", Role: RoleStudent, Courses: []string{"cs-101", "math"}}}},
		{"one course as a string", defaults, 0, "Bearer " + hs256(t, claims(jwt.MapClaims{"exp": at(time.Hour), "groups": "cs-101"})),
			outcome{Principal: Principal{Subject: "alice", Role: RoleStudent, Courses: []string{"cs-101"}}}},
		{"courses under another claim than the rules name", defaults, 0, "Bearer " + hs256(t, claims(jwt.MapClaims{"exp": at(time.Hour), "courses": []string{"cs-101"}})),
			outcome{Principal: student}},
		{"courses of the wrong type", defaults, 0, "Bearer " + hs256(t, claims(jwt.MapClaims{"exp": at(time.Hour), "groups": []any{"cs-101", 7}})),
			outcome{Refused: "unauthorized: claim groups must be a list of strings"}},
		{"courses issued as a portal does", defaults, 0, "Bearer " + func() string {
			tok, err := defaults.Issue(authSecret, "alice", RoleStudent, authT0, "cs-101")
			if err != nil {
				t.Fatal(err)
			}
			return tok
		}(), outcome{Principal: Principal{Subject: "alice", Role: RoleStudent, Courses: []string{"cs-101"}}}},

		// sub and role.
		{"admin", defaults, 0, "Bearer " + hs256(t, jwt.MapClaims{"sub": "ops", "role": RoleAdmin, "exp": at(time.Hour)}), outcome{Principal: Principal{Subject: "ops", Role: RoleAdmin}}},
		{"no sub", defaults, 0, "Bearer " + hs256(t, jwt.MapClaims{"role": RoleStudent, "exp": at(time.Hour)}), outcome{Refused: "unauthorized: token has no sub"}},
		{"the warm pool's reserved student", defaults, 0, "Bearer " + hs256(t, jwt.MapClaims{"sub": "labkeep:pool", "role": RoleStudent, "exp": at(time.Hour)}),
			outcome{Refused: `unauthorized: token sub "labkeep:pool" is reserved for the platform (labkeep:…)`}},
		{"any reserved sub, admin too", defaults, 0, "Bearer " + hs256(t, jwt.MapClaims{"sub": "labkeep:x", "role": RoleAdmin, "exp": at(time.Hour)}),
			outcome{Refused: `unauthorized: token sub "labkeep:x" is reserved for the platform (labkeep:…)`}},
		{"unknown role", defaults, 0, "Bearer " + hs256(t, jwt.MapClaims{"sub": "alice", "role": "root", "exp": at(time.Hour)}),
			outcome{Refused: `unauthorized: token role "root" is none of student, instructor, admin`}},
		{"an instructor with the courses they teach", defaults, 0, "Bearer " + hs256(t, jwt.MapClaims{"sub": "prof", "role": RoleInstructor, "groups": []string{"cs-101"}, "exp": at(time.Hour)}),
			outcome{Principal: Principal{Subject: "prof", Role: RoleInstructor, Courses: []string{"cs-101"}}}},

		// exp and the leeway.
		{"no exp", defaults, 0, "Bearer " + hs256(t, claims(nil)), outcome{Refused: "exp claim is required"}},
		{"expired less than the leeway ago", defaults, 0, "Bearer " + hs256(t, claims(jwt.MapClaims{"exp": at(-29 * time.Second)})), outcome{Principal: student}},
		{"expired more than the leeway ago", defaults, 0, "Bearer " + hs256(t, claims(jwt.MapClaims{"exp": at(-31 * time.Second)})), outcome{Refused: "unauthorized: token expired"}},
		{"no leeway: expired a second ago", noLeeway, 0, "Bearer " + hs256(t, claims(jwt.MapClaims{"exp": at(-time.Second)})), outcome{Refused: "unauthorized: token expired"}},
		{"nbf within the leeway", defaults, 0, "Bearer " + hs256(t, claims(jwt.MapClaims{"nbf": at(29 * time.Second), "exp": at(time.Hour)})), outcome{Principal: student}},
		{"nbf beyond the leeway", defaults, 0, "Bearer " + hs256(t, claims(jwt.MapClaims{"nbf": at(time.Minute), "exp": at(time.Hour)})), outcome{Refused: "unauthorized: token not valid yet (nbf)"}},
		{"iat in the future within the leeway", defaults, 0, "Bearer " + hs256(t, claims(jwt.MapClaims{"iat": at(29 * time.Second), "exp": at(time.Hour)})), outcome{Principal: student}},
		{"iat in the future beyond the leeway", defaults, 0, "Bearer " + hs256(t, claims(jwt.MapClaims{"iat": at(31 * time.Second), "exp": at(time.Hour)})), outcome{Refused: "unauthorized: token issued in the future (iat)"}},

		// The maximum lifetime: exp − iat when iat is set.
		{"exp − iat at the maximum", defaults, 0, "Bearer " + hs256(t, claims(jwt.MapClaims{"iat": at(0), "exp": at(24 * time.Hour)})), outcome{Principal: student}},
		{"exp − iat a second over the maximum", defaults, 0, "Bearer " + hs256(t, claims(jwt.MapClaims{"iat": at(0), "exp": at(24*time.Hour + time.Second)})),
			outcome{Refused: "unauthorized: token lifetime (exp − iat) 24h0m1s exceeds the maximum 24h0m0s"}},
		{"exp − iat over the maximum though an hour is left", defaults, 0, "Bearer " + hs256(t, claims(jwt.MapClaims{"iat": at(-48 * time.Hour), "exp": at(time.Hour)})),
			outcome{Refused: "unauthorized: token lifetime (exp − iat) 49h0m0s exceeds the maximum 24h0m0s"}},
		{"a configured maximum of one hour", oneHour, 0, "Bearer " + hs256(t, claims(jwt.MapClaims{"iat": at(0), "exp": at(2 * time.Hour)})),
			outcome{Refused: "unauthorized: token lifetime (exp − iat) 2h0m0s exceeds the maximum 1h0m0s"}},

		// The maximum lifetime: exp − now when there is no iat.
		{"no iat, exp − now at the maximum plus the leeway", defaults, 0, "Bearer " + hs256(t, claims(jwt.MapClaims{"exp": at(24*time.Hour + 30*time.Second)})), outcome{Principal: student}},
		{"no iat, exp − now beyond the maximum plus the leeway", defaults, 0, "Bearer " + hs256(t, claims(jwt.MapClaims{"exp": at(24*time.Hour + 31*time.Second)})),
			outcome{Refused: "unauthorized: token without iat is valid for 24h0m31s more (exp − now), over the maximum lifetime 24h0m0s"}},
		{"no iat, a year-long token once within the maximum of its expiry", defaults, 365*24*time.Hour - time.Hour, "Bearer " + hs256(t, claims(jwt.MapClaims{"exp": at(365 * 24 * time.Hour)})), outcome{Principal: student}},

		// Audience and issuer.
		{"audience not required, token has one", defaults, 0, "Bearer " + hs256(t, claims(jwt.MapClaims{"aud": "elsewhere", "exp": at(time.Hour)})), outcome{Principal: student}},
		{"required audience", withAud, 0, "Bearer " + hs256(t, claims(jwt.MapClaims{"aud": "labkeep", "exp": at(time.Hour)})), outcome{Principal: student}},
		{"required audience among several", withAud, 0, "Bearer " + hs256(t, claims(jwt.MapClaims{"aud": []string{"grades", "labkeep"}, "exp": at(time.Hour)})), outcome{Principal: student}},
		{"required audience, token has another", withAud, 0, "Bearer " + hs256(t, claims(jwt.MapClaims{"aud": "grades", "exp": at(time.Hour)})),
			outcome{Refused: `unauthorized: token audience is not "labkeep"`}},
		{"required audience, token has none", withAud, 0, "Bearer " + hs256(t, claims(jwt.MapClaims{"exp": at(time.Hour)})), outcome{Refused: "aud claim is required"}},
		{"required issuer", withIss, 0, "Bearer " + hs256(t, claims(jwt.MapClaims{"iss": "https://portal.example", "exp": at(time.Hour)})), outcome{Principal: student}},
		{"required issuer, token has another", withIss, 0, "Bearer " + hs256(t, claims(jwt.MapClaims{"iss": "https://evil.example", "exp": at(time.Hour)})),
			outcome{Refused: `unauthorized: token issuer is not "https://portal.example"`}},
		{"required issuer, token has none", withIss, 0, "Bearer " + hs256(t, claims(jwt.MapClaims{"exp": at(time.Hour)})), outcome{Refused: "iss claim is required"}},

		// What Issue makes passes the rules it was made for, until it expires.
		{"Issue's token under rules with audience and issuer", TokenRules{Audience: "labkeep", Issuer: "portal", MaxLifetime: time.Hour, Leeway: 0},
			59 * time.Minute, issued(TokenRules{Audience: "labkeep", Issuer: "portal", MaxLifetime: time.Hour}, authT0), outcome{Principal: student}},
		{"Issue's token after it expired", TokenRules{Audience: "labkeep", Issuer: "portal", MaxLifetime: time.Hour, Leeway: 0},
			time.Hour + time.Second, issued(TokenRules{Audience: "labkeep", Issuer: "portal", MaxLifetime: time.Hour}, authT0), outcome{Refused: "unauthorized: token expired"}},
		{"Issue's token under longer rules than the functions'", oneHour, 0, issued(defaults, authT0),
			outcome{Refused: "unauthorized: token lifetime (exp − iat) 24h0m0s exceeds the maximum 1h0m0s"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			now := authT0.Add(tc.now)
			a, err := tc.rules.Authenticator(authSecret, func() time.Time { return now })
			if err != nil {
				t.Fatal(err)
			}
			got := authenticate(t, a, tc.header)
			// A refusal's reason must contain the wanted text; the
			// library's own sentences are matched by their key part.
			if tc.want.Refused != "" && strings.Contains(got.Refused, tc.want.Refused) {
				got.Refused = tc.want.Refused
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Authenticate (-want +got):\n%s", diff)
			}
		})
	}
}

// NewAuthenticator applies the default rules: a year-long token, as tests
// once minted, is refused.
func TestNewAuthenticatorUsesTheDefaultRules(t *testing.T) {
	a := NewAuthenticator(authSecret, func() time.Time { return authT0 })
	tok, err := Sign(authSecret, "alice", RoleStudent, authT0.Add(365*24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	got := authenticate(t, a, "Bearer "+tok)
	want := outcome{Refused: "unauthorized: token without iat is valid for 8760h0m0s more (exp − now), over the maximum lifetime 24h0m0s"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Authenticate (-want +got):\n%s", diff)
	}
}

// Rules that cannot be meant are refused when the functions start, each
// naming its field.
func TestTokenRulesValidate(t *testing.T) {
	tests := []struct {
		name  string
		rules TokenRules
		want  string
	}{
		{"defaults", DefaultTokenRules(), ""},
		{"audience and issuer", TokenRules{Audience: "labkeep", Issuer: "https://portal.example", MaxLifetime: time.Hour}, ""},
		{"leeway at its bound", TokenRules{MaxLifetime: time.Hour, Leeway: MaxTokenLeeway}, ""},
		{"negative leeway", TokenRules{MaxLifetime: time.Hour, Leeway: -time.Second}, "Leeway: must not be negative, got -1s"},
		{"leeway over its bound", TokenRules{MaxLifetime: time.Hour, Leeway: MaxTokenLeeway + time.Second},
			"Leeway: 5m1s exceeds 5m0s: a leeway that long is not clock skew but extra token lifetime"},
		{"courses in a claim of their own", TokenRules{MaxLifetime: time.Hour, CoursesClaim: "courses"}, ""},
		{"courses read from sub", TokenRules{MaxLifetime: time.Hour, CoursesClaim: "sub"}, `CoursesClaim: "sub" is a claim of its own meaning, not a list of courses`},
		{"zero maximum lifetime", TokenRules{}, "MaxLifetime: must be positive, got 0s"},
		{"negative maximum lifetime", TokenRules{MaxLifetime: -time.Hour}, "MaxLifetime: must be positive, got -1h0m0s"},
		{"audience with a trailing space", TokenRules{Audience: "labkeep ", MaxLifetime: time.Hour},
			`Audience: "labkeep " has leading or trailing white space, which no token's claim would match`},
		{"every error at once", TokenRules{Issuer: " portal", MaxLifetime: 0, Leeway: -1},
			"Issuer: \" portal\" has leading or trailing white space, which no token's claim would match\nMaxLifetime: must be positive, got 0s\nLeeway: must not be negative, got -1ns"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got string
			if err := tc.rules.Validate(); err != nil {
				got = err.Error()
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Validate (-want +got):\n%s", diff)
			}
			a, err := tc.rules.Authenticator(authSecret, time.Now)
			if (err == nil) != (tc.want == "") || (err == nil) != (a != nil) {
				t.Errorf("Authenticator = %v, %v; want it to fail exactly when Validate does", a, err)
			}
		})
	}
}

// Who books which course's reservations: an admin every course's, an
// instructor their own courses' only, a student none; only a student takes
// a seat their courses reserved.
func TestTeaches(t *testing.T) {
	type got struct {
		SeatsIn         []string
		Books           bool
		Taught          []string
		CS101, Math7    bool
		EveryCourseSeen bool
	}
	tests := []struct {
		name string
		p    Principal
		want got
	}{
		{"an admin, of no course", Principal{Subject: "ops", Role: RoleAdmin}, got{Books: true, CS101: true, Math7: true, EveryCourseSeen: true}},
		{"an instructor of cs-101", Principal{Subject: "prof", Role: RoleInstructor, Courses: []string{"cs-101"}}, got{Books: true, Taught: []string{"cs-101"}, CS101: true}}, // takes no seat of cs-101
		{"an instructor of no course", Principal{Subject: "prof", Role: RoleInstructor}, got{Books: true, Taught: []string{}}},
		{"a student of cs-101", Principal{Subject: "ann", Role: RoleStudent, Courses: []string{"cs-101"}}, got{SeatsIn: []string{"cs-101"}, Taught: []string{}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			taught := tc.p.Taught()
			g := got{SeatsIn: tc.p.SeatsIn(), Books: tc.p.Books(), Taught: taught, CS101: tc.p.Teaches("cs-101"), Math7: tc.p.Teaches("math-7"), EveryCourseSeen: taught == nil}
			if diff := cmp.Diff(tc.want, g); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// A token is read once, but its times are checked at every use: the same
// token passes, then is refused once it expires (beyond the leeway) on
// the same Authenticator, and a copy with a byte of its signature changed
// is refused though the original was read.
func TestAReadTokenIsCheckedAtEveryUse(t *testing.T) {
	now := authT0
	a := NewAuthenticator(authSecret, func() time.Time { return now })
	tok := hs256(t, jwt.MapClaims{"sub": "alice", "role": RoleStudent, "exp": at(time.Hour)})
	tampered := tok[:len(tok)-2] + map[bool]string{true: "A", false: "B"}[tok[len(tok)-2] != 'A'] + tok[len(tok)-1:]
	var got []outcome
	for _, step := range []struct {
		after time.Duration
		token string
	}{{0, tok}, {time.Hour - time.Minute, tok}, {0, tampered}, {time.Minute + DefaultTokenLeeway + time.Second, tok}} {
		now = now.Add(step.after)
		got = append(got, authenticate(t, a, "Bearer "+step.token))
	}
	alice := outcome{Principal: Principal{Subject: "alice", Role: RoleStudent}}
	want := []outcome{alice, alice, {Refused: "unauthorized: invalid token: token signature is invalid: signature is invalid"}, {Refused: "unauthorized: token expired"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}
