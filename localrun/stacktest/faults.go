package stacktest

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
)

// Faults sits in a Deployment's transport to the API server: it fails the
// DELETE requests chosen with FailDeletesOf, as a connection reset would,
// and counts LIST and DELETE requests. Safe for concurrent use.
type Faults struct {
	mu         sync.Mutex
	failDelete []string
	lists      atomic.Int64
	deletes    atomic.Int64
}

// wrap puts f in front of next (app.WrapTransport's argument). client-go
// wraps every transport it builds from the config (the clientsets', each
// pods/exec executor's WebSocket and SPDY upgraders), so each gets a
// front of its own: one shared next would send one transport's requests
// through another's.
func (f *Faults) wrap(next http.RoundTripper) http.RoundTripper {
	return front{f: f, next: next}
}

// front is f in front of one transport.
type front struct {
	f    *Faults
	next http.RoundTripper
}

// RoundTrip implements http.RoundTripper.
func (t front) RoundTrip(req *http.Request) (*http.Response, error) {
	f := t.f
	switch {
	case req.Method == http.MethodDelete:
		f.deletes.Add(1)
		if f.failing(req.URL.Path) {
			return nil, fmt.Errorf("injected fault: connection reset deleting %s", req.URL.Path)
		}
	case req.Method == http.MethodGet && isList(req.URL):
		f.lists.Add(1)
	}
	return t.next.RoundTrip(req)
}

func (f *Faults) failing(path string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.failDelete {
		if strings.Contains(path, s) {
			return true
		}
	}
	return false
}

// isList reports a namespaced collection GET (…/namespaces/<ns>/<resource>,
// no object name).
func isList(u *url.URL) bool {
	parts := strings.Split(strings.Trim(u.Path, "/"), "/")
	for i, p := range parts {
		if p == "namespaces" && i+2 < len(parts) {
			return len(parts) == i+3
		}
	}
	return false
}

// FailDeletesOf makes every DELETE whose path contains s fail until Heal.
func (f *Faults) FailDeletesOf(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failDelete = append(f.failDelete, s)
}

// Heal removes every injected fault.
func (f *Faults) Heal() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failDelete = nil
}

// Lists is how many LIST requests went through so far.
func (f *Faults) Lists() int64 { return f.lists.Load() }

// Deletes is how many DELETE requests went through (or were failed) so far.
func (f *Faults) Deletes() int64 { return f.deletes.Load() }
