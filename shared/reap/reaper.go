package reap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"time"

	"labkeep/shared/kube"
	"labkeep/shared/lifetime"
	"labkeep/shared/pgstore"
	"labkeep/shared/session"
)

// Trigger is what started a run.
type Trigger string

// The two triggers.
const (
	TriggerSchedule Trigger = "schedule"
	TriggerAdmin    Trigger = "admin"
)

// ErrBusy means another run (another replica, an overlapping CronJob, a
// scheduler delivering twice) holds the reaper lock; this run did nothing.
var ErrBusy = errors.New("busy")

// LockName is the advisory lock every reaper of one database shares.
const LockName = "reaper"

// Store is what a run needs of the database.
type Store interface {
	// ListLive returns every live session.
	ListLive(ctx context.Context) ([]session.Session, error)
	// Get returns one session, or session.ErrNoSession.
	Get(ctx context.Context, id string) (session.Session, error)
	// FinishIf re-reads the row under its lock and, if it is still live and
	// due, runs act and marks the row final only if act succeeded — so an
	// extension can never slip in between deciding and deleting.
	FinishIf(ctx context.Context, id string, due func(session.Session) bool, act func(session.Session) error,
		status session.Status, reason string, at time.Time) (session.Session, bool, error)
	// TryLock takes the named advisory lock if free (ok=false if not).
	TryLock(ctx context.Context, name string) (unlock func(), ok bool, err error)
	// RecordRun stores a finished run's report.
	RecordRun(ctx context.Context, r pgstore.ReapRun) (int64, error)
}

// Cluster is what a run needs of Kubernetes.
type Cluster interface {
	// Inventory lists the namespace with a fixed number of list calls.
	Inventory(ctx context.Context) (kube.Inventory, error)
	// Delete removes one object; already gone counts as deleted.
	Delete(ctx context.Context, r kube.ObjectRef) error
	// Teardown deletes every object a session can own, by name.
	Teardown(ctx context.Context, s session.Session) error
}

var (
	_ Store   = (*pgstore.PG)(nil)
	_ Cluster = (*kube.Cluster)(nil)
)

// Config are a reaper's settings (LABKEEP_REAP_* in the binaries).
type Config struct {
	Rules
	// DryRun reports what a run would delete and deletes nothing.
	DryRun bool
	// RunDeadline bounds a whole run; shorter than the schedule period, so
	// runs never pile up (default 50s).
	RunDeadline time.Duration
	// Workers is how many items are handled at once (default 8).
	Workers int
}

// Reaper runs reap passes. It holds no state between runs: any number of
// instances may exist; the database lock lets one run at a time.
type Reaper struct {
	Store   Store
	Cluster Cluster
	Config  Config
	Now     func() time.Time
	Log     *slog.Logger
	// Metrics, if set, is updated after every run.
	Metrics *Metrics
}

// RunOnce is reapTick and adminReapNow: it takes the reaper lock (ErrBusy if
// another run holds it), plans from the live rows and one inventory of the
// namespace, handles every item in its own failure scope, stores the report
// and returns it. A failed item is in Report.Failures, not in the error:
// the error is only for a run that could not start or could not even list
// the live sessions.
func (r *Reaper) RunOnce(ctx context.Context, trigger Trigger) (pgstore.ReapRun, error) {
	cfg := r.config()
	if cfg.Env == "" {
		return pgstore.ReapRun{}, errors.New("reap: Config.Env (this environment's labkeep.io/env) is required")
	}
	// The deadline covers the whole run, taking the lock included.
	runCtx, cancel := context.WithTimeout(ctx, cfg.RunDeadline)
	defer cancel()
	unlock, ok, err := r.Store.TryLock(runCtx, LockName)
	if err != nil {
		return pgstore.ReapRun{}, fmt.Errorf("reaper lock: %w", err)
	}
	if !ok {
		r.Metrics.observeBusy(trigger)
		return pgstore.ReapRun{}, ErrBusy
	}
	defer unlock()

	report := pgstore.ReapRun{Trigger: string(trigger), StartedAt: r.Now().UTC(), DryRun: cfg.DryRun,
		Counts: map[string]int{}, Failures: []pgstore.ReapFailure{}, Items: []pgstore.ReapItem{}}
	log := r.Log.With("trigger", trigger, "dryRun", cfg.DryRun)

	live, err := r.Store.ListLive(runCtx)
	if err != nil {
		return pgstore.ReapRun{}, fmt.Errorf("listing live sessions: %w", err)
	}
	var invp *kube.Inventory
	inv, err := r.Cluster.Inventory(runCtx)
	if err != nil {
		// Expired sessions are torn down by name and need no inventory:
		// a list failure must not stop them.
		log.Warn("inventory failed; reaping expired sessions only", "err", err, "errType", fmt.Sprintf("%T", err))
		report.Failures = append(report.Failures, pgstore.ReapFailure{Kind: "inventory", Error: err.Error()})
	} else {
		invp = &inv
	}
	items := Plan(r.Now(), live, invp, cfg.Rules)

	var mu sync.Mutex
	work := make(chan Item)
	var wg sync.WaitGroup
	for range cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range work {
				reaped, failures := r.handle(runCtx, log, it, cfg.DryRun)
				mu.Lock()
				if reaped {
					report.Counts[string(it.Kind)]++
					report.Items = append(report.Items, it.record())
				}
				report.Failures = append(report.Failures, failures...)
				mu.Unlock()
			}
		}()
	}
	for _, it := range items {
		work <- it
	}
	close(work)
	wg.Wait()
	sort.Slice(report.Items, func(i, j int) bool {
		a, b := report.Items[i], report.Items[j]
		return a.Kind < b.Kind || (a.Kind == b.Kind && a.Session < b.Session)
	})

	report.FinishedAt = r.Now().UTC()
	// The report is stored even if the run's deadline passed.
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer scancel()
	if id, err := r.Store.RecordRun(sctx, report); err != nil {
		log.Error("cannot store run report", "err", err)
	} else {
		report.ID = id
	}
	liveVMs := -1
	if invp != nil {
		liveVMs = invp.VMs
	}
	r.Metrics.observeRun(report, len(live), liveVMs)
	log.Info("reap run done", "expired", report.Counts[string(Expired)], "orphan", report.Counts[string(Orphan)],
		"ghost", report.Counts[string(Ghost)], "failures", len(report.Failures),
		"took", report.FinishedAt.Sub(report.StartedAt).String())
	return report, nil
}

// handle reaps one item and reports whether it did (false: it failed, or
// turned out not to need reaping) and its failures; a panic is a failure
// too, so not even a bug in one item's handling stops the others.
func (r *Reaper) handle(ctx context.Context, log *slog.Logger, it Item, dryRun bool) (reaped bool, failures []pgstore.ReapFailure) {
	log = log.With("kind", it.Kind, "session", shortID(it.SessionID))
	fail := func(object string, err error) {
		failures = append(failures, pgstore.ReapFailure{Kind: string(it.Kind), Session: it.SessionID, Object: object, Error: err.Error()})
		log.Warn("reap failed", "object", object, "err", err, "errType", errType(err))
	}
	defer func() {
		if p := recover(); p != nil {
			fail("", fmt.Errorf("panic: %v\n%s", p, debug.Stack()))
			reaped = false
		}
	}()
	switch it.Kind {
	case Expired, Ghost:
		// Under the row lock: re-check that the row is still live and still
		// due (an extension may have landed since the plan), delete, and
		// mark the row only once the deletes succeeded. A row marked final
		// is never looked at again, so marking first would leak the VM
		// forever. A ghost is marked failed even if some leftover refuses
		// to go — the student must not be locked out; the leftover becomes
		// an orphan for the next run.
		status, due := session.StatusExpired, func(s session.Session) bool { return lifetime.Expired(s.Window, r.Now()) }
		if it.Kind == Ghost {
			status, due = session.StatusFailed, func(s session.Session) bool { return s.Status == it.Session.Status }
		}
		act := func(s session.Session) error {
			if dryRun {
				return errDryRun
			}
			err := r.Cluster.Teardown(ctx, s)
			if err != nil && it.Kind == Ghost {
				fail("", err)
				return nil
			}
			return err
		}
		_, marked, err := r.Store.FinishIf(ctx, it.SessionID, due, act, status, it.Reason, r.Now().UTC())
		switch {
		case errors.Is(err, errDryRun):
			log.Info("would reap", "reason", it.Reason)
			return true, failures
		case err != nil:
			fail("", err)
			return false, failures
		case !marked:
			log.Info("not reaped after all: the row changed since the plan (extended, closed or became ready)")
			return false, failures
		}
		log.Info("reaped", "reason", it.Reason)
		return true, failures
	case Orphan:
		// Re-check right before deleting: a session whose row was written
		// after this run listed the live rows must survive.
		if s, err := r.Store.Get(ctx, it.SessionID); err == nil && s.Status.Live() {
			log.Info("not an orphan after all: session is live now")
			return false, nil
		} else if err != nil && !errors.Is(err, session.ErrNoSession) {
			fail("", fmt.Errorf("re-checking the session row: %w", err))
			return false, failures
		}
		if dryRun {
			log.Info("would reap orphan", "reason", it.Reason, "objects", len(it.Objects))
			return true, nil
		}
		for _, o := range it.Objects {
			if err := r.Cluster.Delete(ctx, o); err != nil {
				fail(string(o.Kind)+"/"+o.Name, err)
			}
		}
		if len(failures) == 0 {
			log.Info("reaped orphan", "objects", len(it.Objects))
		}
		return len(failures) == 0, failures
	}
	return false, failures
}

// errDryRun stops FinishIf before it deletes or marks anything.
var errDryRun = errors.New("dry run")

func (it Item) record() pgstore.ReapItem {
	ri := pgstore.ReapItem{Kind: string(it.Kind), Session: it.SessionID, Reason: it.Reason}
	for _, o := range it.Objects {
		ri.Objects = append(ri.Objects, string(o.Kind)+"/"+o.Name)
	}
	return ri
}

func (r *Reaper) config() Config {
	c := r.Config
	if c.RunDeadline <= 0 {
		c.RunDeadline = 50 * time.Second
	}
	if c.Workers <= 0 {
		c.Workers = 8
	}
	if c.ProvisionTimeout <= 0 {
		c.ProvisionTimeout = 10 * time.Minute
	}
	if c.ProvisionGrace <= 0 {
		c.ProvisionGrace = 2 * time.Minute
	}
	return c
}

// shortID is the session id prefix logs carry (the first 8 characters of
// the UUID identify it among live sessions).
func shortID(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// errType names the innermost error type, for grouping failures in logs.
func errType(err error) string {
	for {
		u := errors.Unwrap(err)
		if u == nil {
			break
		}
		err = u
	}
	return strings.TrimPrefix(fmt.Sprintf("%T", err), "*")
}
