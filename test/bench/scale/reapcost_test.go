package scale_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"labkeep/localrun/benchtable"
	"labkeep/localrun/stacktest"
	"labkeep/shared/kube"
	"labkeep/shared/pgstore"
	"labkeep/shared/reap"
	"labkeep/shared/seating"
	"labkeep/shared/session"
)

// reapScale is one point of the reaper's cost curve: finished session
// rows in the database and live sessions with their objects.
type reapScale struct{ history, live int }

// BenchmarkTableReapCost: one scheduled reaper run (nothing due: every
// live session is running and within its time) as the history of finished
// sessions and the live sessions grow, each point built on the last, then
// one run at the largest point with 1 % of the live sessions due. Measured
// per run: its duration (median of three), the requests it sent the API
// server (counted by a RoundTripper on its rest config) and the queries it
// sent PostgreSQL (counted by a pgx tracer on its pools, the lock pools
// included). The baseline of the nothing-due runs, in the same run on the
// same stack and database, is a naive reaper that lists the live rows and
// GETs each one's VirtualMachine (with the reaper's client rate limits):
// its cost grows with every live row, due or not. The baseline of the run
// with work is the same reaper at the same point with nothing due: what
// the work added.
func BenchmarkTableReapCost(b *testing.B) {
	scales := []reapScale{{100, 10}, {1000, 10}, {10000, 10}, {10000, 100}, {10000, 1000}}
	if benchtable.Quick() {
		scales = scales[:1]
	}
	d := stacktest.Deploy(b, st, stacktest.Options{MaxVMs: 5000, KubeQPS: 500, KubeBurst: 1000, DBConns: 20, Log: stacktest.Discard()})
	m := newMeteredReaper(b, d)
	for range b.N {
		history, live := 0, 0
		var idle runCost
		for _, sc := range scales {
			addHistory(b, d, sc.history-history)
			openLive(b, d, live, sc.live)
			history, live = sc.history, sc.live
			// A first run settles what a new session's first look
			// records (suspects); the next ones are the steady state.
			m.reapRun(b, 0)
			idle = m.median(func() { m.reapRun(b, 0) })
			naive := m.median(func() {
				if seen := m.naiveRun(b, d.Namespace); seen != sc.live {
					b.Fatalf("the naive reaper saw %d live VMs, want %d", seen, sc.live)
				}
			})
			recordReapCost(b, fmt.Sprintf("%d finished rows, %d live sessions, nothing due", sc.history, sc.live),
				"naive reaper: list live rows, GET each one's VM (same run, same stack)", "median of three runs each", idle, naive)
		}
		due := max(1, live/100)
		expireSome(b, d, due)
		m.reset()
		t0 := time.Now()
		m.reapRun(b, due)
		work := m.cost(time.Since(t0))
		recordReapCost(b, fmt.Sprintf("%d finished rows, %d live sessions, %d due", history, live, due),
			"the same reaper at the same point with nothing due (row above)", "one run (its work is done once); baseline median of three", work, idle)
	}
}

// runCost is what one run cost.
type runCost struct {
	took    time.Duration
	api, db int64
}

func recordReapCost(b *testing.B, c, baseline, tookNote string, v, base runCost) {
	b.Helper()
	for _, f := range []struct {
		figure string
		v, bv  float64
		unit   string
		note   string
	}{
		{"run duration", ms(v.took), ms(base.took), "ms", tookNote},
		{"API requests per run", float64(v.api), float64(base.api), "req", ""},
		{"DB queries per run", float64(v.db), float64(base.db), "queries",
			"the reaper's fixed queries: its lock, the live rows, the suspects read and saved, retention, the run's record, the waitlist"},
	} {
		benchtable.Record(b, benchtable.Row{
			Group: "Reap cost vs scale", Case: c, Figure: f.figure, Value: f.v, Unit: f.unit,
			Baseline: baseline, BaselineValue: benchtable.F(f.bv), Note: f.note,
		})
	}
}

// expireSome moves the expiry of the n oldest running sessions to a
// second ago, as if their time had run out.
func expireSome(b *testing.B, d *stacktest.Deployment, n int) {
	b.Helper()
	tag, err := d.DB.Exec(context.Background(), `UPDATE sessions SET expires_at = $1 WHERE id IN
		(SELECT id FROM sessions WHERE status = 'running' ORDER BY started_at LIMIT $2)`, d.Clock.Now().Add(-time.Second), n)
	if err != nil {
		b.Fatal(err)
	}
	if tag.RowsAffected() != int64(n) {
		b.Fatalf("expired %d sessions, want %d", tag.RowsAffected(), n)
	}
}

// meteredReaper is the deployment's reaper, wired as production but with
// its API requests and database queries counted.
type meteredReaper struct {
	reaper  reap.Reaper
	store   *pgstore.PG
	dyn     dynamic.Interface
	api, db atomic.Int64
}

func newMeteredReaper(b *testing.B, d *stacktest.Deployment) *meteredReaper {
	b.Helper()
	m := &meteredReaper{}
	rc := rest.CopyConfig(d.App.Kube)
	rc.Wrap(func(next http.RoundTripper) http.RoundTripper { return countingTransport{next: next, n: &m.api} })
	kcfg := d.App.Config.Kube // as Build resolved it
	cluster, err := kube.NewForConfig(kcfg, rc)
	if err != nil {
		b.Fatal(err)
	}
	// The naive reaper's client has the same client-side rate limits as
	// the reaper's.
	naive := rest.CopyConfig(rc)
	naive.QPS, naive.Burst = kcfg.QPS, kcfg.Burst
	if m.dyn, err = dynamic.NewForConfig(naive); err != nil {
		b.Fatal(err)
	}
	tracer := pgstore.Option(func(c *pgxpool.Config) { c.ConnConfig.Tracer = queryCounter{n: &m.db} })
	if m.store, err = pgstore.Open(context.Background(), d.App.Config.DatabaseURL, d.Env, tracer, pgstore.MaxConns(d.App.Config.ReapDBConns)); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(m.store.Close)
	// The sessions the run hands capacity to (the waitlist) are served
	// through the same counted store and cluster.
	app := d.App.Sessions.Starter
	rows := session.Starter{Store: m.store, Cluster: cluster, Policy: app.Policy, CleanupTimeout: app.CleanupTimeout, Now: app.Now, Log: app.Log, Metrics: app.Metrics}
	usher := seating.NewUsher(seating.Config{
		Rows: &rows, Store: m.store, Cluster: cluster, Labs: d.App.Labs,
		Limits: d.App.Config.Limits, Waitlist: m.store, Now: d.Clock.Now, Log: stacktest.Discard(),
	})
	m.reaper = *d.App.Reaper
	m.reaper.Store, m.reaper.Cluster, m.reaper.Backstop = m.store, cluster, usher
	return m
}

func (m *meteredReaper) reset() { m.api.Store(0); m.db.Store(0) }

// cost is the counts since the last reset, with took.
func (m *meteredReaper) cost(took time.Duration) runCost {
	return runCost{took: took, api: m.api.Load(), db: m.db.Load()}
}

// median runs run three times, the counters reset before each, and
// returns the median duration with the last run's counts (the same every
// time when nothing changes).
func (m *meteredReaper) median(run func()) runCost {
	var c runCost
	var took []time.Duration
	for range 3 {
		m.reset()
		t0 := time.Now()
		run()
		c = m.cost(time.Since(t0))
		took = append(took, c.took)
	}
	c.took = benchtable.Quantile(took, 0.5)
	return c
}

// reapRun is one scheduled run that must reap exactly due expired
// sessions and fail nothing.
func (m *meteredReaper) reapRun(b *testing.B, due int) {
	b.Helper()
	rep, err := m.reaper.RunOnce(context.Background(), reap.TriggerSchedule)
	if err != nil {
		b.Fatal(err)
	}
	if len(rep.Items) != due || rep.Counts[reap.Expired] != due || len(rep.Failures) != 0 {
		b.Fatalf("run reaped %+v with failures %+v, want %d expired and no failure", rep.Items, rep.Failures, due)
	}
}

// naiveRun is the baseline reaper's look: every live row from the
// database, then one GET of each one's VirtualMachine. It returns how many
// VMs it found.
func (m *meteredReaper) naiveRun(b *testing.B, ns string) int {
	b.Helper()
	ctx := context.Background()
	live, err := m.store.ListLive(ctx)
	if err != nil {
		b.Fatal(err)
	}
	found := 0
	for _, s := range live {
		_, err := m.dyn.Resource(stacktest.Resource("VirtualMachine")).Namespace(ns).Get(ctx, session.NodeName(s.ID, s.Nodes[0].Name), metav1.GetOptions{})
		if err != nil {
			b.Fatalf("naive reaper: VM of %s: %v", s.ID, err)
		}
		found++
	}
	return found
}

// countingTransport counts the requests sent through it.
type countingTransport struct {
	next http.RoundTripper
	n    *atomic.Int64
}

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}

// queryCounter is a pgx tracer counting the queries sent.
type queryCounter struct{ n *atomic.Int64 }

func (q queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	q.n.Add(1)
	return ctx
}

func (queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// addHistory adds n finished session rows, copies of one closed session
// (opened and closed through the functions) under new ids and students,
// in one statement.
func addHistory(b *testing.B, d *stacktest.Deployment, n int) {
	b.Helper()
	if n <= 0 {
		return
	}
	ctx := context.Background()
	var template string
	if err := d.DB.QueryRow(ctx, `SELECT id::text FROM sessions WHERE status = 'closed' LIMIT 1`).Scan(&template); err != nil {
		student := "history-" + stacktest.Suffix()
		opened, err := d.App.Sessions.Open(ctx, student, "linux-vm", "")
		if err != nil {
			b.Fatal(err)
		}
		s := opened.Session
		if _, err := d.App.Sessions.Close(ctx, student, s.ID, session.ActorStudent, student); err != nil {
			b.Fatal(err)
		}
		template = s.ID
	}
	rows, err := d.DB.Query(ctx, `SELECT column_name FROM information_schema.columns WHERE table_name = 'sessions' ORDER BY ordinal_position`)
	if err != nil {
		b.Fatal(err)
	}
	cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		b.Fatal(err)
	}
	sel := make([]string, len(cols))
	for i, c := range cols {
		switch c {
		case "id":
			sel[i] = "gen_random_uuid()"
		case "student":
			sel[i] = "student || '-h' || g"
		default:
			sel[i] = c
		}
	}
	q := fmt.Sprintf(`INSERT INTO sessions (%s) SELECT %s FROM sessions, generate_series(1, $2) g WHERE id = $1`,
		strings.Join(cols, ", "), strings.Join(sel, ", "))
	if _, err := d.DB.Exec(ctx, q, template, n); err != nil {
		b.Fatal(err)
	}
	if _, err := d.DB.Exec(ctx, `ANALYZE sessions`); err != nil {
		b.Fatal(err)
	}
}

// openLive opens live sessions until there are want (from have), through
// the Service as students do, waits for each to be running and returns
// the new sessions' students. It is set-up, not measured: the opens skip
// the capacity lock (the deployments here have room for every session),
// so they create in parallel instead of one at a time.
func openLive(b *testing.B, d *stacktest.Deployment, have, want int) []string {
	b.Helper()
	ctx := context.Background()
	svc := unlocked(d)
	prefix := "live-" + stacktest.Suffix()
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	var students []string
	for i := have; i < want; i++ {
		student := fmt.Sprintf("%s-%d", prefix, i)
		students = append(students, student)
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			opened, err := svc.Open(ctx, student, "linux-vm", "")
			if err != nil {
				b.Errorf("open %s: %v", student, err)
				return
			}
			id := opened.Session.ID
			// Each getSession asks the API server about the VM: poll
			// no faster than virtsim boots, so a thousand set-up polls
			// don't load the stack the measured runs share.
			var status session.Status
			for give := time.Now().Add(time.Minute); ; {
				time.Sleep(liveBoot)
				got, err := svc.Get(ctx, student, id)
				if err == nil {
					status = got.Session.Status
				}
				if err == nil && status == session.StatusRunning {
					break
				}
				if time.Now().After(give) {
					b.Errorf("session %s of %s not running within a minute: %s %v", id, student, status, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
	return students
}
