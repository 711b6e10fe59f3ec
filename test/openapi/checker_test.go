package openapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"labkeep/shared/httpapi"
)

// loadDescription loads and validates the description the functions embed
// and serve.
func loadDescription(t *testing.T) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(httpapi.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return doc
}

// options are the validation options of every exchange: an undocumented
// status fails, every schema error is reported, and credentials are checked
// for their form only (the server judges them; the description says where
// they go).
var options = &openapi3filter.Options{
	IncludeResponseStatus: true,
	MultiError:            true,
	AuthenticationFunc:    credentialsPresent,
}

// credentialsPresent accepts a request that carries credentials of the
// scheme's form: "Bearer <token>" for a bearer scheme, HTTP Basic for a
// basic one.
func credentialsPresent(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	r := in.RequestValidationInput.Request
	switch s := in.SecurityScheme; {
	case s.Type == "http" && s.Scheme == "bearer":
		if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); !ok || strings.TrimSpace(tok) == "" {
			return errors.New("no bearer token")
		}
	case s.Type == "http" && s.Scheme == "basic":
		if _, _, ok := r.BasicAuth(); !ok {
			return errors.New("no basic credentials")
		}
	default:
		return fmt.Errorf("unknown security scheme %s/%s", s.Type, s.Scheme)
	}
	return nil
}

// verdict is what the checker found of one exchange.
type verdict struct {
	// Request and Response are the validation errors (nil: valid).
	Request, Response error
	// Operation is "METHOD /path" of the documented operation the request
	// matched, or "" for a path or method the description does not list.
	Operation string
}

type verdictKey struct{}

// checker is an http.RoundTripper that validates every request it sends
// and every answer it gets against the description, and records which
// documented operation answered which status.
type checker struct {
	doc    *openapi3.T
	router routers.Router
	next   http.RoundTripper

	mu sync.Mutex
	// seen counts the answers that matched the description, by
	// "METHOD /path status".
	seen map[string]int
	// unchecked are the exchanges sent without a verdict to fill in that
	// failed validation (none should).
	unchecked []error
}

func newChecker(t *testing.T, doc *openapi3.T) *checker {
	t.Helper()
	// A home's archive (GET /homeArchive) is a binary body.
	openapi3filter.RegisterBodyDecoder("application/gzip", openapi3filter.FileBodyDecoder)
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return &checker{doc: doc, router: router, next: http.DefaultTransport, seen: map[string]int{}}
}

// RoundTrip implements http.RoundTripper: it validates req, sends it,
// and validates the answer; the verdict goes to the *verdict in req's
// context.
func (c *checker) RoundTrip(req *http.Request) (*http.Response, error) {
	v, ok := req.Context().Value(verdictKey{}).(*verdict)
	if !ok {
		v = &verdict{}
		defer func() {
			if err := errors.Join(v.Request, v.Response); err != nil {
				c.mu.Lock()
				c.unchecked = append(c.unchecked, fmt.Errorf("%s %s: %w", req.Method, req.URL.Path, err))
				c.mu.Unlock()
			}
		}()
	}
	var body []byte
	if req.Body != nil {
		var err error
		if body, err = io.ReadAll(req.Body); err != nil {
			return nil, err
		}
		_ = req.Body.Close()
	}
	withBody := func(r *http.Request) *http.Request {
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		r.ContentLength = int64(len(body))
		return r
	}
	route, params, routeErr := c.router.FindRoute(req)
	var in *openapi3filter.RequestValidationInput
	if routeErr == nil {
		v.Operation = route.Method + " " + route.Path
		in = &openapi3filter.RequestValidationInput{Request: withBody(req.Clone(req.Context())), PathParams: params, Route: route, Options: options}
		v.Request = openapi3filter.ValidateRequest(req.Context(), in)
	}
	res, err := c.next.RoundTrip(withBody(req))
	if err != nil {
		return nil, err
	}
	var answer []byte
	if res.StatusCode != http.StatusSwitchingProtocols {
		answer, err = io.ReadAll(res.Body)
		_ = res.Body.Close()
		if err != nil {
			return nil, err
		}
		res.Body = io.NopCloser(bytes.NewReader(answer))
	}
	if routeErr != nil {
		// A path or method the description does not list: the answer
		// must be the 404 or 405 it documents for those.
		v.Response = c.undocumented(req, res, answer, routeErr)
		return res, nil
	}
	v.Response = c.validateResponse(in, res.StatusCode, res.Header, answer)
	if v.Response == nil {
		c.mu.Lock()
		c.seen[v.Operation+" "+strconv.Itoa(res.StatusCode)]++
		c.mu.Unlock()
	}
	return res, nil
}

func (c *checker) validateResponse(in *openapi3filter.RequestValidationInput, status int, h http.Header, body []byte) error {
	return openapi3filter.ValidateResponse(context.Background(), &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: status, Header: h, Body: io.NopCloser(bytes.NewReader(body)), Options: options,
	})
}

// undocumented validates the answer to a request no operation matches
// against the description's MethodNotAllowed (a listed path, another
// method; under /terminal/ that is NotFound too, as the description says)
// or NotFound (no such path) response.
func (c *checker) undocumented(req *http.Request, res *http.Response, body []byte, routeErr error) error {
	name, status := "NotFound", http.StatusNotFound
	if errors.Is(routeErr, routers.ErrMethodNotAllowed) && !strings.HasPrefix(req.URL.Path, "/terminal/") {
		name, status = "MethodNotAllowed", http.StatusMethodNotAllowed
	}
	if res.StatusCode != status {
		return fmt.Errorf("%s %s is not described (%v): answered %d, want %d", req.Method, req.URL.Path, routeErr, res.StatusCode, status)
	}
	err := c.validateAs(name, req, status, res.Header, body)
	if err == nil {
		c.mu.Lock()
		c.seen[name]++
		c.mu.Unlock()
	}
	return err
}

// validateAs validates an answer against the description's response
// component name, as if an operation of req's documented it.
func (c *checker) validateAs(name string, req *http.Request, status int, h http.Header, body []byte) error {
	ref := c.doc.Components.Responses[name]
	if ref == nil {
		return fmt.Errorf("the description has no response %s", name)
	}
	op := openapi3.NewOperation()
	op.Responses = openapi3.NewResponses(openapi3.WithStatus(status, ref))
	in := &openapi3filter.RequestValidationInput{Request: req, Route: &routers.Route{Spec: c.doc, Method: req.Method, Path: req.URL.Path, Operation: op}, Options: options}
	return c.validateResponse(in, status, h, body)
}

// documented lists every "METHOD /path status" the description documents.
func (c *checker) documented() []string {
	var out []string
	for path, item := range c.doc.Paths.Map() {
		for method, op := range item.Operations() {
			for status := range op.Responses.Map() {
				out = append(out, method+" "+path+" "+status)
			}
		}
	}
	slices.Sort(out)
	return out
}

// call is one request and the answer it must get.
type call struct {
	name         string
	method, path string
	// auth is the Authorization header ("" none).
	auth string
	// ctype is the Content-Type ("" means application/json when there
	// is a body).
	ctype, body string
	header      map[string]string
	// status and code are the answer wanted: its status and, for an
	// error, its code.
	status int
	code   string
	// invalid says the request breaks the description on purpose (bad
	// input): its validation must fail, as the server must refuse it.
	invalid bool
}

// answer is what a call got.
type answer struct {
	Status int
	Header http.Header
	Body   []byte
}

// client sends calls to a deployment through a checker.
type client struct {
	url string
	c   *checker
	hc  *http.Client
}

func newClient(url string, c *checker) client {
	return client{url: url, c: c, hc: &http.Client{Transport: c}}
}

// do sends x and fails the test unless the answer is the one wanted and
// both the request (unless x.invalid) and the answer match the
// description.
func (cl client) do(t *testing.T, x call) answer {
	t.Helper()
	v := &verdict{}
	ctx := context.WithValue(t.Context(), verdictKey{}, v)
	req, err := http.NewRequestWithContext(ctx, x.method, cl.url+x.path, strings.NewReader(x.body))
	if err != nil {
		t.Fatal(err)
	}
	if x.auth != "" {
		req.Header.Set("Authorization", x.auth)
	}
	ctype := x.ctype
	if ctype == "" && x.body != "" {
		ctype = "application/json"
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	for k, val := range x.header {
		req.Header.Set(k, val)
	}
	res, err := cl.hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", x.method, x.path, err)
	}
	defer res.Body.Close()
	a := answer{Status: res.StatusCode, Header: res.Header}
	if res.StatusCode != http.StatusSwitchingProtocols {
		a.Body, _ = io.ReadAll(res.Body)
	}
	if a.Status != x.status {
		t.Errorf("%s %s = %d %s, want %d", x.method, x.path, a.Status, a.Body, x.status)
	}
	if x.code != "" {
		var eb struct {
			Error struct{ Code string } `json:"error"`
		}
		if err := json.Unmarshal(a.Body, &eb); err != nil || eb.Error.Code != x.code {
			t.Errorf("%s %s: error code %q, want %q (%s)", x.method, x.path, eb.Error.Code, x.code, a.Body)
		}
	}
	switch {
	case x.invalid && v.Operation != "" && v.Request == nil:
		t.Errorf("%s %s: the request was meant to break the description, but it validates", x.method, x.path)
	case !x.invalid && v.Request != nil:
		t.Errorf("%s %s: the request breaks the description: %v", x.method, x.path, v.Request)
	}
	if v.Response != nil {
		t.Errorf("%s %s: the answer %d drifts from the description: %v\nbody: %s", x.method, x.path, a.Status, v.Response, a.Body)
	}
	return a
}

// run sends each call as a subtest named after it.
func (cl client) run(t *testing.T, calls []call) {
	t.Helper()
	for _, x := range calls {
		t.Run(x.name, func(t *testing.T) { cl.do(t, x) })
	}
}
