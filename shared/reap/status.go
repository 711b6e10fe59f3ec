package reap

import (
	"context"
	"fmt"
	"sort"
	"time"
)

// Status is what an SRE on call needs at a glance (GET /adminStatus).
type Status struct {
	// RecentRuns are the latest runs, newest first.
	RecentRuns []Report `json:"recentRuns"`
	// FailureCounts are failures per kind over RecentRuns.
	FailureCounts map[ItemKind]int `json:"failureCounts"`
	// FailingSessions are sessions that failed in the latest run, with how
	// many of the recent runs in a row they failed in: one that fails every
	// minute stands out here.
	FailingSessions []FailingSession `json:"failingSessions"`
	LiveSessions    int              `json:"liveSessions"`
	// LiveVMs counts every VirtualMachine in the namespace (-1 if the
	// cluster could not be listed; ClusterError says why).
	LiveVMs      int       `json:"liveVMs"`
	Capacity     Capacity  `json:"capacity"`
	ClusterError string    `json:"clusterError,omitempty"`
	ServerTime   time.Time `json:"serverTime"`
}

// Capacity is VMs used against the configured limit.
type Capacity struct {
	Used  int `json:"used"`
	Limit int `json:"limit"`
}

// FailingSession is one session the reaper keeps failing on.
type FailingSession struct {
	Session    string   `json:"session"`
	Kind       ItemKind `json:"kind"`
	RunsInARow int      `json:"runsInARow"`
	LastError  string   `json:"lastError"`
}

// StatusSource is what Status reads.
type StatusSource interface {
	RecentRuns(ctx context.Context, limit int) ([]Report, error)
}

// VMCounter counts every VM in the namespace.
type VMCounter interface {
	CountVMs(ctx context.Context) (int, error)
}

// ReadStatus gathers Status from the last `runs` runs. A cluster that
// cannot be listed is reported in the result, not as an error: the
// database half of the picture is still worth showing.
func (r *Reaper) ReadStatus(ctx context.Context, src StatusSource, vms VMCounter, runs, maxVMs int) (Status, error) {
	recent, err := src.RecentRuns(ctx, runs)
	if err != nil {
		return Status{}, fmt.Errorf("recent runs: %w", err)
	}
	live, err := r.Store.ListLive(ctx)
	if err != nil {
		return Status{}, fmt.Errorf("live sessions: %w", err)
	}
	st := Status{RecentRuns: recent, FailureCounts: map[ItemKind]int{}, LiveSessions: len(live),
		Capacity: Capacity{Limit: maxVMs}, ServerTime: r.Now().UTC(), FailingSessions: []FailingSession{}}
	if st.RecentRuns == nil {
		st.RecentRuns = []Report{}
	}
	for _, run := range recent {
		for _, f := range run.Failures {
			st.FailureCounts[f.Kind]++
		}
	}
	st.FailingSessions = failingSessions(recent)
	if n, err := vms.CountVMs(ctx); err != nil {
		st.LiveVMs, st.ClusterError = -1, err.Error()
	} else {
		st.LiveVMs, st.Capacity.Used = n, n
	}
	return st, nil
}

// failingSessions lists the sessions that failed in the newest run, with
// the number of consecutive recent runs (newest first) each failed in.
func failingSessions(recent []Report) []FailingSession {
	out := []FailingSession{}
	if len(recent) == 0 {
		return out
	}
	for _, f := range recent[0].Failures {
		if f.Session == "" || containsSession(out, f.Session) {
			continue
		}
		fs := FailingSession{Session: f.Session, Kind: f.Kind, LastError: f.Error}
		for _, run := range recent {
			if !runFailed(run, f.Session) {
				break
			}
			fs.RunsInARow++
		}
		out = append(out, fs)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].RunsInARow > out[j].RunsInARow })
	return out
}

func containsSession(fs []FailingSession, id string) bool {
	for _, f := range fs {
		if f.Session == id {
			return true
		}
	}
	return false
}

func runFailed(run Report, id string) bool {
	for _, f := range run.Failures {
		if f.Session == id {
			return true
		}
	}
	return false
}
