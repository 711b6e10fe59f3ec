package reap

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/shared/labs"
	"labkeep/shared/lifetime"
	"labkeep/shared/seating"
	"labkeep/shared/session"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

var policy = lifetime.Policy{Lifetime: time.Hour, MaxLifetime: 3 * time.Hour}

var rules = Rules{Env: "prod", ProvisionTimeout: 10 * time.Minute, ProvisionGrace: 2 * time.Minute,
	AbsentConfirm: 30 * time.Second, DownGrace: 5 * time.Minute}

func vmSession(id string, status session.Status, started time.Time, nodes ...string) session.Session {
	s := session.Session{ID: id, Student: "s-" + id, Lab: "lab", Kind: labs.KindVM, Status: status, Window: policy.Open(started)}
	for _, n := range nodes {
		s.Nodes = append(s.Nodes, session.Node{Name: n})
	}
	return s
}

// inventory builds a snapshot holding VM+VMI for each running node name
// given, plus extra labelled objects.
func inventory(vmsWithVMI []string, vmsOnly []string, objs ...Object) *Inventory {
	inv := &Inventory{VMNames: map[string]bool{}, VMIs: map[string]VMIInfo{}, Objects: objs}
	for _, n := range vmsWithVMI {
		inv.VMNames[n] = true
		inv.VMIs[n] = VMIInfo{Name: n, Ready: true}
	}
	for _, n := range vmsOnly {
		inv.VMNames[n] = true
	}
	inv.VMs = len(inv.VMNames)
	return inv
}

func obj(kind session.ObjectKind, name, sessionID string) Object {
	return Object{ObjectRef: session.ObjectRef{Kind: kind, Name: name}, Env: "prod", Session: sessionID}
}

type planned struct {
	Kind      ItemKind
	SessionID string
	Objects   []string
}

func summarize(items []Item) []planned {
	var out []planned
	for _, it := range items {
		p := planned{Kind: it.Kind, SessionID: it.SessionID}
		for _, o := range it.Objects {
			p.Objects = append(p.Objects, string(o.Kind)+"/"+o.Name)
		}
		out = append(out, p)
	}
	return out
}

func podSession(id string, status session.Status, started time.Time) session.Session {
	s := vmSession(id, status, started, "ws")
	s.Kind = labs.KindPod
	return s
}

// pooled makes s a warm pool row in state: an idle instance belongs to the
// pool student and lives ttl from its start; a claimed one is a student's
// with the window the claim gave it.
func pooled(s session.Session, state session.PoolState, ttl time.Duration) session.Session {
	s.Pool = state
	if state == session.PoolIdle {
		s.Student = seating.PoolStudent
		s.ExpiresAt = s.StartedAt.Add(ttl)
		s.MaxExpiresAt = s.ExpiresAt
	}
	return s
}

// readyPod is the ready workspace Pod of pod session id.
func readyPod(id string) Object {
	o := obj(session.KindPod, session.NodeName(id, "ws"), id)
	o.Ready = true
	return o
}

// suspected is a Suspect as the table writes it: session, object, trouble
// and how long before now it was first seen.
type suspected struct {
	Session, Object string
	Trouble         Trouble
	Ago             time.Duration
}

func TestPlan(t *testing.T) {
	now := t0.Add(30 * time.Minute)
	a := session.NodeName("a", "vm")
	vmiA := "VirtualMachineInstance/" + a
	wsP := "Pod/" + session.NodeName("p", "ws")
	seen := func(session, object string, t Trouble, ago time.Duration) []Suspect {
		return []Suspect{{Session: session, Object: object, Trouble: t, Since: now.Add(-ago)}}
	}
	down := func(inv *Inventory, name, why string) *Inventory {
		inv.VMDown = map[string]string{name: why}
		return inv
	}
	endedPod := func(id string) Object {
		o := obj(session.KindPod, session.NodeName(id, "ws"), id)
		o.Down = "ended (phase Failed)"
		return o
	}
	reader := func(name string, age time.Duration, down string) Object {
		o := obj(session.KindPod, name, "")
		o.HomeReader, o.CreatedAt, o.Down = true, now.Add(-age), down
		return o
	}
	tests := []struct {
		name         string
		live         []session.Session
		inv          *Inventory
		prev         []Suspect
		want         []planned
		wantSuspects []suspected
	}{
		{
			name: "running session within its lifetime, everything present: nothing",
			live: []session.Session{vmSession("a", session.StatusRunning, t0, "vm")},
			inv:  inventory([]string{a}, nil, obj(session.KindVirtualMachine, a, "a")),
		},
		{
			name: "expiry passed: expired, even though its VM is also gone",
			live: []session.Session{vmSession("a", session.StatusRunning, now.Add(-time.Hour-time.Second), "vm")},
			inv:  inventory(nil, nil),
			want: []planned{{Kind: Expired, SessionID: "a"}},
		},
		{
			name: "exactly at expiry: expired (same rule as the countdown reaching 0)",
			live: []session.Session{vmSession("a", session.StatusRunning, now.Add(-time.Hour), "vm")},
			inv:  inventory([]string{a}, nil),
			want: []planned{{Kind: Expired, SessionID: "a"}},
		},
		{
			name: "inventory unavailable: expiry still decided, no ghosts or orphans",
			live: []session.Session{
				vmSession("a", session.StatusRunning, now.Add(-2*time.Hour), "vm"),
				vmSession("b", session.StatusRunning, t0, "vm"),
			},
			want: []planned{{Kind: Expired, SessionID: "a"}},
		},
		{
			name: "running session whose VM was deleted out-of-band: ghost",
			live: []session.Session{vmSession("a", session.StatusRunning, t0, "vm")},
			inv:  inventory(nil, nil),
			want: []planned{{Kind: Ghost, SessionID: "a"}},
		},
		{
			name:         "running session whose VMI is missing at one look: only a suspect (KubeVirt may be recreating it)",
			live:         []session.Session{vmSession("a", session.StatusRunning, t0, "vm")},
			inv:          inventory(nil, []string{a}),
			wantSuspects: []suspected{{"a", vmiA, Missing, 0}},
		},
		{
			name: "VMI missing at two looks AbsentConfirm apart: ghost",
			live: []session.Session{vmSession("a", session.StatusRunning, t0, "vm")},
			inv:  inventory(nil, []string{a}),
			prev: seen("a", vmiA, Missing, time.Minute),
			want: []planned{{Kind: Ghost, SessionID: "a"}}, wantSuspects: []suspected{{"a", vmiA, Missing, time.Minute}},
		},
		{
			name: "VMI missing at two looks closer than AbsentConfirm (an admin run right after the schedule's): still only a suspect",
			live: []session.Session{vmSession("a", session.StatusRunning, t0, "vm")},
			inv:  inventory(nil, []string{a}),
			prev: seen("a", vmiA, Missing, 10*time.Second), wantSuspects: []suspected{{"a", vmiA, Missing, 10 * time.Second}},
		},
		{
			name: "VMI back at the second look (recreated between runs): nothing, and the suspect is cleared",
			live: []session.Session{vmSession("a", session.StatusRunning, t0, "vm")},
			inv:  inventory([]string{a}, nil),
			prev: seen("a", vmiA, Missing, time.Minute),
		},
		{
			name: "suspect of a session no longer live: dropped",
			inv:  inventory(nil, nil),
			prev: seen("gone", "VirtualMachineInstance/lk-gone-vm", Missing, time.Minute),
		},
		{
			name:         "VM reported down for less than DownGrace: only a suspect",
			live:         []session.Session{vmSession("a", session.StatusRunning, t0, "vm")},
			inv:          down(inventory([]string{a}, nil), a, "CrashLoopBackOff"),
			prev:         seen("a", "VirtualMachine/"+a, Down, 4*time.Minute),
			wantSuspects: []suspected{{"a", "VirtualMachine/" + a, Down, 4 * time.Minute}},
		},
		{
			name:         "VM reported down for DownGrace: ghost",
			live:         []session.Session{vmSession("a", session.StatusRunning, t0, "vm")},
			inv:          down(inventory(nil, []string{a}), a, "Stopped"),
			prev:         append(seen("a", "VirtualMachine/"+a, Down, 5*time.Minute), seen("a", vmiA, Missing, 10*time.Second)...),
			want:         []planned{{Kind: Ghost, SessionID: "a"}},
			wantSuspects: []suspected{{"a", "VirtualMachine/" + a, Down, 5 * time.Minute}, {"a", vmiA, Missing, 10 * time.Second}},
		},
		{
			name: "provisioning session's VMI missing (still booting): no suspect",
			live: []session.Session{vmSession("a", session.StatusProvisioning, now.Add(-5*time.Minute), "vm")},
			inv:  down(inventory(nil, []string{a}), a, "Stopped"),
		},
		{
			name:         "running pod session whose Pod is missing at one look: only a suspect",
			live:         []session.Session{podSession("p", session.StatusRunning, t0)},
			inv:          inventory(nil, nil),
			wantSuspects: []suspected{{"p", wsP, Missing, 0}},
		},
		{
			name: "running pod session whose Pod is missing at two looks: ghost",
			live: []session.Session{podSession("p", session.StatusRunning, t0)},
			inv:  inventory(nil, nil),
			prev: seen("p", wsP, Missing, time.Minute),
			want: []planned{{Kind: Ghost, SessionID: "p"}}, wantSuspects: []suspected{{"p", wsP, Missing, time.Minute}},
		},
		{
			name:         "running pod session whose Pod has ended, first seen now: only a suspect",
			live:         []session.Session{podSession("p", session.StatusRunning, t0)},
			inv:          inventory(nil, nil, endedPod("p")),
			wantSuspects: []suspected{{"p", wsP, Down, 0}},
		},
		{
			name: "running pod session whose Pod has been ended for DownGrace: ghost",
			live: []session.Session{podSession("p", session.StatusRunning, t0)},
			inv:  inventory(nil, nil, endedPod("p")),
			prev: seen("p", wsP, Down, 6*time.Minute),
			want: []planned{{Kind: Ghost, SessionID: "p"}}, wantSuspects: []suspected{{"p", wsP, Down, 6 * time.Minute}},
		},
		{
			name: "a suspect of another trouble does not confirm this one",
			live: []session.Session{vmSession("a", session.StatusRunning, t0, "vm")},
			inv:  inventory(nil, []string{a}),
			prev: seen("a", "VirtualMachine/"+a, Down, time.Hour), wantSuspects: []suspected{{"a", vmiA, Missing, 0}},
		},
		{
			name: "running session whose VM has no labels (registered before labels): not a ghost",
			live: []session.Session{vmSession("a", session.StatusRunning, t0, "vm")},
			inv:  inventory([]string{a}, nil),
		},
		{
			name: "provisioning, VM not created yet, within grace: left alone",
			live: []session.Session{vmSession("a", session.StatusProvisioning, now.Add(-time.Minute), "vm")},
			inv:  inventory(nil, nil),
		},
		{
			name: "provisioning, VMI still booting: left alone",
			live: []session.Session{vmSession("a", session.StatusProvisioning, now.Add(-5*time.Minute), "vm")},
			inv:  inventory(nil, []string{a}),
		},
		{
			name: "provisioning, VM missing past the grace: ghost",
			live: []session.Session{vmSession("a", session.StatusProvisioning, now.Add(-3*time.Minute), "vm")},
			inv:  inventory(nil, nil),
			want: []planned{{Kind: Ghost, SessionID: "a"}},
		},
		{
			name: "provisioning past the timeout: ghost",
			live: []session.Session{vmSession("a", session.StatusProvisioning, now.Add(-11*time.Minute), "vm")},
			inv:  inventory(nil, []string{a}),
			want: []planned{{Kind: Ghost, SessionID: "a"}},
		},
		{
			name: "provisioning past the timeout but every VMI ready (nobody polled getSession): not a ghost",
			live: []session.Session{vmSession("a", session.StatusProvisioning, now.Add(-11*time.Minute), "vm")},
			inv:  inventory([]string{a}, nil),
		},
		{
			name: "provisioning pod session past the timeout: ghost unless its Pod is ready",
			live: []session.Session{
				func() session.Session {
					s := vmSession("p1", session.StatusProvisioning, now.Add(-11*time.Minute), "ws")
					s.Kind = labs.KindPod
					return s
				}(),
				func() session.Session {
					s := vmSession("p2", session.StatusProvisioning, now.Add(-11*time.Minute), "ws")
					s.Kind = labs.KindPod
					return s
				}(),
			},
			inv: inventory(nil, nil, obj(session.KindPod, session.NodeName("p1", "ws"), "p1"),
				func() Object { o := obj(session.KindPod, session.NodeName("p2", "ws"), "p2"); o.Ready = true; return o }()),
			want: []planned{{Kind: Ghost, SessionID: "p1"}},
		},
		{
			name: "running pod session without its Pod at two looks: ghost; with it: nothing",
			live: []session.Session{podSession("p1", session.StatusRunning, t0), podSession("p2", session.StatusRunning, t0)},
			inv:  inventory(nil, nil, obj(session.KindPod, session.NodeName("p2", "ws"), "p2")),
			prev: seen("p1", "Pod/"+session.NodeName("p1", "ws"), Missing, time.Minute),
			want: []planned{{Kind: Ghost, SessionID: "p1"}}, wantSuspects: []suspected{{"p1", "Pod/" + session.NodeName("p1", "ws"), Missing, time.Minute}},
		},
		{
			name: "objects of a session with no live row: one orphan item, VM first and anchor last",
			inv: inventory(nil, []string{"lk-x-vm"},
				obj(session.KindAnchor, "lk-x-anchor", "x"),
				obj(session.KindSecret, "lk-x-vm-cloudinit", "x"),
				obj(session.KindVirtualMachine, "lk-x-vm", "x"),
			),
			want: []planned{{Kind: Orphan, SessionID: "x", Objects: []string{"VirtualMachine/lk-x-vm", "Secret/lk-x-vm-cloudinit", "Job/lk-x-anchor"}}},
		},
		{
			name: "objects without a session label, or already being deleted: never touched",
			inv: inventory(nil, nil,
				obj(session.KindVirtualMachine, "mystery", ""),
				Object{ObjectRef: session.ObjectRef{Kind: session.KindSecret, Name: "going"}, Session: "y", Deleting: true},
			),
		},
		{
			name: "home readers: one ended and one that outlived any download are deleted, a young one is left to its download",
			inv: inventory(nil, nil,
				reader("reader-home-prod-b", HomeReaderLifetime, ""),
				reader("reader-home-prod-a", time.Minute, "ended (phase Succeeded)"),
				reader("reader-home-prod-c", HomeReaderStart+HomeReaderLifetime+time.Second, ""),
			),
			want: []planned{
				{Kind: HomeReader, Objects: []string{"Pod/reader-home-prod-a"}},
				{Kind: HomeReader, Objects: []string{"Pod/reader-home-prod-c"}},
			},
		},
		{
			name: "home readers of another environment or already being deleted: never touched",
			inv: inventory(nil, nil,
				func() Object { o := reader("reader-home-dev-a", 3*time.Hour, "ended"); o.Env = "dev"; return o }(),
				func() Object { o := reader("reader-home-prod-d", 3*time.Hour, "ended"); o.Deleting = true; return o }(),
			),
		},
		{
			name: "another environment's objects slipped into the inventory: never touched",
			inv: inventory(nil, nil, func() Object {
				o := obj(session.KindVirtualMachine, "lk-d-vm", "d")
				o.Env = "dev"
				return o
			}()),
		},
		{
			name: "objects of a live session are not orphans",
			live: []session.Session{vmSession("a", session.StatusRunning, t0, "vm")},
			inv:  inventory([]string{a}, nil, obj(session.KindVirtualMachine, a, "a"), obj(session.KindSecret, "lk-a-vm-cloudinit", "a")),
		},
		{
			name: "an idle warm pool VM, ready, older than any provisioning timeout but within its TTL: neither ghost nor orphan",
			live: []session.Session{pooled(vmSession("a", session.StatusRunning, now.Add(-2*time.Hour), "vm"), session.PoolIdle, 4*time.Hour)},
			inv:  inventory([]string{a}, nil, obj(session.KindVirtualMachine, a, "a"), obj(session.KindAnchor, "lk-a-anchor", "a")),
		},
		{
			name: "an idle warm pool workspace Pod, ready: neither ghost nor orphan",
			live: []session.Session{pooled(podSession("p", session.StatusRunning, now.Add(-time.Hour)), session.PoolIdle, 4*time.Hour)},
			inv:  inventory(nil, nil, readyPod("p")),
		},
		{
			name: "a claimed pool instance, its objects made hours before the claim: neither ghost nor orphan",
			live: []session.Session{pooled(podSession("p", session.StatusRunning, now.Add(-time.Minute)), session.PoolClaimed, time.Hour)},
			inv:  inventory(nil, nil, readyPod("p"), obj(session.KindAnchor, "lk-p-anchor", "p")),
		},
		{
			name: "an idle pool instance past its TTL: expired, never an orphan",
			live: []session.Session{pooled(vmSession("a", session.StatusRunning, now.Add(-4*time.Hour), "vm"), session.PoolIdle, 4*time.Hour)},
			inv:  inventory([]string{a}, nil, obj(session.KindVirtualMachine, a, "a")),
			want: []planned{{Kind: Expired, SessionID: "a"}},
		},
		{
			name: "mixed: expired first, then ghosts, then orphans, each by id",
			live: []session.Session{
				vmSession("g", session.StatusRunning, t0, "vm"),
				vmSession("e2", session.StatusRunning, now.Add(-2*time.Hour), "vm"),
				vmSession("e1", session.StatusRunning, now.Add(-2*time.Hour), "vm"),
			},
			inv: inventory(nil, nil, obj(session.KindSecret, "s-o", "o")),
			want: []planned{
				{Kind: Expired, SessionID: "e1"}, {Kind: Expired, SessionID: "e2"},
				{Kind: Ghost, SessionID: "g"},
				{Kind: Orphan, SessionID: "o", Objects: []string{"Secret/s-o"}},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			items, suspects := Plan(now, tc.live, tc.inv, tc.prev, rules)
			if diff := cmp.Diff(tc.want, summarize(items)); diff != "" {
				t.Fatalf("plan (-want +got):\n%s", diff)
			}
			var got []suspected
			for _, s := range suspects {
				got = append(got, suspected{s.Session, s.Object, s.Trouble, now.Sub(s.Since)})
			}
			if diff := cmp.Diff(tc.wantSuspects, got); diff != "" {
				t.Fatalf("suspects handed on (-want +got):\n%s", diff)
			}
		})
	}
}

// BenchmarkPlan200 plans a run over 200 live sessions (half expired) and a
// namespace holding their objects plus 50 orphans' objects.
func BenchmarkPlan200(b *testing.B) {
	now := t0.Add(30 * time.Minute)
	var live []session.Session
	var vmsWithVMI []string
	var objs []Object
	for i := range 200 {
		id := fmt.Sprintf("s%03d", i)
		started := t0
		if i%2 == 0 {
			started = now.Add(-2 * time.Hour)
		}
		live = append(live, vmSession(id, session.StatusRunning, started, "vm"))
		vmsWithVMI = append(vmsWithVMI, session.NodeName(id, "vm"))
		objs = append(objs, obj(session.KindVirtualMachine, session.NodeName(id, "vm"), id), obj(session.KindSecret, id+"-ci", id), obj(session.KindAnchor, id+"-anchor", id))
	}
	for i := range 50 {
		id := fmt.Sprintf("o%03d", i)
		objs = append(objs, obj(session.KindSecret, id+"-ci", id), obj(session.KindAnchor, id+"-anchor", id))
	}
	inv := inventory(vmsWithVMI, nil, objs...)
	b.ResetTimer()
	for b.Loop() {
		if items, _ := Plan(now, live, inv, nil, rules); len(items) != 150 {
			b.Fatalf("%d items", len(items))
		}
	}
}
