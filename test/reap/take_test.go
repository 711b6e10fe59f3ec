package reap_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"k8s.io/client-go/rest"

	"labkeep/localrun/stacktest"
	"labkeep/shared/kube"
	"labkeep/shared/reap"
	"labkeep/shared/session"
)

// heldDeletes holds every DELETE until release is closed, and closes
// started at the first one: the test acts while a delete is in flight.
type heldDeletes struct {
	next    http.RoundTripper
	once    *sync.Once
	started chan struct{}
	release chan struct{}
}

func (h heldDeletes) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodDelete {
		h.once.Do(func() { close(h.started) })
		select {
		case <-h.release:
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
	}
	return h.next.RoundTrip(req)
}

// While the reaper's delete of an expired session is in flight, the row
// is not locked (student calls that write it — extend, close, getSession
// marking it running — never wait for the API server), and the session
// still ends expired once the deletes are done.
func TestNoRowLockAcrossDeletes(t *testing.T) {
	b := newBackend(t, stacktest.Options{})
	ctx := context.Background()
	s := b.open("s-held", "linux-vm")
	b.Clock.Advance(61 * time.Minute)

	kcfg := b.App.Config.Kube // as Build resolved it
	held := heldDeletes{once: &sync.Once{}, started: make(chan struct{}), release: make(chan struct{})}
	rc := rest.CopyConfig(b.App.Kube)
	rc.Wrap(func(next http.RoundTripper) http.RoundTripper { held.next = next; return held })
	cluster, err := kube.NewForConfig(kcfg, rc)
	if err != nil {
		t.Fatal(err)
	}
	reaper := *b.App.Reaper
	reaper.Cluster = cluster
	type result struct {
		r   reap.Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := reaper.RunOnce(ctx, reap.TriggerSchedule)
		done <- result{r, err}
	}()
	select {
	case <-held.started:
	case res := <-done:
		t.Fatalf("run ended before deleting anything: %+v %v", res.r, res.err)
	}

	err = pgx.BeginFunc(ctx, b.DB, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE NOWAIT`, s.ID)
		return err
	})
	close(held.release)
	res := <-done
	if err != nil {
		t.Fatalf("the row is locked while the reaper's delete is in flight: %v", err)
	}
	if res.err != nil || res.r.Counts[reap.Expired] != 1 || len(res.r.Failures) != 0 {
		t.Fatalf("run: %+v %v, want the session expired", res.r, res.err)
	}
	if got := b.status(s.ID); got != session.StatusExpired {
		t.Fatalf("session is %s after the run", got)
	}
	b.WaitGone(s.ID)
}

// The reaper's take of a row moves the expiry back, so an extension
// computed from the row as it was fails its compare-and-set (and the
// Service, re-reading, finds the session over); a take of a row that is
// not due changes nothing. On the real database.
func TestTakeDefeatsAnExtensionInFlight(t *testing.T) {
	b := newBackend(t, stacktest.Options{})
	ctx := context.Background()
	s := b.open("s-take", "linux-vm")
	store := b.App.ReapStore

	cur, ok, err := store.Take(ctx, s.ID, func(session.Session) bool { return false })
	if err != nil || ok || !cur.ExpiresAt.Equal(s.ExpiresAt) {
		t.Fatalf("take of a row not due: ok=%v err=%v expires %s (was %s)", ok, err, cur.ExpiresAt, s.ExpiresAt)
	}
	cur, ok, err = store.Take(ctx, s.ID, func(session.Session) bool { return true })
	if err != nil || !ok || !cur.ExpiresAt.Before(s.ExpiresAt) || cur.ExpiresAt.Before(s.ExpiresAt.Add(-time.Millisecond)) {
		t.Fatalf("take: ok=%v err=%v expires %s (was %s), want a microsecond earlier", ok, err, cur.ExpiresAt, s.ExpiresAt)
	}
	if _, err := b.App.Store.Extend(ctx, s.ID, s.ExpiresAt, s.ExpiresAt.Add(30*time.Minute)); !errors.Is(err, session.ErrConflict) {
		t.Fatalf("extension computed before the take: %v, want ErrConflict", err)
	}
	if got := b.Session(s.ID); !got.ExpiresAt.Equal(cur.ExpiresAt) || got.Status != session.StatusRunning {
		t.Fatalf("row after the refused extension: %s, expires %s", got.Status, got.ExpiresAt)
	}
}
