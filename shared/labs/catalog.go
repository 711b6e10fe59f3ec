package labs

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultReload is how often a Live catalog re-reads its file: a lab added
// to the ConfigMap can be opened within about this long after the kubelet
// has updated the mount.
const DefaultReload = 10 * time.Second

// Live is the lab catalog in force, re-read from its file while the
// functions run, so a changed ConfigMap needs no restart. Only a file that
// validates replaces the catalog: a bad one is refused (logged, counted through
// Metrics) and the last good catalog
// stays in force. Sessions never depend on it after their open: a session
// stores its kind and nodes, and extend, close and teardown work from the
// stored row, so a lab removed from the catalog leaves its running
// sessions as they are.
//
// The file is compared by content, not by modification time: a kubelet
// updates a ConfigMap mount by swapping a symlink, and reading the path
// follows it to whatever is current.
type Live struct {
	path    string
	log     *slog.Logger
	metrics Metrics

	cur atomic.Pointer[Catalog]
	gen atomic.Int64

	mu sync.Mutex // serialises Reload
	// seen is the digest of the last content (or read error) acted on, so
	// an unchanged file — good or bad — is neither parsed nor reported
	// again at every tick.
	seen [sha256.Size]byte
}

// OpenLive loads the catalog at path, which must be valid: a deployment
// with a bad catalog does not start. metrics may be nil: nothing is
// counted.
func OpenLive(path string, log *slog.Logger, metrics Metrics) (*Live, error) {
	c, digest, err := read(path)
	if err != nil {
		return nil, err
	}
	if metrics == nil {
		metrics = noMetrics{}
	}
	l := &Live{path: path, log: log, metrics: metrics, seen: digest}
	l.cur.Store(c)
	l.gen.Store(1)
	metrics.Loaded(1, len(c.byName))
	return l, nil
}

// Get returns the lab called name in the catalog in force.
func (l *Live) Get(name string) (Lab, bool) { return l.cur.Load().Get(name) }

// Names lists the labs of the catalog in force, sorted.
func (l *Live) Names() []string { return l.cur.Load().Names() }

// Current is the catalog in force: one consistent snapshot, for callers
// that look up several labs.
func (l *Live) Current() *Catalog { return l.cur.Load() }

// Generation counts the catalogs put in force, 1 for the one loaded at
// start.
func (l *Live) Generation() int64 { return l.gen.Load() }

// ErrUnchanged is Reload's answer when the file is as last seen.
var ErrUnchanged = errors.New("lab templates unchanged")

// Reload re-reads the file. It returns nil when a new catalog is in force,
// ErrUnchanged when the content is the one last acted on (whether it was
// taken or refused), or why the file was refused, leaving the catalog in
// force as it was.
func (l *Live) Reload() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, digest, err := read(l.path)
	if digest == l.seen {
		return ErrUnchanged
	}
	l.seen = digest
	if err != nil {
		l.metrics.Refused()
		l.log.Error("lab catalog refused; the last good catalog stays in force", "path", l.path, "generation", l.gen.Load(), "err", err)
		return err
	}
	l.cur.Store(c)
	gen := l.gen.Add(1)
	l.metrics.Loaded(gen, len(c.byName))
	l.log.Info("lab catalog reloaded", "path", l.path, "generation", gen, "labs", c.Names())
	return nil
}

// read loads the catalog at path with the digest of what it read: the
// file's content, or the read error when there is none.
func read(path string) (*Catalog, [sha256.Size]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, sha256.Sum256([]byte("read error: " + err.Error())), fmt.Errorf("lab templates: %w", err)
	}
	digest := sha256.Sum256(data)
	c, err := Parse(data)
	if err != nil {
		return nil, digest, fmt.Errorf("lab templates %s: %w", path, err)
	}
	return c, digest, nil
}

// Watch calls Reload at every tick until ctx ends. tick is a ticker's
// channel (time.NewTicker in production, a channel the test drives in
// tests).
func (l *Live) Watch(ctx context.Context, tick <-chan time.Time) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
			_ = l.Reload() // Reload logs and counts what it refuses
		}
	}
}

// Metrics counts the catalogs put in force and the files refused; the
// entry points implement it (Prometheus), so labs depends on no metrics
// library.
type Metrics interface {
	// Loaded reports the catalog put in force: its generation (1 for the
	// one loaded at start) and how many labs it has.
	Loaded(generation int64, labs int)
	// Refused counts one changed file refused (unreadable or invalid);
	// the last good catalog stays in force.
	Refused()
}

type noMetrics struct{}

func (noMetrics) Loaded(int64, int) {}
func (noMetrics) Refused()          {}
