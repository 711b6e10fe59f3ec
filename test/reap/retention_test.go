package reap_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"

	"labkeep/localrun/stacktest"
	"labkeep/shared/session"
)

// Run records older than the retention are deleted by the reaper itself,
// oldest first and at most RetentionBatch per run, on the real database;
// younger ones, and the run's own record, stay.
func TestOldRunRecordsAreDeletedInBatches(t *testing.T) {
	h := newBackend(t, stacktest.Options{})
	cfg := &h.App.Reaper.Config
	cfg.Retention, cfg.RetentionBatch = 30*24*time.Hour, 3
	now := h.Clock.Now()
	insert := func(age time.Duration, n int) {
		t.Helper()
		for range n {
			if _, err := h.DB.Exec(context.Background(), `INSERT INTO reap_runs (trigger, started_at, finished_at)
				VALUES ('schedule', $1, $1)`, now.Add(-age)); err != nil {
				t.Fatal(err)
			}
		}
	}
	insert(90*24*time.Hour, 2) // long gone
	insert(31*24*time.Hour, 3) // just past the retention
	insert(29*24*time.Hour, 4) // within it
	insert(30*time.Minute, 1)  // recent
	ages := func() map[string]int {
		t.Helper()
		out := map[string]int{}
		for _, b := range []struct {
			name     string
			from, to time.Duration
		}{{"90d", 60 * 24 * time.Hour, 365 * 24 * time.Hour}, {"31d", 30 * 24 * time.Hour, 60 * 24 * time.Hour},
			{"29d", 24 * time.Hour, 30 * 24 * time.Hour}, {"recent", -time.Hour, 24 * time.Hour}} {
			if n := h.Count(`SELECT count(*) FROM reap_runs WHERE started_at <= $1 AND started_at > $2`,
				now.Add(-b.from), now.Add(-b.to)); n > 0 {
				out[b.name] = n
			}
		}
		return out
	}

	for i, want := range []struct {
		pruned int
		left   map[string]int
	}{
		{3, map[string]int{"31d": 2, "29d": 4, "recent": 1}}, // the oldest three: both 90-day ones first
		{2, map[string]int{"29d": 4, "recent": 1}},           // the rest past the retention
		{0, map[string]int{"29d": 4, "recent": 1}},           // nothing more to do
	} {
		r := h.run()
		if r.PrunedRuns != want.pruned || len(r.Failures) != 0 {
			t.Fatalf("run %d pruned %d with failures %v, want %d", i, r.PrunedRuns, r.Failures, want.pruned)
		}
		// The runs themselves are recorded at the clock's now, as recent.
		want.left["recent"] += i + 1
		if diff := cmp.Diff(want.left, ages()); diff != "" {
			t.Fatalf("after run %d, run records by age (-want +got):\n%s", i, diff)
		}
	}
}

// endedRow inserts a final session row of student that ended at finished
// with status, kind and actor, as an open or an ending writes one.
func (b *backend) endedRow(student string, status session.Status, kind session.EndKind, actor session.Actor, finished time.Time) {
	b.t.Helper()
	if _, err := b.DB.Exec(context.Background(), `INSERT INTO sessions (id, student, lab, kind, status,
		started_at, expires_at, max_expires_at, finished_at, grading_token, end_kind, end_actor)
		VALUES ($1, $2, 'linux-vm', 'vm', $3, $4::timestamptz - interval '1 minute', $4, $4, $4, 'token', $5, $6)`,
		uuid.NewString(), student, status, finished, kind, actor); err != nil {
		b.t.Fatal(err)
	}
}

// sessionRows is every session row as "student status end_kind end_actor
// finished_at", by student: any change to a row shows.
func (b *backend) sessionRows() []string {
	b.t.Helper()
	return b.Strings(`SELECT student || ' ' || status || ' ' || end_kind || ' ' || end_actor || ' ' ||
		coalesce(finished_at::text, '-') FROM sessions ORDER BY student`)
}

// The rows refused opens leave are deleted by the reaper once they are
// older than RefusedRetention, oldest first and at most RetentionBatch per
// run, on the real database, the row a real refused open wrote among
// them. A dry run deletes none. Younger refused opens stay, and so does
// every other row, whatever its age: a running session, one closed,
// expired (by the reaper, or reclaimed by an open), failed provisioning or
// ended as a ghost. Another environment's refused opens, in its own
// database (Open refuses a database another environment recorded), are
// not this reaper's: they stay until that environment's reaper deletes
// them.
func TestRefusedOpensPastRetentionAreDeletedInBatches(t *testing.T) {
	ctx := context.Background()
	h := newBackend(t, stacktest.Options{MaxVMs: 1})
	other := newBackend(t, stacktest.Options{})
	cfg := &h.App.Reaper.Config
	cfg.RefusedRetention, cfg.RetentionBatch = 24*time.Hour, 2

	// A real refusal: the one VM is taken, so the next open is refused
	// and leaves its row, which is then made 26 hours old.
	running := h.open("running-now", "linux-vm")
	t.Cleanup(func() { _ = h.App.Cluster.Teardown(context.Background(), running) })
	refused, err := h.App.Sessions.Open(ctx, "refused-26h-real", "linux-vm", "")
	if !errors.Is(err, session.ErrNoCapacity) || refused.Session == nil {
		t.Fatalf("open with the one VM taken: %v, want it refused for capacity with its row", err)
	}
	if got := refused.Session.End; refused.Session.Status != session.StatusFailed ||
		got.Kind != session.EndNoCapacity || got.Actor != session.ActorOpen {
		t.Fatalf("the refused open's row is %s %s by %s, want failed no_capacity by open", refused.Session.Status, got.Kind, got.Actor)
	}
	now := h.Clock.Now()
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	if _, err := h.DB.Exec(ctx, `UPDATE sessions SET started_at = $2, finished_at = $2 WHERE id = $1`,
		refused.Session.ID, ago(26*time.Hour)); err != nil {
		t.Fatal(err)
	}

	failed, noCapacity, byOpen := session.StatusFailed, session.EndNoCapacity, session.ActorOpen
	for _, r := range []struct {
		student string
		status  session.Status
		kind    session.EndKind
		actor   session.Actor
		age     time.Duration
	}{
		{"refused-48h", failed, noCapacity, byOpen, 48 * time.Hour},
		{"refused-30h", failed, noCapacity, byOpen, 30 * time.Hour},
		{"refused-25h", failed, noCapacity, byOpen, 25 * time.Hour},
		{"refused-23h", failed, noCapacity, byOpen, 23 * time.Hour},
		{"refused-1h", failed, noCapacity, byOpen, time.Hour},
		{"closed-48h", session.StatusClosed, session.EndClosed, session.ActorStudent, 48 * time.Hour},
		{"expired-48h", session.StatusExpired, session.EndExpired, session.ActorReaper, 48 * time.Hour},
		{"reclaimed-48h", session.StatusExpired, session.EndExpired, byOpen, 48 * time.Hour},
		{"provisioning-failed-48h", failed, session.EndProvisioningFailed, byOpen, 48 * time.Hour},
		{"ghost-48h", failed, session.EndGhost, session.ActorReaper, 48 * time.Hour},
	} {
		h.endedRow(r.student, r.status, r.kind, r.actor, ago(r.age))
	}
	other.endedRow("refused-48h", failed, noCapacity, byOpen, ago(48*time.Hour))
	otherRows := other.sessionRows()
	all := h.sessionRows()
	// without is all but the rows of the named students.
	without := func(students ...string) []string {
		t.Helper()
		var out []string
		for _, row := range all {
			if !slices.ContainsFunc(students, func(s string) bool { return strings.HasPrefix(row, s+" ") }) {
				out = append(out, row)
			}
		}
		if len(out) != len(all)-len(students) {
			t.Fatalf("not every one of %v has a row in %v", students, all)
		}
		return out
	}

	for _, step := range []struct {
		name   string
		dryRun bool
		pruned int
		left   []string
	}{
		{"a dry run deletes none", true, 0, all},
		{"the two oldest", false, 2, without("refused-48h", "refused-30h")},
		{"the rest past the retention", false, 2, without("refused-48h", "refused-30h", "refused-26h-real", "refused-25h")},
		{"nothing more to do", false, 0, without("refused-48h", "refused-30h", "refused-26h-real", "refused-25h")},
	} {
		cfg.DryRun = step.dryRun
		r := h.run()
		if r.PrunedRefused != step.pruned || len(r.Failures) != 0 {
			t.Fatalf("%s: the run deleted %d refused opens with failures %v, want %d", step.name, r.PrunedRefused, r.Failures, step.pruned)
		}
		if diff := cmp.Diff(step.left, h.sessionRows()); diff != "" {
			t.Fatalf("%s: session rows (-want +got):\n%s", step.name, diff)
		}
		if diff := cmp.Diff(otherRows, other.sessionRows()); diff != "" {
			t.Fatalf("%s: the other environment's session rows changed (-before +after):\n%s", step.name, diff)
		}
	}
	if got := h.status(running.ID); got != session.StatusRunning {
		t.Fatalf("the running session is %s after the runs, want it still running", got)
	}
	// The other environment's row was this reaper's to leave, not one it
	// could not delete: its own reaper deletes it.
	if r := other.run(); r.PrunedRefused != 1 || len(other.sessionRows()) != 0 {
		t.Fatalf("the other environment's reaper deleted %d refused opens, leaving %v; want its one deleted", r.PrunedRefused, other.sessionRows())
	}
}
