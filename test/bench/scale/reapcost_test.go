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
	"labkeep/shared/session"
)

// reapScale is one point of the reaper's cost curve: finished session
// rows in the database and live sessions with their objects.
type reapScale struct{ history, live int }

// BenchmarkTableReapCost: one scheduled reaper run (nothing due: every
// live session is running and within its time) as the history of finished
// sessions and the live sessions grow, each point built on the last.
// Measured per run: its duration, the requests it sent the API server
// (counted by a RoundTripper on its rest config) and the queries it sent
// PostgreSQL (counted by a pgx tracer on its pools, the lock pools
// included). The baseline, in the same run on the same stack and
// database, is a naive reaper that lists the live rows and GETs each one's
// VirtualMachine: its cost grows with every live row, due or not.
func BenchmarkTableReapCost(b *testing.B) {
	scales := []reapScale{{100, 10}, {1000, 10}, {10000, 10}, {10000, 100}, {10000, 1000}}
	if benchtable.Quick() {
		scales = scales[:1]
	}
	d := stacktest.Deploy(b, st, stacktest.Options{MaxVMs: 5000, KubeQPS: 500, KubeBurst: 1000, PoolSize: 20, Log: stacktest.Discard()})
	m := newMeteredReaper(b, d)
	for range b.N {
		history, live := 0, 0
		for _, sc := range scales {
			addHistory(b, d, sc.history-history)
			openLive(b, d, live, sc.live)
			history, live = sc.history, sc.live

			// A first run settles what a new session's first look
			// records (suspects); the second is the steady state.
			if _, err := m.reaper.RunOnce(context.Background(), reap.TriggerSchedule); err != nil {
				b.Fatal(err)
			}
			m.reset()
			t0 := time.Now()
			rep, err := m.reaper.RunOnce(context.Background(), reap.TriggerSchedule)
			took := time.Since(t0)
			if err != nil {
				b.Fatal(err)
			}
			if n := len(rep.Items) + len(rep.Failures); n != 0 {
				b.Fatalf("the steady-state run had %d items or failures, want none: %+v %+v", n, rep.Items, rep.Failures)
			}
			api, db := m.counts()

			m.reset()
			t0 = time.Now()
			seen := m.naiveRun(b, d.Namespace)
			naiveTook := time.Since(t0)
			naiveAPI, naiveDB := m.counts()
			if seen != sc.live {
				b.Fatalf("the naive reaper saw %d live VMs, want %d", seen, sc.live)
			}
			recordReapCost(b, sc, took, api, db, naiveTook, naiveAPI, naiveDB)
		}
	}
}

func recordReapCost(b *testing.B, sc reapScale, took time.Duration, api, db int64, naiveTook time.Duration, naiveAPI, naiveDB int64) {
	b.Helper()
	c := fmt.Sprintf("%d finished rows, %d live sessions, nothing due", sc.history, sc.live)
	const baseline = "naive reaper: list live rows, GET each one's VM (same run, same stack)"
	for _, f := range []struct {
		figure string
		v, bv  float64
		unit   string
	}{
		{"run duration", ms(took), ms(naiveTook), "ms"},
		{"API requests per run", float64(api), float64(naiveAPI), "req"},
		{"DB queries per run", float64(db), float64(naiveDB), "queries"},
	} {
		benchtable.Record(b, benchtable.Row{
			Group: "Reap cost vs scale", Case: c, Figure: f.figure, Value: f.v, Unit: f.unit,
			Baseline: baseline, BaselineValue: benchtable.F(f.bv),
		})
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
	kcfg, err := d.App.Config.Kube()
	if err != nil {
		b.Fatal(err)
	}
	cluster, err := kube.NewForConfig(kcfg, rc)
	if err != nil {
		b.Fatal(err)
	}
	if m.dyn, err = dynamic.NewForConfig(rc); err != nil {
		b.Fatal(err)
	}
	tracer := pgstore.Option(func(c *pgxpool.Config) { c.ConnConfig.Tracer = queryCounter{n: &m.db} })
	if m.store, err = pgstore.Open(context.Background(), d.App.Config.DatabaseURL, d.Env, tracer, pgstore.MaxConns(d.App.Config.ReapDBConns)); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(m.store.Close)
	// The sessions the run hands capacity to (the waitlist) are served
	// through the same counted store and cluster.
	svc := *d.App.Sessions
	svc.Store, svc.Waitlist, svc.Cluster = m.store, m.store, cluster
	m.reaper = *d.App.Reaper
	m.reaper.Store, m.reaper.Cluster, m.reaper.Waitlist = m.store, cluster, &svc
	return m
}

func (m *meteredReaper) reset() { m.api.Store(0); m.db.Store(0) }

func (m *meteredReaper) counts() (api, db int64) { return m.api.Load(), m.db.Load() }

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
		s, err := d.App.Sessions.Open(ctx, student, "linux-vm", "")
		if err != nil {
			b.Fatal(err)
		}
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
// the new sessions' students.
func openLive(b *testing.B, d *stacktest.Deployment, have, want int) []string {
	b.Helper()
	ctx := context.Background()
	prefix := "live-" + stacktest.Suffix()
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	var students []string
	for i := have; i < want; i++ {
		student := fmt.Sprintf("%s-%d", prefix, i)
		students = append(students, student)
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			s, err := d.App.Sessions.Open(ctx, student, "linux-vm", "")
			if err != nil {
				b.Errorf("open %s: %v", student, err)
				return
			}
			wctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			err = stacktest.Until(wctx, func() (bool, string) {
				s, err = d.App.Sessions.Get(ctx, student, s.ID)
				return err == nil && s.Status == session.StatusRunning, fmt.Sprintf("session %s: %s %v", s.ID, s.Status, err)
			})
			if err != nil {
				b.Errorf("open %s: %v", student, err)
			}
		})
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
	return students
}
