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

	"labkeep/shared/lifetime"
	"labkeep/shared/seating"
	"labkeep/shared/session"
	"labkeep/shared/setting"
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
	// RowFinisher is the row lock session.End ends sessions under.
	session.RowFinisher
	// Taker takes a row for ending (session.Ending.Unlocked): under the
	// row lock, in a transaction of its own, a row still live and due has
	// its expiry moved back by the clock's smallest step, so an extension
	// computed from the row as it was fails its compare-and-set, re-reads
	// and finds the session over.
	session.Taker
	// TryLock takes the named advisory lock if free (ok=false if not).
	TryLock(ctx context.Context, name string) (unlock func(), ok bool, err error)
	// RecordRun stores a finished run's report and returns its id.
	RecordRun(ctx context.Context, r Report) (int64, error)
	// Suspects returns the suspects the last run handed on.
	Suspects(ctx context.Context) ([]Suspect, error)
	// SaveSuspects replaces the stored suspects with these.
	SaveSuspects(ctx context.Context, s []Suspect) error
	// PruneRuns deletes at most limit stored runs that started before
	// before, oldest first, and returns how many it deleted.
	PruneRuns(ctx context.Context, before time.Time, limit int) (int, error)
	// HomeUse says, for each of the homes named, whether a live session
	// holds it and when the last session that held it finished; a home no
	// session mentions is absent from the map.
	HomeUse(ctx context.Context, homes []string) (map[string]HomeUse, error)
	// PruneRefused deletes at most limit session rows of refused opens
	// (failed, ended no_capacity by the open itself) that finished before
	// before, oldest first, and returns how many it deleted. It never
	// touches any other row: a live session, or one that ended any other
	// way, is a student's history and stays.
	PruneRefused(ctx context.Context, before time.Time, limit int) (int, error)
}

// Cluster is what a run needs of Kubernetes.
type Cluster interface {
	// Inventory lists the namespace with a fixed number of list calls.
	Inventory(ctx context.Context) (Inventory, error)
	// Delete removes one object; already gone counts as deleted. One not
	// labelled with this environment and the session its name belongs to
	// (or, for a home reader, as a home reader of this environment) is
	// never deleted: that is an error.
	Delete(ctx context.Context, r session.ObjectRef) error
	// Teardowner deletes every object a session can own, by name.
	session.Teardowner
	// ListHomes lists this environment's homes (one list call).
	ListHomes(ctx context.Context) ([]HomeClaim, error)
	// DeleteHome deletes a student's home, the claim of that UID; already
	// gone counts as deleted. A claim that is not a home of this
	// environment is never deleted: that is an error.
	DeleteHome(ctx context.Context, h HomeClaim) error
}

// Config are a reaper's settings (LABKEEP_REAP_* in the binaries); see
// DefaultConfig and Validate.
type Config struct {
	Rules
	// DryRun reports what a run would delete and deletes nothing.
	DryRun bool
	// RunDeadline bounds a whole run; shorter than the schedule period, so
	// runs never pile up.
	RunDeadline time.Duration
	// Workers is how many items are handled at once.
	Workers int
	// Retention is how long run records are kept: every run deletes the
	// records of runs that started longer ago.
	Retention time.Duration
	// RefusedRetention is how long the row of an open refused for lack of
	// capacity is kept: every run that deletes (not a dry run) deletes
	// the refused opens that finished longer ago. Such a row holds no lab
	// resource, but each refusal writes one, so without this they pile up
	// for as long as the database lives (the open rate only slows them).
	RefusedRetention time.Duration
	// RetentionBatch bounds each retention's deletes per run, the run
	// records' and the refused opens' alike: at most this many of each,
	// so a backlog (a first run against years of rows) is worked off over
	// several runs instead of in one long statement.
	RetentionBatch int
}

// MinRetention is the shortest Retention accepted: a day of runs, far more
// than adminStatus and its failing-run-after-run counts look back over.
const MinRetention = 24 * time.Hour

// MinRefusedRetention is the shortest RefusedRetention accepted: the
// per-student open rate counts a student's recent rows, refused ones
// included, so deleting them sooner would hand back opens the rate
// refuses; and the student who was refused still reads that session
// through getSession for a while after.
const MinRefusedRetention = time.Hour

// SchedulePeriod is how often the scheduler calls reapTick (every shipped
// schedule is once a minute); a run's deadline must stay below it.
const SchedulePeriod = time.Minute

// DefaultConfig is a reaper's configuration unless told otherwise; Env has
// no default.
func DefaultConfig() Config {
	return Config{
		Rules: Rules{ProvisionTimeout: 10 * time.Minute, ProvisionGrace: 2 * time.Minute,
			AbsentConfirm: 30 * time.Second, DownGrace: 5 * time.Minute, HomeRetention: 30 * 24 * time.Hour},
		RunDeadline:      50 * time.Second,
		Workers:          8,
		Retention:        30 * 24 * time.Hour,
		RefusedRetention: 24 * time.Hour,
		RetentionBatch:   1000,
	}
}

// Validate reports settings a reaper cannot run with; each message names
// the setting.
func (c Config) Validate() error {
	var errs []error
	if c.Env == "" {
		errs = append(errs, setting.Invalid("Env", "is required (this environment's labkeep.io/env)"))
	}
	if c.RunDeadline <= 0 {
		errs = append(errs, setting.Positive("RunDeadline", c.RunDeadline))
	} else if c.RunDeadline >= SchedulePeriod {
		errs = append(errs, setting.Invalid("RunDeadline", "%s must be below the reaper's schedule period %s, so runs never overlap", c.RunDeadline, SchedulePeriod))
	}
	errs = append(errs, setting.AtLeast("Workers", c.Workers, 1), setting.Positive("ProvisionTimeout", c.ProvisionTimeout),
		setting.AtLeast("RetentionBatch", c.RetentionBatch, 1), setting.Positive("AbsentConfirm", c.AbsentConfirm),
		setting.Positive("DownGrace", c.DownGrace))
	if c.Retention < MinRetention {
		errs = append(errs, setting.Invalid("Retention", "%s is below %s: the recent runs adminStatus reads would be deleted", c.Retention, MinRetention))
	}
	if c.HomeRetention != 0 && c.HomeRetention < MinHomeRetention {
		errs = append(errs, setting.Invalid("HomeRetention", "%s is below %s: a student's work must outlast a break (0 keeps homes for ever)", c.HomeRetention, MinHomeRetention))
	}
	if c.RefusedRetention < MinRefusedRetention {
		errs = append(errs, setting.Invalid("RefusedRetention", "%s is below %s: the open rate counts a student's recent refused opens, "+
			"and the student reads a refused session through getSession for a while", c.RefusedRetention, MinRefusedRetention))
	}
	if c.ProvisionGrace <= 0 {
		errs = append(errs, setting.Positive("ProvisionGrace", c.ProvisionGrace))
	} else if c.ProvisionGrace > c.ProvisionTimeout {
		errs = append(errs, setting.Invalid("ProvisionGrace", "%s exceeds the provision timeout %s", c.ProvisionGrace, c.ProvisionTimeout))
	}
	return errors.Join(errs...)
}

// Reaper runs reap passes. It holds no state between runs: any number of
// instances may exist; the database lock lets one run at a time.
type Reaper struct {
	Store   Store
	Cluster Cluster
	Config  Config
	Now     func() time.Time
	Log     *slog.Logger
	// Metrics counts every run and every run refused as busy; nil counts
	// nothing.
	Metrics Metrics
	// Backstop, if set, is handed on to after every run that deletes (not
	// a dry run): it serves the line, which hands capacity freed by
	// anything (an expiry, a ghost, a crash mid-close) to the students
	// waiting for it, then keeps the warm pool at its schedule's target.
	Backstop Backstop
}

// Backstop is what a run hands on to once it has deleted (seating.Usher):
// the reaper is the backstop of the line and of the warm pool, whatever
// else frees capacity or misses a pool's target.
type Backstop interface {
	// ServeWaitlist provisions the heads of the line that now fit.
	ServeWaitlist(ctx context.Context) (served int, err error)
	// MaintainPools keeps every lab's warm pool at its target.
	MaintainPools(ctx context.Context) (seating.PoolReport, error)
}

// RunOnce is reapTick and adminReapNow: it takes the reaper lock (ErrBusy if
// another run holds it), plans from the live rows, one inventory of the
// namespace and the suspects the last run handed on, hands this run's
// suspects on (a dry run too: they are observations, not deletions),
// handles every item in its own failure scope, deletes the run records
// and (unless a dry run) the refused opens past their retention, stores
// the report and returns it. A failed item is in Report.Failures, not in
// the error: the error is only for a run that could not start or could
// not even list the live sessions.
func (r *Reaper) RunOnce(ctx context.Context, trigger Trigger) (Report, error) {
	cfg := r.Config
	if err := cfg.Validate(); err != nil {
		return Report{}, fmt.Errorf("reap: %w", err)
	}
	// The deadline covers the whole run, taking the lock included.
	runCtx, cancel := context.WithTimeout(ctx, cfg.RunDeadline)
	defer cancel()
	unlock, ok, err := r.Store.TryLock(runCtx, LockName)
	if err != nil {
		return Report{}, fmt.Errorf("reaper lock: %w", err)
	}
	if !ok {
		r.metrics().Busy(trigger)
		return Report{}, fmt.Errorf("%w: another reaper run holds the lock", ErrBusy)
	}
	defer unlock()

	report := Report{Trigger: trigger, StartedAt: r.Now().UTC(), DryRun: cfg.DryRun,
		Counts: map[ItemKind]int{}, Failures: []Failure{}, Items: []Reaped{}}
	log := r.Log.With("trigger", trigger, "dryRun", cfg.DryRun)

	live, err := r.Store.ListLive(runCtx)
	if err != nil {
		return Report{}, fmt.Errorf("listing live sessions: %w", err)
	}
	var invp *Inventory
	inv, err := r.Cluster.Inventory(runCtx)
	if err != nil {
		// Expired sessions are torn down by name and need no inventory:
		// a list failure must not stop them.
		log.Warn("inventory failed; reaping expired sessions only", "err", err, "errType", fmt.Sprintf("%T", err))
		report.Failures = append(report.Failures, Failure{Kind: FailedInventory, Error: err.Error()})
	} else {
		invp = &inv
	}
	prev, err := r.Store.Suspects(runCtx)
	if err != nil {
		// Without the earlier looks nothing can be confirmed this run, and
		// what this look sees must not replace them.
		log.Warn("cannot read the suspects of earlier runs; confirming no ghost this run", "err", err)
		report.Failures = append(report.Failures, Failure{Kind: FailedSuspects, Error: err.Error()})
	}
	items, suspects := Plan(r.Now(), live, invp, prev, cfg.Rules)
	// Homes have a list of their own: failing to read them skips them
	// alone, never the sessions' sweep.
	homes, err := r.planHomes(runCtx)
	if err != nil {
		log.Warn("cannot plan unused homes; none deleted this run", "err", err)
		report.Failures = append(report.Failures, Failure{Kind: FailedHomes, Error: err.Error()})
	}
	items = append(items, homes...)
	if invp != nil && err == nil {
		if err := r.Store.SaveSuspects(runCtx, suspects); err != nil {
			log.Warn("cannot hand this run's suspects on", "err", err)
			report.Failures = append(report.Failures, Failure{Kind: FailedSuspects, Error: err.Error()})
		}
	}

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
					report.Counts[it.Kind]++
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

	// The records are kept in bounds and the report is stored even if the
	// run's deadline passed.
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer scancel()
	if n, err := r.Store.PruneRuns(sctx, report.StartedAt.Add(-cfg.Retention), cfg.RetentionBatch); err != nil {
		log.Warn("cannot delete old run records", "err", err)
		report.Failures = append(report.Failures, Failure{Kind: FailedRetention, Error: err.Error()})
	} else {
		report.PrunedRuns = n
	}
	// Refused opens are students' rows: a dry run deletes none of them.
	if !cfg.DryRun {
		if n, err := r.Store.PruneRefused(sctx, report.StartedAt.Add(-cfg.RefusedRetention), cfg.RetentionBatch); err != nil {
			log.Warn("cannot delete old refused opens", "err", err)
			report.Failures = append(report.Failures, Failure{Kind: FailedRetention, Error: "deleting old refused opens: " + err.Error()})
		} else {
			report.PrunedRefused = n
		}
	}
	if r.Backstop != nil && !cfg.DryRun {
		if n, err := r.Backstop.ServeWaitlist(runCtx); err != nil {
			log.Warn("cannot serve the waitlist", "served", n, "err", err)
		} else if n > 0 {
			log.Info("served the waitlist", "served", n)
		}
		if p, err := r.Backstop.MaintainPools(runCtx); err != nil {
			log.Warn("cannot keep the warm pool at its target", "err", err)
			report.Failures = append(report.Failures, Failure{Kind: FailedPool, Error: err.Error()})
		} else if p.Created > 0 || len(p.Deleted) > 0 {
			log.Info("warm pool maintained", "created", p.Created, "deleted", p.Deleted)
		}
	}
	report.FinishedAt = r.Now().UTC()
	if id, err := r.Store.RecordRun(sctx, report); err != nil {
		log.Error("cannot store run report", "err", err)
	} else {
		report.ID = id
	}
	liveVMs := -1
	if invp != nil {
		liveVMs = invp.VMs
	}
	r.metrics().Ran(report, len(live), liveVMs)
	log.Info("reap run done", "expired", report.Counts[Expired], "orphan", report.Counts[Orphan],
		"ghost", report.Counts[Ghost], "home", report.Counts[Home], "reader", report.Counts[HomeReader], "failures", len(report.Failures),
		"took", report.FinishedAt.Sub(report.StartedAt).String())
	return report, nil
}

// handle reaps one item and reports whether it did (false: it failed, or
// turned out not to need reaping) and its failures; a panic is a failure
// too, so not even a bug in one item's handling stops the others.
func (r *Reaper) handle(ctx context.Context, log *slog.Logger, it Item, dryRun bool) (reaped bool, failures []Failure) {
	log = log.With("kind", it.Kind, "session", shortID(it.SessionID))
	fail := func(object string, err error) {
		failures = append(failures, Failure{Kind: it.Kind, Session: it.SessionID, Object: object, Error: err.Error()})
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
		return r.endSession(ctx, log, it, dryRun, fail), failures
	case Orphan:
		return r.sweepOrphan(ctx, log, it, dryRun, fail), failures
	case Home:
		return r.deleteHome(ctx, log, it, dryRun, fail), failures
	case HomeReader:
		return r.deleteReader(ctx, log, it, dryRun, fail), failures
	}
	return false, failures
}

// endSession ends an expired or ghost session with session.End: it
// re-checks under the row lock that the row is still live and still due
// (an extension may have landed since the plan), deletes, and marks the row
// only once the deletes succeeded — a row marked final is never looked at
// again, so marking first would leak the VM forever. Where it can (see
// lockFree) End takes the row in a short transaction of its own and runs
// the deletes with no row lock held (session.Ending.Unlocked). A ghost is marked
// failed even if some leftover refuses to go: the student must not be
// locked out; the leftover becomes an orphan for the next run.
func (r *Reaper) endSession(ctx context.Context, log *slog.Logger, it Item, dryRun bool, fail func(string, error)) bool {
	e := session.Ending{Reason: it.End, EvenIfTeardownFails: it.Kind == Ghost}
	if it.Kind == Expired {
		e.Due = func(s session.Session) bool { return lifetime.Expired(s.Window, r.Now()) }
	} else {
		e.Due = func(s session.Session) bool { return s.Status == it.Session.Status }
	}
	if dryRun {
		cur, err := r.Store.Get(ctx, it.SessionID)
		if err != nil {
			fail("", err)
			return false
		}
		if !cur.Status.Live() || !e.Due(cur) {
			log.Info("would not reap after all: the row changed since the plan")
			return false
		}
		log.Info("would reap", "reason", it.Reason)
		return true
	}
	if lockFree(it) {
		// Taken in one short transaction, deleted with no lock and no
		// connection held, finished in another: however slow the API
		// server, a run never holds a row lock (which extend, close and
		// getSession's MarkRunning wait for) or a connection across a
		// delete.
		e.Unlocked = r.Store
	}
	_, ended, err := session.End(ctx, r.Store, r.Cluster, it.SessionID, e, r.Now().UTC())
	switch {
	case err != nil:
		fail("", err)
		return ended
	case !ended:
		log.Info("not reaped after all: the row changed since the plan (extended, closed or became ready)")
		return false
	}
	log.Info("reaped", "reason", it.Reason)
	return true
}

// lockFree reports whether the deletes of it may run outside the row lock: an
// expired session (nothing but the reaper and its student's close still
// ends it, and a taken row can no longer be extended) or a running
// ghost. A provisioning ghost is torn down under the lock, as every other
// ending is: its Open may still be creating objects, and must find the row
// final when it re-checks, so that it deletes what it created after these
// deletes.
func lockFree(it Item) bool {
	return it.Kind == Expired || it.Session.Status == session.StatusRunning
}

// sweepOrphan deletes an orphan's objects after checking again, right
// before deleting, that its session has no live row: a session whose row
// was written after this run listed the live rows must survive.
func (r *Reaper) sweepOrphan(ctx context.Context, log *slog.Logger, it Item, dryRun bool, fail func(string, error)) bool {
	if s, err := r.Store.Get(ctx, it.SessionID); err == nil && s.Status.Live() {
		log.Info("not an orphan after all: session is live now")
		return false
	} else if err != nil && !errors.Is(err, session.ErrNoSession) {
		fail("", fmt.Errorf("re-checking the session row: %w", err))
		return false
	}
	if dryRun {
		log.Info("would reap orphan", "reason", it.Reason, "objects", len(it.Objects))
		return true
	}
	ok := true
	for _, o := range it.Objects {
		if err := r.Cluster.Delete(ctx, o); err != nil {
			fail(o.String(), err)
			ok = false
		}
	}
	if ok {
		log.Info("reaped orphan", "objects", len(it.Objects))
	}
	return ok
}

// deleteReader deletes a home reader left behind. Cluster.Delete reads it
// again and deletes it only as that same Pod, still a home reader of this
// environment.
func (r *Reaper) deleteReader(ctx context.Context, log *slog.Logger, it Item, dryRun bool, fail func(string, error)) bool {
	o := it.Objects[0]
	if dryRun {
		log.Info("would delete home reader", "reason", it.Reason)
		return true
	}
	if err := r.Cluster.Delete(ctx, o); err != nil {
		fail(o.String(), err)
		return false
	}
	log.Info("deleted home reader", "reason", it.Reason)
	return true
}

func (it Item) record() Reaped {
	ri := Reaped{Kind: it.Kind, Session: it.SessionID, Reason: it.Reason}
	for _, o := range it.Objects {
		ri.Objects = append(ri.Objects, o.String())
	}
	if it.Kind == Home {
		ri.Objects = append(ri.Objects, "PersistentVolumeClaim/"+it.HomeClaim.Name)
	}
	return ri
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
