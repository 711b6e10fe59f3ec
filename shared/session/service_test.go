package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"labkeep/shared/line"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/shared/labs"
	"labkeep/shared/lifetime"
)

// memStore is an in-memory Store for testing the Service's decisions; the
// real store's guarantees are tested against PostgreSQL in pgstore.
type memStore struct {
	mu       sync.Mutex
	rows     map[string]Session
	conflict int // Extend calls to fail with ErrConflict first
}

func (m *memStore) Create(_ context.Context, s Session) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.rows {
		if r.Student == s.Student && r.Status.Live() {
			return ErrSessionExists
		}
	}
	s.Issued = Issued{} // a store keeps no secrets (test/pgstore shows PostgreSQL's doesn't)
	m.rows[s.ID] = s
	return nil
}

func (m *memStore) Get(_ context.Context, id string) (Session, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.rows[id]
	if !ok {
		return s, ErrNoSession
	}
	return s, nil
}

func (m *memStore) LiveFor(_ context.Context, student string) (Session, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.rows {
		if r.Student == student && r.Status.Live() {
			return r, nil
		}
	}
	return Session{}, ErrNoSession
}

func (m *memStore) Latest(ctx context.Context, student string) (Session, error) {
	return m.LiveFor(ctx, student)
}

func (m *memStore) ListLive(context.Context) ([]Session, error) { return nil, nil }

func (m *memStore) MarkRunning(_ context.Context, id string, at time.Time, nodes []Node) (Session, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.rows[id]
	if s.Status != StatusProvisioning {
		return s, ErrNotLive
	}
	s.Status, s.ReadyAt, s.Nodes = StatusRunning, at, nodes
	m.rows[id] = s
	return s, nil
}

func (m *memStore) RecentOpens(_ context.Context, student string, since time.Time, limit int) ([]time.Time, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []time.Time
	for _, s := range m.rows {
		if s.Student == student && s.StartedAt.After(since) {
			out = append(out, s.StartedAt)
		}
	}
	slices.SortFunc(out, func(a, b time.Time) int { return b.Compare(a) })
	return out[:min(len(out), limit)], nil
}

func (m *memStore) SetNodes(_ context.Context, id string, nodes []Node) (Session, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.rows[id]
	if s.Status != StatusRunning {
		return s, ErrNotLive
	}
	s.Nodes = nodes
	m.rows[id] = s
	return s, nil
}

func (m *memStore) Extend(_ context.Context, id string, from, to time.Time) (Session, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.rows[id]
	if m.conflict > 0 {
		m.conflict--
		return s, ErrConflict
	}
	if !s.ExpiresAt.Equal(from) {
		return s, ErrConflict
	}
	s.ExpiresAt = to
	m.rows[id] = s
	return s, nil
}

// GetSettled is Get: the memory store has no row locks to wait for.
func (m *memStore) GetSettled(ctx context.Context, id string) (Session, error) { return m.Get(ctx, id) }

func (m *memStore) FinishIf(_ context.Context, id string, due func(Session) bool, act func(Session) (EndReason, error),
	at time.Time) (Session, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.rows[id]
	if !ok {
		return s, false, ErrNoSession
	}
	if !s.Status.Live() || !due(s) {
		return s, false, nil
	}
	reason, err := act(s)
	if err != nil {
		return s, false, err
	}
	s.Status, s.End, s.FinishedAt = reason.Status(), reason, at
	m.rows[id] = s
	return s, true, nil
}

// finishLive finishes the one live row, as the reaper or a close would.
func (m *memStore) finishLive(reason EndReason) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, r := range m.rows {
		if r.Status.Live() {
			r.Status, r.End = reason.Status(), reason
			m.rows[id] = r
		}
	}
}

// fakeCluster records calls and fails where told.
type fakeCluster struct {
	provisionErr error
	teardownErr  error
	ready        bool
	// host is every node's address ("10.0.0.1" if empty).
	host        string
	observed    int
	provisioned []string
	tornDown    []string
	// onProvision runs in the middle of Provision.
	onProvision func()
}

func (f *fakeCluster) Provision(_ context.Context, s Session, lab labs.Lab) error {
	f.provisioned = append(f.provisioned, s.ID)
	if f.onProvision != nil {
		f.onProvision()
	}
	return f.provisionErr
}

func (f *fakeCluster) Observe(_ context.Context, s Session) ([]NodeState, error) {
	f.observed++
	host := f.host
	if host == "" {
		host = "10.0.0.1"
	}
	var out []NodeState
	for _, n := range s.Nodes {
		out = append(out, NodeState{Name: n.Name, Exists: true, Ready: f.ready, Host: host})
	}
	return out, nil
}

func (f *fakeCluster) Teardown(_ context.Context, s Session) error {
	f.tornDown = append(f.tornDown, s.ID)
	return f.teardownErr
}

const catalogYAML = `labs:
- {name: one, kind: vm, nodes: [{role: vm}], disk: {containerDisk: img}}
- {name: three, kind: vm, nodes: [{role: control}, {role: worker, count: 2}], disk: {containerDisk: img}}
- {name: shell, kind: pod, image: img, nodes: [{role: workspace}]}
`

func newService(t *testing.T, c *fakeCluster, now *time.Time) (*Service, *memStore) {
	t.Helper()
	st := &memStore{rows: map[string]Session{}}
	return newServiceOn(t, st, c, now, nil), st
}

// newServiceOn is newService on store, counting through metrics.
func newServiceOn(t *testing.T, store Store, c *fakeCluster, now *time.Time, metrics Metrics) *Service {
	t.Helper()
	cat, err := labs.Parse([]byte(catalogYAML))
	if err != nil {
		t.Fatal(err)
	}
	return &Service{
		Starter: &Starter{
			Store: store, Cluster: c, CleanupTimeout: time.Second,
			Policy:  lifetime.Policy{Lifetime: time.Hour, MaxLifetime: 3 * time.Hour},
			Now:     func() time.Time { return *now },
			Log:     slog.New(slog.NewTextHandler(io.Discard, nil)),
			Metrics: metrics,
		},
		Labs: cat, Seating: unlimited{c},
	}
}

// unlimited is a Seating with room for every open and nobody waiting:
// the session's own life, without the capacity rules (package seating
// tests those, with this package's Service).
type unlimited struct{ c Cluster }

func (u unlimited) Seat(ctx context.Context, sess Session, lab labs.Lab, _ bool) (bool, Standing, error) {
	if err := u.c.Provision(ctx, sess, lab); err != nil {
		if errors.Is(err, ErrNoCapacity) {
			return true, Standing{}, err
		}
		return true, Standing{}, fmt.Errorf("%w: %w", ErrProvisioning, err)
	}
	return true, Standing{}, nil
}

func (unlimited) Queued(context.Context, string) (line.Waiting, error) {
	return line.Waiting{}, ErrNoSession
}

func (unlimited) Leave(context.Context, string, string, Actor, string) (Session, error) {
	return Session{}, ErrNoSession
}

func (unlimited) Freed(context.Context) {}

func TestOpenUnknownLabListsValidOnes(t *testing.T) {
	now := time.Now()
	svc, store := newService(t, &fakeCluster{}, &now)
	_, err := svc.Open(context.Background(), "ann", "nope", "")
	if !errors.Is(err, ErrUnknownLab) || !strings.Contains(err.Error(), "one, shell, three") {
		t.Errorf("Open = %v", err)
	}
	if len(store.rows) != 0 {
		t.Errorf("unknown lab wrote rows: %v", store.rows)
	}
}

func TestExtendRetriesConflicts(t *testing.T) {
	now := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	c := &fakeCluster{ready: true}
	svc, store := newService(t, c, &now)
	opened, err := svc.Open(context.Background(), "ann", "one", "")
	if err != nil {
		t.Fatal(err)
	}
	s := opened.Session
	now = now.Add(30 * time.Minute)
	store.conflict = 2
	got, err := svc.Extend(context.Background(), "ann", s.ID)
	if err != nil || !got.ExpiresAt.Equal(now.Add(time.Hour)) {
		t.Errorf("Extend = %v %v", got.ExpiresAt, err)
	}
	if _, err := svc.Extend(context.Background(), "ann", "other-id"); !errors.Is(err, ErrNoSession) {
		t.Errorf("Extend with a foreign id = %v, want ErrNoSession", err)
	}
	if _, err := svc.Get(context.Background(), "bob", s.ID); !errors.Is(err, ErrNoSession) {
		t.Errorf("Get of another student's id = %v, want ErrNoSession", err)
	}
}

func TestCloseKeepsRowLiveWhenDeleteFails(t *testing.T) {
	now := time.Now()
	c := &fakeCluster{}
	svc, store := newService(t, c, &now)
	opened, err := svc.Open(context.Background(), "ann", "one", "")
	if err != nil {
		t.Fatal(err)
	}
	s := opened.Session
	c.teardownErr = errors.New("api down")
	if _, err := svc.Close(context.Background(), "ann", "", ActorStudent, "ann"); err == nil {
		t.Fatal("Close succeeded although the delete failed")
	}
	if row, _ := store.Get(context.Background(), s.ID); !row.Status.Live() {
		t.Errorf("row = %s, want still live for the reaper", row.Status)
	}
	c.teardownErr = nil
	closed, err := svc.Close(context.Background(), "ann", "", ActorStudent, "ann")
	if err != nil || closed.Status != StatusClosed {
		t.Errorf("Close = %s %v", closed.Status, err)
	}
}

func TestRecordedReadyAt(t *testing.T) {
	start := time.Date(2026, 1, 1, 9, 0, 0, 400_000_000, time.UTC) // 09:00:00.4
	at := func(d time.Duration) time.Time { return time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC).Add(d) }
	tests := []struct {
		name           string
		cond, observed time.Time
		want           time.Time
	}{
		{"observed long after: condition second + 1s", at(30 * time.Second), at(45 * time.Second), at(31 * time.Second)},
		{"observed within the condition's second: observation", at(30 * time.Second), at(30*time.Second + 300*time.Millisecond), at(30*time.Second + 300*time.Millisecond)},
		{"condition truncated before the start: observation", at(0), at(900 * time.Millisecond), at(900 * time.Millisecond)},
		{"never before the start", at(0), at(200 * time.Millisecond), start},
		{"no condition time: observation", time.Time{}, at(12 * time.Second), at(12 * time.Second)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := recordedReadyAt(tc.cond, start, tc.observed); !got.Equal(tc.want) {
				t.Errorf("recordedReadyAt = %s, want %s", got.Format("15:04:05.000"), tc.want.Format("15:04:05.000"))
			}
		})
	}
}

// A running VM's guest powered off from inside comes back on a new
// virt-launcher Pod with a new address: getSession gives the student the
// new one (booting until ready) and records it. The cluster is read once
// per FollowEvery however often the student asks (two reads in three gets
// over FollowEvery). A workspace Pod keeps its address for life, so a
// running Pod session costs no cluster read.
func TestRunningSessionFollowsItsNodes(t *testing.T) {
	tests := []struct {
		lab          string
		wantObserved int
		want         []Node
	}{
		{lab: "one", wantObserved: 2, want: []Node{{Name: "vm", Role: "vm", SSHHost: "10.0.0.2", SSHPort: 22}}},
		{lab: "shell", wantObserved: 0, want: []Node{{Name: "workspace", Role: "workspace", Ready: true, SSHHost: "10.0.0.1", SSHPort: 22}}},
	}
	for _, tt := range tests {
		t.Run(tt.lab, func(t *testing.T) {
			now := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
			c := &fakeCluster{ready: true}
			svc, store := newService(t, c, &now)
			opened, err := svc.Open(context.Background(), "ann", tt.lab, "")
			if err != nil {
				t.Fatal(err)
			}
			if got, err := svc.Get(context.Background(), "ann", ""); err != nil || got.Session.Status != StatusRunning {
				t.Fatalf("get = %v, %v; want running", got.Session, err)
			}
			c.observed, c.ready, c.host = 0, false, "10.0.0.2"
			got, err := svc.Get(context.Background(), "ann", "")
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got.Session.Nodes); diff != "" {
				t.Errorf("nodes after the guest came back (-want +got):\n%s", diff)
			}
			row, _ := store.Get(context.Background(), opened.Session.ID)
			if diff := cmp.Diff(tt.want, row.Nodes); diff != "" {
				t.Errorf("stored nodes (-want +got):\n%s", diff)
			}
			for _, after := range []time.Duration{FollowEvery - time.Millisecond, time.Millisecond} {
				now = now.Add(after)
				if _, err := svc.Get(context.Background(), "ann", ""); err != nil {
					t.Fatal(err)
				}
			}
			if c.observed != tt.wantObserved {
				t.Errorf("cluster read %d times in three gets over %s, want %d", c.observed, FollowEvery, tt.wantObserved)
			}
		})
	}
}

func TestOpenReclaimsAnExpiredSession(t *testing.T) {
	now := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	c := &fakeCluster{}
	svc, store := newService(t, c, &now)
	opened, err := svc.Open(context.Background(), "ann", "one", "")
	if err != nil {
		t.Fatal(err)
	}
	old := opened.Session
	now = now.Add(59 * time.Minute)
	if _, err := svc.Open(context.Background(), "ann", "one", ""); !errors.Is(err, ErrSessionExists) {
		t.Fatalf("open before expiry = %v, want ErrSessionExists", err)
	}
	now = now.Add(time.Minute)
	c.teardownErr = errors.New("api down")
	if _, err := svc.Open(context.Background(), "ann", "one", ""); !errors.Is(err, ErrSessionExists) {
		t.Fatalf("open when the reclaim cannot delete = %v, want ErrSessionExists", err)
	}
	if row, _ := store.Get(context.Background(), old.ID); !row.Status.Live() {
		t.Errorf("undeletable expired session = %s, want live for the reaper", row.Status)
	}
	c.teardownErr = nil
	reopened, err := svc.Open(context.Background(), "ann", "one", "")
	if err != nil || reopened.Session == nil || reopened.Session.ID == old.ID {
		t.Fatalf("open after expiry = %v, %v", reopened.ID(), err)
	}
	if row, _ := store.Get(context.Background(), old.ID); row.Status != StatusExpired || !row.FinishedAt.Equal(now) {
		t.Errorf("old session = %s at %s, want expired now", row.Status, row.FinishedAt)
	}
}

// Closing a session whose time is already up deletes its resources like
// any close but records it expired, as the reaper would have.
func TestCloseRecordsExpiryWhenTimeIsUp(t *testing.T) {
	tests := []struct {
		name       string
		after      time.Duration
		wantStatus Status
		wantReason string
	}{
		{"before expiry: closed", 59 * time.Minute, StatusClosed, "closed by student ann"},
		{"at expiry: expired", time.Hour, StatusExpired, "expired at 2026-01-01T10:00:00Z; closed by student ann after its expiry"},
		{"long after expiry: expired", 2 * time.Hour, StatusExpired, "expired at 2026-01-01T10:00:00Z; closed by student ann after its expiry"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
			c := &fakeCluster{}
			svc, _ := newService(t, c, &now)
			opened, err := svc.Open(context.Background(), "ann", "one", "")
			if err != nil {
				t.Fatal(err)
			}
			s := opened.Session
			now = now.Add(tc.after)
			got, err := svc.Close(context.Background(), "ann", "", ActorStudent, "ann")
			if err != nil {
				t.Fatal(err)
			}
			if got.Status != tc.wantStatus || got.End.Detail != tc.wantReason || got.End.Actor != ActorStudent || !got.FinishedAt.Equal(now) {
				t.Errorf("closed = %s %q at %s, want %s %q by the student at %s", got.Status, got.End, got.FinishedAt, tc.wantStatus, tc.wantReason, now)
			}
			if len(c.tornDown) != 1 || c.tornDown[0] != s.ID {
				t.Errorf("torn down = %v, want %s", c.tornDown, s.ID)
			}
		})
	}
}

// Students read one fixed sentence per kind of ending, chosen by the typed
// reason; never the stored detail. Errors that refuse an open read as the
// ending they record.
func TestEndReasonSentence(t *testing.T) {
	tests := []struct {
		name   string
		reason EndReason
		status Status
		want   string
	}{
		{"live: nothing", EndReason{}, "", ""},
		{"quota refusal", EndReason{EndNoCapacity, ActorOpen, "creating VM lk-1: exceeded quota: labkeep-vms"}, StatusFailed, Sentence(EndNoCapacity)},
		{"provisioning refused", EndReason{EndProvisioningFailed, ActorOpen, "ValidatingAdmissionPolicy denied system:serviceaccount:x"}, StatusFailed, Sentence(EndProvisioningFailed)},
		{"ghost", EndReason{EndGhost, ActorReaper, "VirtualMachine lk-1-vm no longer exists"}, StatusFailed, Sentence(EndGhost)},
		{"expired by the reaper", EndReason{EndExpired, ActorReaper, "expired at 2026-01-01T10:00:00Z"}, StatusExpired, "the session reached its time limit and its resources were deleted"},
		{"closed by the student", EndReason{EndClosed, ActorStudent, "closed by student ann"}, StatusClosed, "the session was closed and its resources were deleted"},
		{"closed by an admin", EndReason{EndClosed, ActorAdmin, "closed by admin root"}, StatusClosed, "the session was closed by an administrator and its resources were deleted"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.reason.Sentence(); got != tc.want {
				t.Errorf("Sentence = %q, want %q", got, tc.want)
			}
			if tc.status != "" && tc.reason.Status() != tc.status {
				t.Errorf("Status = %s, want %s", tc.reason.Status(), tc.status)
			}
			if tc.reason.Detail != "" && strings.Contains(tc.reason.Sentence(), tc.reason.Detail) {
				t.Errorf("sentence quotes the detail")
			}
		})
	}
	for _, tc := range []struct {
		err  error
		want EndKind
	}{
		{fmt.Errorf("%w: 8 of 8 VMs in use", ErrNoCapacity), EndNoCapacity},
		{ErrEndedWhileProvisioning, EndProvisioningFailed},
		{fmt.Errorf("%w: boom", ErrProvisioning), EndProvisioningFailed},
	} {
		if got, ok := ErrorKind(tc.err); !ok || got != tc.want {
			t.Errorf("ErrorKind(%v) = %s %v, want %s", tc.err, got, ok, tc.want)
		}
	}
	if _, ok := ErrorKind(ErrNoSession); ok {
		t.Error("ErrorKind(ErrNoSession) ok, want no ending")
	}
}

// End is the one way a session ends: deletes first, then the row, under
// the row lock; a failed delete leaves the row live unless the ending says
// the student must not be locked out.
func TestEnd(t *testing.T) {
	at := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	reason := EndReason{Kind: EndGhost, Actor: ActorReaper, Detail: "VirtualMachine lk-1-vm no longer exists"}
	tests := []struct {
		name         string
		finished     bool // the row is already final
		due          func(Session) bool
		force        bool
		teardownErr  error
		wantEnded    bool
		wantErr      error
		wantTeardown bool
		wantStatus   Status
		wantDetail   string
	}{
		{name: "live and due: deleted, then marked", wantEnded: true, wantTeardown: true, wantStatus: StatusFailed, wantDetail: reason.Detail},
		{name: "not due: nothing deleted, row live", due: func(Session) bool { return false }, wantStatus: StatusRunning},
		{name: "already final: nothing deleted", finished: true, wantStatus: StatusClosed},
		{name: "delete fails: row stays live for a retry", teardownErr: errors.New("api down"),
			wantErr: ErrTeardown, wantTeardown: true, wantStatus: StatusRunning},
		{name: "delete fails but the student must not be locked out: marked, leftovers noted", force: true,
			teardownErr: errors.New("api down"), wantEnded: true, wantErr: ErrTeardown, wantTeardown: true, wantStatus: StatusFailed,
			wantDetail: reason.Detail + "; cleanup incomplete, left for the reaper: api down"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := &memStore{rows: map[string]Session{}}
			row := Session{ID: "s1", Student: "ann", Status: StatusRunning, Nodes: []Node{{Name: "vm"}}}
			if tc.finished {
				row.Status, row.End = StatusClosed, EndReason{Kind: EndClosed, Actor: ActorStudent}
			}
			st.rows[row.ID] = row
			c := &fakeCluster{teardownErr: tc.teardownErr}
			got, ended, err := End(context.Background(), st, c, row.ID, Ending{Reason: reason, Due: tc.due, EvenIfTeardownFails: tc.force}, at)
			if ended != tc.wantEnded || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("End = ended %v, err %v; want ended %v, err %v", ended, err, tc.wantEnded, tc.wantErr)
			}
			if (len(c.tornDown) > 0) != tc.wantTeardown {
				t.Errorf("torn down %v, want %v", c.tornDown, tc.wantTeardown)
			}
			stored := st.rows[row.ID]
			if stored.Status != tc.wantStatus || got.Status != tc.wantStatus {
				t.Errorf("status stored %s, returned %s; want %s", stored.Status, got.Status, tc.wantStatus)
			}
			if tc.wantEnded && (stored.End.Detail != tc.wantDetail || !stored.FinishedAt.Equal(at)) {
				t.Errorf("stored reason %q at %s, want %q at %s", stored.End.Detail, stored.FinishedAt, tc.wantDetail, at)
			}
		})
	}
}

// taker takes every row it is asked about unless refuse; it counts takes.
type taker struct {
	store  *memStore
	refuse bool
	took   int
}

func (k *taker) Take(ctx context.Context, id string, due func(Session) bool) (Session, bool, error) {
	cur, err := k.store.Get(ctx, id)
	if err != nil || k.refuse || !cur.Status.Live() || !due(cur) {
		return cur, false, err
	}
	k.took++
	return cur, true, nil
}

// An unlocked End takes the row first and tears down once, outside the
// row lock, then marks under it; a row it cannot take is neither torn
// down nor marked.
func TestEndUnlocked(t *testing.T) {
	at := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	reason := EndReason{Kind: EndExpired, Actor: ActorReaper, Detail: "expired"}
	for _, tc := range []struct {
		name          string
		refuse        bool
		teardownErr   error
		wantEnded     bool
		wantErr       error
		wantTeardowns int
		wantStatus    Status
	}{
		{name: "taken, deleted, marked", wantEnded: true, wantTeardowns: 1, wantStatus: StatusExpired},
		{name: "not taken: nothing deleted, row live", refuse: true, wantStatus: StatusRunning},
		{name: "delete fails: row stays live for a retry", teardownErr: errors.New("api down"),
			wantErr: ErrTeardown, wantTeardowns: 1, wantStatus: StatusRunning},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &memStore{rows: map[string]Session{"s1": {ID: "s1", Student: "ann", Status: StatusRunning, Nodes: []Node{{Name: "vm"}}}}}
			c := &fakeCluster{teardownErr: tc.teardownErr}
			k := &taker{store: st, refuse: tc.refuse}
			got, ended, err := End(context.Background(), st, c, "s1", Ending{Reason: reason, Unlocked: k}, at)
			if ended != tc.wantEnded || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("End = ended %v, err %v; want ended %v, err %v", ended, err, tc.wantEnded, tc.wantErr)
			}
			if len(c.tornDown) != tc.wantTeardowns || got.Status != tc.wantStatus || st.rows["s1"].Status != tc.wantStatus {
				t.Errorf("torn down %v, status returned %s stored %s; want %d teardowns, %s",
					c.tornDown, got.Status, st.rows["s1"].Status, tc.wantTeardowns, tc.wantStatus)
			}
		})
	}
}
