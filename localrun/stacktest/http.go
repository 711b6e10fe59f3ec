package stacktest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"labkeep/shared/access"
)

// Client calls a Deployment's functions over HTTP as the portal, the
// scheduler and admins do. Every failure to talk to the server fails the
// test; answers are returned whatever their status.
type Client struct {
	t   testing.TB
	URL string
	// Now is the functions' clock, which judges token expiry.
	Now func() time.Time
}

// NewClient is a Client for functions served at url whose clock is the
// wall clock (a server this package did not deploy, e.g. `make run`'s).
func NewClient(t testing.TB, url string) Client {
	return Client{t: t, URL: url, Now: time.Now}
}

// Token is a JWT for sub in role ("student", "instructor" or "admin"), signed with
// JWTSecret and issued as a portal does under the functions' default token
// rules: iat now by the functions' clock, valid for
// httpapi.DefaultTokenMaxLifetime, longer than any clock a test sets
// forward.
func (c Client) Token(sub, role string) string {
	c.t.Helper()
	return c.courseToken(sub, role)
}

// MemberToken is a student's Token that lists courses in the courses
// claim, as a portal whose identity provider knows them issues it.
func (c Client) MemberToken(sub string, courses ...string) string {
	c.t.Helper()
	return c.courseToken(sub, access.RoleStudent, courses...)
}

// InstructorToken is an instructor's Token that lists the courses they
// teach in the courses claim.
func (c Client) InstructorToken(sub string, courses ...string) string {
	c.t.Helper()
	return c.courseToken(sub, access.RoleInstructor, courses...)
}

func (c Client) courseToken(sub, role string, courses ...string) string {
	c.t.Helper()
	tok, err := access.DefaultTokenRules().Issue([]byte(JWTSecret), sub, role, c.Now(), courses...)
	if err != nil {
		c.t.Fatal(err)
	}
	return tok
}

// Sign is a JWT for sub in role expiring at exp, signed with JWTSecret,
// without iat: valid only while exp is within the maximum token lifetime
// of the functions' clock.
func (c Client) Sign(sub, role string, exp time.Time) string {
	c.t.Helper()
	tok, err := access.Sign([]byte(JWTSecret), sub, role, exp)
	if err != nil {
		c.t.Fatal(err)
	}
	return tok
}

// SessionView is a session's JSON as a portal reads it. It is written
// here, not taken from httpapi, on purpose: a change to the wire format
// must break these tests as it would break a portal.
type SessionView struct {
	ID               string        `json:"id"`
	Student          string        `json:"student"`
	Lab              string        `json:"lab"`
	Kind             string        `json:"kind"`
	Status           string        `json:"status"`
	StartedAt        time.Time     `json:"startedAt"`
	ExpiresAt        time.Time     `json:"expiresAt"`
	MaxExpiresAt     time.Time     `json:"maxExpiresAt"`
	ReadyAt          *time.Time    `json:"readyAt"`
	FinishedAt       *time.Time    `json:"finishedAt"`
	RemainingSeconds int64         `json:"remainingSeconds"`
	Extendable       bool          `json:"extendable"`
	ServerTime       time.Time     `json:"serverTime"`
	Nodes            []NodeView    `json:"nodes"`
	FailureReason    string        `json:"failureReason"`
	HostKey          string        `json:"hostKey"`
	StudentKey       string        `json:"studentKey"`
	PrivateKey       string        `json:"privateKey"`
	ExtendRefusal    string        `json:"extendRefusal"`
	Warnings         []WarningView `json:"warnings"`
	// Home is the student's home the session holds, nil without one.
	Home *HomeView `json:"home"`
	// QueuePosition, ETASeconds and ETALatestSeconds are set only while
	// the session waits in line.
	QueuePosition    *int   `json:"queuePosition"`
	ETASeconds       *int64 `json:"etaSeconds"`
	ETALatestSeconds *int64 `json:"etaLatestSeconds"`
}

// HomeView is the home of a SessionView: its claim and where the lab
// mounts it.
type HomeView struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// WarningView is one end-of-session warning of a SessionView.
type WarningView struct {
	BeforeSeconds int64     `json:"beforeSeconds"`
	At            time.Time `json:"at"`
	Due           bool      `json:"due"`
}

// NodeView is one node of a SessionView.
type NodeView struct {
	Name  string `json:"name"`
	Role  string `json:"role"`
	Ready bool   `json:"ready"`
	Phase string `json:"phase"`
	// PhaseReason is why an unschedulable node waits.
	PhaseReason string `json:"phaseReason"`
	SSH         struct {
		Host       string `json:"host"`
		Port       int    `json:"port"`
		User       string `json:"user"`
		KnownHosts string `json:"knownHosts"`
	} `json:"ssh"`
}

// Response is one answer of the functions.
type Response struct {
	// Received is when the answer arrived (wall clock).
	Received time.Time
	Status   int
	Header   http.Header
	Body     []byte
	// Session is the session of a session endpoint's success body, or the
	// one an error body carries (e.g. the live session of a 409).
	Session SessionView
	// Code and Message are an error body's.
	Code, Message string
}

// sessionPaths are the endpoints whose success body is a session.
var sessionPaths = map[string]bool{"/openSession": true, "/getSession": true, "/extendSession": true, "/closeSession": true}

// Scrape is what GET /metrics serves to the metrics token (MetricsToken);
// any answer but 200 fails the test.
func (c Client) Scrape() string {
	c.t.Helper()
	r := c.Do("GET", "/metrics", MetricsToken, "", "")
	if r.Status != http.StatusOK {
		c.t.Fatalf("GET /metrics with the metrics token = %d %.300s", r.Status, r.Body)
	}
	return string(r.Body)
}

// Do sends one request; token "" sends no Authorization, body "" none, and
// ctype "" means application/json when there is a body. Every error answer
// must be labkeep's JSON error body, and every success answer of a session
// endpoint a session; anything else fails the test.
func (c Client) Do(method, path, token, body, ctype string) Response {
	c.t.Helper()
	req, err := http.NewRequest(method, c.URL+path, strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" && ctype == "" {
		ctype = "application/json"
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer res.Body.Close()
	r := Response{Status: res.StatusCode, Header: res.Header, Received: time.Now()}
	if r.Body, err = io.ReadAll(res.Body); err != nil {
		c.t.Fatalf("%s %s: reading the body: %v", method, path, err)
	}
	if res.StatusCode < 300 {
		endpoint, _, _ := strings.Cut(path, "?")
		if sessionPaths[endpoint] {
			if err := json.Unmarshal(r.Body, &r.Session); err != nil {
				c.t.Fatalf("%s %s: %d with undecodable body %q", method, path, res.StatusCode, r.Body)
			}
		}
		return r
	}
	var eb struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
		Session *SessionView `json:"session"`
	}
	if err := json.Unmarshal(r.Body, &eb); err != nil || eb.Error.Code == "" {
		c.t.Fatalf("%s %s: %d without a JSON error body: %q", method, path, res.StatusCode, r.Body)
	}
	r.Code, r.Message = eb.Error.Code, eb.Error.Message
	if eb.Session != nil {
		r.Session = *eb.Session
	}
	return r
}

// Open is student's openSession of lab.
func (c Client) Open(student, lab string) Response {
	c.t.Helper()
	return c.Do("POST", "/openSession", c.Token(student, "student"), fmt.Sprintf(`{"lab":%q}`, lab), "")
}

// OpenAsMember is student's openSession of lab with a token listing
// courses.
func (c Client) OpenAsMember(student, lab string, courses ...string) Response {
	c.t.Helper()
	return c.Do("POST", "/openSession", c.MemberToken(student, courses...), fmt.Sprintf(`{"lab":%q}`, lab), "")
}

// Opened opens lab for student, fails the test unless the answer is 201
// Created, and returns the new session.
func (c Client) Opened(student, lab string) SessionView {
	c.t.Helper()
	r := c.Open(student, lab)
	if r.Status != http.StatusCreated {
		c.t.Fatalf("open %s for %s = %d %s", lab, student, r.Status, r.Body)
	}
	return r.Session
}

// Close is student's closeSession of their live session.
func (c Client) Close(student string) Response {
	c.t.Helper()
	return c.Do("POST", "/closeSession", c.Token(student, "student"), "", "")
}

// WaitRunning polls student's getSession until it reads running, and
// fails the test if it does not within timeout.
func (c Client) WaitRunning(student string, timeout time.Duration) SessionView {
	c.t.Helper()
	var r Response
	Eventually(c.t, timeout, func() (bool, string) {
		r = c.Do("GET", "/getSession", c.Token(student, "student"), "", "")
		return r.Status == http.StatusOK && r.Session.Status == "running",
			fmt.Sprintf("session of %s: %d %s", student, r.Status, r.Body)
	})
	return r.Session
}
