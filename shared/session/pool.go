package session

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"labkeep/shared/labs"
	"labkeep/shared/warmpool"
)

// The warm pool. Per lab, a number of instances (the lab's VMs or
// workspace Pod) is provisioned ahead of any student, as the schedule
// (warmpool.Schedule) asks, so an open can take a ready one instead of
// waiting for a cold provision. A pool instance is an ordinary session row
// (Pool PoolIdle, student PoolStudent), so it counts against the same
// capacity, the reaper's inventory sees its objects as a live session's
// (never orphans), its ghosts and ends go through End like any session's,
// and a waiting student's place in the line is never jumped: capacity a
// pool instance holds is capacity in use.
//
// A claim is one transaction under the instance's row lock (PoolStore.ClaimPooled):
// the open's own provisioning row (or the waitlist entry) goes, the
// instance's row becomes the student's, and, before it commits, the
// cluster gives the running instance the student's labels and public key
// (PoolCluster.Claim). Two opens never get one instance: the second skips
// the locked row. If the cluster step fails nothing is committed, the
// instance is ended (it may hold part of a student's credentials) and the
// open provisions cold.

// PoolState marks warm-pool rows.
type PoolState string

// The pool states of a session row.
const (
	// PoolIdle: an unclaimed pool instance, owned by PoolStudent.
	PoolIdle PoolState = "idle"
	// PoolClaimed: a student's session that came from the pool.
	PoolClaimed PoolState = "claimed"
)

// PoolStudent is the student of every unclaimed pool instance. Student
// reads (LiveFor, Latest) never return an idle instance, whoever asks.
const PoolStudent = "labkeep:pool"

// PoolStore is the database side of the warm pool.
type PoolStore interface {
	// ClaimPooled takes the oldest running idle instance of lab whose TTL
	// has not passed at at, under its row lock (skipping instances another claim or an End holds), deletes
	// the row or waitlist entry replaces (the student's open or place in
	// line; ErrNoSession if neither exists any more), then calls
	// claim(instance) and, if it returns nil error, writes the session it
	// returned (student, key, window, ready time; Pool PoolClaimed,
	// ClaimedFor replaces) and commits. ErrNoSession if lab has no ready
	// idle instance. On any error nothing changes; the instance as read is
	// returned when there was one.
	ClaimPooled(ctx context.Context, lab, replaces string, at time.Time, claim func(instance Session) (Session, error)) (Session, error)
}

// PoolCluster is the cluster side of a claim.
type PoolCluster interface {
	// Claim makes the running pool instance s (already carrying its new
	// student and key) the student's: their labels on its objects and their
	// public key (with the platform's) authorized on every node, without a
	// restart.
	Claim(ctx context.Context, s Session, lab labs.Lab) error
}

// WarmPool configures the Service's warm pool.
type WarmPool struct {
	Schedule warmpool.Schedule
	// TTL is how long an unclaimed instance lives before it is replaced.
	TTL     time.Duration
	Store   PoolStore
	Cluster PoolCluster
}

// DefaultPoolTTL and DefaultPoolLead are the warm pool's defaults: an
// instance is replaced after 4 hours, and a scheduled window's instances
// are started 10 minutes before it opens.
const (
	DefaultPoolTTL  = 4 * time.Hour
	DefaultPoolLead = 10 * time.Minute
)

// claimPooled gives the open's row sess (or a waitlist entry with sess.ID)
// a ready pool instance of lab; ok is false when none could be claimed,
// and the open provisions cold. Called under the capacity lock, only when
// nobody waits ahead of the student in their pool's line.
func (s *Service) claimPooled(ctx context.Context, sess Session, lab labs.Lab) (claimed Session, ok bool) {
	p := s.Pool
	if p == nil || p.Store == nil || p.Cluster == nil {
		return Session{}, false
	}
	tried := false // the cluster step ran: the instance may hold the student's key
	instance, err := p.Store.ClaimPooled(ctx, lab.Name, sess.ID, s.now(), func(inst Session) (Session, error) {
		tried = true
		c := inst
		c.Student, c.StudentKey = sess.Student, sess.StudentKey
		c.Window = s.Policy.Open(s.now())
		c.Pool, c.ClaimedFor = PoolClaimed, sess.ID
		if err := p.Cluster.Claim(ctx, c, lab); err != nil {
			return c, err
		}
		// The student could log in from now: that is their time to ready.
		c.ReadyAt = s.now()
		return c, nil
	})
	switch {
	case err == nil:
		s.Metrics.poolClaimed(lab.Name, "ok")
		s.Log.Info("claimed from the warm pool", "session", instance.ID, "lab", lab.Name, "student", sess.Student, "for", sess.ID)
		s.Metrics.ready(instance)
		return instance, true
	case !tried && instance.ID == "" && errors.Is(err, ErrNoSession):
		s.Metrics.poolClaimed(lab.Name, "empty")
		return Session{}, false
	case !tried:
		// The open was closed meanwhile, or a database fault: the
		// instance was not touched and stays in the pool.
		s.Log.Warn("no warm pool claim", "lab", lab.Name, "for", sess.ID, "err", err)
		return Session{}, false
	}
	s.Metrics.poolClaimed(lab.Name, "failed")
	s.Log.Warn("cannot claim a warm pool instance; provisioning cold", "lab", lab.Name, "instance", instance.ID, "err", err)
	// Part of the student's credentials may have reached it: it is never
	// handed to anyone else.
	s.retire(ctx, instance.ID, "claim failed: "+err.Error())
	return Session{}, false
}

// retire ends an unclaimed instance through End, recording why.
func (s *Service) retire(ctx context.Context, id, why string) {
	reason := EndReason{Kind: EndClosed, Actor: ActorReaper, Detail: "warm pool: " + why}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.Limits.CleanupTimeout)
	defer cancel()
	_, _, err := End(cctx, s.Store, s.Cluster, id, Ending{
		Reason: reason, EvenIfTeardownFails: true,
		Due: func(cur Session) bool { return cur.Pool == PoolIdle },
	}, s.now())
	if err != nil {
		s.Log.Warn("cannot end warm pool instance; the reaper retries", "session", id, "err", err)
	}
}

// PoolStatus is one lab's warm pool as the admin status shows it.
type PoolStatus struct {
	Lab    string `json:"lab"`
	Target int    `json:"target"`
	// Idle instances are ready to be claimed; Starting ones not yet.
	Idle     int `json:"idle"`
	Starting int `json:"starting"`
	// Claimed is how many live sessions came from the pool.
	Claimed int `json:"claimed"`
}

// PoolStatuses summarises every lab of the schedule (and any lab that
// still has pool rows) from the live rows at now, by lab name.
func PoolStatuses(sched warmpool.Schedule, live []Session, now time.Time) []PoolStatus {
	by := map[string]*PoolStatus{}
	var order []string
	get := func(lab string) *PoolStatus {
		if p, ok := by[lab]; ok {
			return p
		}
		p := &PoolStatus{Lab: lab, Target: sched.Target(lab, now)}
		by[lab] = p
		order = append(order, lab)
		return p
	}
	for _, lab := range sched.Labs() {
		get(lab)
	}
	for _, l := range live {
		switch {
		case l.Pool == PoolIdle && l.Status == StatusRunning:
			get(l.Lab).Idle++
		case l.Pool == PoolIdle:
			get(l.Lab).Starting++
		case l.Pool == PoolClaimed:
			get(l.Lab).Claimed++
		}
	}
	slices.Sort(order)
	out := make([]PoolStatus, 0, len(order))
	for _, lab := range order {
		out = append(out, *by[lab])
	}
	return out
}

// Pools is every lab's warm pool now (PoolStatuses over the live rows);
// none without a pool.
func (s *Service) Pools(ctx context.Context) ([]PoolStatus, error) {
	if s.Pool == nil {
		return []PoolStatus{}, nil
	}
	live, err := s.Store.ListLive(ctx)
	if err != nil {
		return nil, err
	}
	return PoolStatuses(s.Pool.Schedule, live, s.now()), nil
}

// PoolReport is what one maintenance pass did.
type PoolReport struct {
	Created int
	Deleted map[string]int // by reason
}

// MaintainPools runs the warm pool plan (warmpool.Plan) for every lab of
// the schedule: provisioning pool instances are checked against the
// cluster (and turn running when ready; the line is then served, so a
// waiting student gets a newly ready instance), instances past their TTL, over
// the target, or holding capacity a waiting student needs are ended
// through End, and new instances are created, each under the capacity
// lock with its own count, so the pool never takes capacity a student's
// open or the line got first. The reaper calls it every run. A lab that
// left the catalog has its instances ended.
func (s *Service) MaintainPools(ctx context.Context) (PoolReport, error) {
	rep := PoolReport{Deleted: map[string]int{}}
	p := s.Pool
	if p == nil {
		return rep, nil
	}
	live, err := s.Store.ListLive(ctx)
	if err != nil {
		return rep, err
	}
	readied := false
	for _, l := range live {
		if l.Pool == PoolIdle && l.Status == StatusProvisioning {
			readied = s.refresh(ctx, l).Status == StatusRunning || readied
		}
	}
	if readied {
		// An instance that just became ready goes to the head of its
		// line, if anyone waits, before the plan would shrink the pool.
		s.serveDetached(ctx)
		if live, err = s.Store.ListLive(ctx); err != nil {
			return rep, err
		}
	}
	labsToPlan := p.Schedule.Labs()
	for _, l := range live {
		if l.Pool == PoolIdle && !slices.Contains(labsToPlan, l.Lab) {
			labsToPlan = append(labsToPlan, l.Lab)
		}
	}
	var errs []error
	for _, name := range labsToPlan {
		if err := s.maintainLab(ctx, name, live, &rep); err != nil {
			errs = append(errs, fmt.Errorf("warm pool %s: %w", name, err))
		}
	}
	return rep, errors.Join(errs...)
}

// maintainLab plans lab name's pool from the live rows and carries the
// plan out.
func (s *Service) maintainLab(ctx context.Context, name string, live []Session, rep *PoolReport) error {
	p := s.Pool
	now := s.now()
	lab, known := s.Labs.Get(name)
	in := warmpool.Input{TTL: p.TTL, Now: now}
	if known {
		in.Target = p.Schedule.Target(name, now)
	}
	in.Instances = poolInstances(live, name)
	// Deletions first, outside the capacity lock (End holds the row lock,
	// and what it frees is handed to the line right after).
	var c capacity
	if known {
		c = s.capacityFor(lab)
		waiting, err := s.waiting(ctx, c.what)
		if err != nil {
			return err
		}
		in.Waiting = waiting
		if waiting > 0 {
			in.Instances = s.spareBooting(ctx, name, in.Instances)
		}
	}
	d := warmpool.Plan(in)
	for _, del := range d.Delete {
		s.retire(ctx, del.Instance.ID, del.Reason)
		rep.Deleted[del.Reason]++
	}
	if len(d.Delete) > 0 {
		s.serveDetached(ctx)
	}
	if !known || in.Target <= len(in.Instances)-len(d.Delete) {
		return nil
	}
	return s.grow(ctx, lab, c, in, rep)
}

// spareBooting leaves out of the plan up to as many of lab's booting
// instances as students wait for lab itself: each serves one of them as
// soon as it is ready (MaintainPools serves the line when an instance
// turns ready), sooner than the cold provision its freed capacity would
// start. Shrinking first while students wait is for capacity that
// instances hold and a student of another lab needs.
func (s *Service) spareBooting(ctx context.Context, lab string, in []warmpool.Instance) []warmpool.Instance {
	if s.Waitlist == nil {
		return in
	}
	line, err := s.Waitlist.Line(ctx)
	if err != nil {
		return in
	}
	n := 0
	for _, e := range line {
		if e.Lab == lab {
			n++
		}
	}
	var out []warmpool.Instance
	for _, i := range in {
		if !i.Ready && n > 0 {
			n--
			continue
		}
		out = append(out, i)
	}
	return out
}

// grow creates the instances the plan asks for, under the capacity lock:
// the plan is made again there with the free capacity and the line as
// they are then.
func (s *Service) grow(ctx context.Context, lab labs.Lab, c capacity, in warmpool.Input, rep *PoolReport) error {
	lctx, cancel := context.WithTimeout(ctx, s.Limits.CapacityWait)
	unlock, err := s.Store.LockCapacity(lctx)
	cancel()
	if err != nil {
		return fmt.Errorf("capacity lock: %w", err)
	}
	defer unlock()
	used, err := c.count(ctx)
	if err != nil {
		return err
	}
	if in.Waiting, err = s.waiting(ctx, c.what); err != nil {
		return err
	}
	in.Free = 0
	if c.need > 0 {
		in.Free = max(c.limit-used, 0) / c.need
	}
	live, err := s.Store.ListLive(ctx)
	if err != nil {
		return err
	}
	in.Instances = poolInstances(live, lab.Name)
	d := warmpool.Plan(in)
	for range d.Create {
		if err := s.createInstance(ctx, lab); err != nil {
			return err
		}
		rep.Created++
	}
	return nil
}

// createInstance writes a pool instance's row and creates its objects
// (called under the capacity lock). Its window is the TTL: the reaper
// expires an instance nobody claimed even if no maintenance runs.
func (s *Service) createInstance(ctx context.Context, lab labs.Lab) error {
	sess, err := s.newSession(uuid.NewString(), PoolStudent, lab, "")
	if err != nil {
		return err
	}
	// Pool instances authorize no student: the generated pair is dropped.
	sess.StudentKey, sess.Issued.StudentPrivateKey = "", ""
	sess.Pool = PoolIdle
	sess.ExpiresAt = sess.StartedAt.Add(s.Pool.TTL)
	sess.MaxExpiresAt = sess.ExpiresAt
	if err := s.Store.Create(ctx, sess); err != nil {
		return err
	}
	log := s.Log.With("session", sess.ID, "lab", lab.Name)
	if err := s.Cluster.Provision(ctx, sess, lab); err != nil {
		_, _ = s.rollback(ctx, log, sess, fmt.Errorf("%w: warm pool instance: %w", ErrProvisioning, err), true)
		return err
	}
	log.Info("warm pool instance created")
	return nil
}

// poolInstances are the unclaimed pool instances of lab among rows, as
// the plan sees them.
func poolInstances(rows []Session, lab string) []warmpool.Instance {
	var out []warmpool.Instance
	for _, l := range rows {
		if l.Pool == PoolIdle && l.Lab == lab {
			out = append(out, warmpool.Instance{ID: l.ID, Lab: l.Lab, CreatedAt: l.StartedAt, Ready: l.Status == StatusRunning})
		}
	}
	return out
}

var poolDesc = prometheus.NewDesc("labkeep_pool_instances",
	"Warm pool instances by lab and state (target, idle, starting, claimed), read from the database at scrape.", []string{"lab", "state"}, nil)

// PoolCollector is every lab's warm pool as gauges
// (labkeep_pool_instances), read with Pools at every scrape, so they are
// the database's truth whichever instance maintains the pool. Register it
// with the registry of NewMetrics; without a pool it reports nothing.
func (s *Service) PoolCollector() prometheus.Collector { return poolCollector{s} }

// poolCollector reads the pools at each scrape. A failed read reports no
// pool gauges rather than stale numbers.
type poolCollector struct{ svc *Service }

func (c poolCollector) Describe(ch chan<- *prometheus.Desc) { ch <- poolDesc }

func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	pools, ok := atScrape(c.svc.Pools)
	if !ok {
		return
	}
	for _, p := range pools {
		for state, n := range map[string]int{"target": p.Target, "idle": p.Idle, "starting": p.Starting, "claimed": p.Claimed} {
			ch <- prometheus.MustNewConstMetric(poolDesc, prometheus.GaugeValue, float64(n), p.Lab, state)
		}
	}
}
