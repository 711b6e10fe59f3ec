package reap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"time"
)

// Home: a student's home (labs.Home) unused for HomeRetention.
const Home ItemKind = "home"

// HomeReader: a home reader left behind (kube's homereader.go: the Pod
// that reads a home no session holds for its download), which the
// function that made it did not delete (it crashed, or lost the API
// server).
const HomeReader ItemKind = "reader"

// HomeReaderLifetime is the longest a home reader lives: its one
// container sleeps this long from its start and then ends, so no download
// of a home no session holds lasts longer (the platforms' own request
// timeouts, 60 to 120 s as infra/ deploys them, end one sooner), and a
// reader a killed function left keeps its home's downloads refused this
// long at most. HomeReaderStart is the longest a function waits for a
// reader to start, shorter than those request timeouts. A run deletes a
// reader that has ended, and one made longer than both ago (one that never
// started, say), whatever its function does.
const (
	HomeReaderLifetime = 15 * time.Minute
	HomeReaderStart    = 45 * time.Second
)

// MinHomeRetention is the shortest HomeRetention accepted: a student's
// work must outlast a weekend and a short break.
const MinHomeRetention = 7 * 24 * time.Hour

// HomeClaim is a student's home as a run sees it in the namespace: one
// claim of this environment labelled as a home.
type HomeClaim struct {
	Name, UID, Env string
	// Group is the home's group (labs.Lab.HomeGroup; "" for the
	// student's default home).
	Group string
	// Size is what the claim asks for (a quantity), for the report.
	Size      string
	CreatedAt time.Time
	// Deleting is true if the claim already has a deletion timestamp.
	Deleting bool
}

// HomeUse is what the sessions say of one home: whether a live session
// holds it, when the last session that held it finished (zero if none
// did), and whose it is.
type HomeUse struct {
	Live      bool
	LastEnded time.Time
	// Student is the student whose sessions held it.
	Student string
}

// LastUse is when home was last used: the end of the last session that
// held it, or its making if none has ended.
func (u HomeUse) LastUse(h HomeClaim) time.Time {
	if u.LastEnded.After(h.CreatedAt) {
		return u.LastEnded
	}
	return h.CreatedAt
}

// DueAt is when an unused home goes: its last use plus the retention.
// The portal and the admin console show it; PlanHomes decides by it.
func (u HomeUse) DueAt(h HomeClaim, retention time.Duration) time.Time {
	return u.LastUse(h).Add(retention)
}

// PlanHomes decides which homes a run deletes: those of this environment,
// not being deleted, that no live session holds and whose last use
// (HomeUse.LastUse; a home the sessions never mention counts from its
// making) lies HomeRetention or longer ago. A zero HomeRetention keeps
// every home. Items come out by name.
func PlanHomes(now time.Time, homes []HomeClaim, use map[string]HomeUse, r Rules) []Item {
	if r.HomeRetention <= 0 {
		return nil
	}
	var items []Item
	for _, h := range homes {
		u := use[h.Name]
		if h.Env != r.Env || h.Deleting || u.Live || now.Before(u.DueAt(h, r.HomeRetention)) {
			continue
		}
		items = append(items, Item{Kind: Home, HomeClaim: h,
			Reason: fmt.Sprintf("home %s (%s) unused since %s, longer than %s", h.Name, h.Size, u.LastUse(h).UTC().Format(time.RFC3339), r.HomeRetention)})
	}
	sort.Slice(items, func(i, j int) bool { return items[i].HomeClaim.Name < items[j].HomeClaim.Name })
	return items
}

// Errors of the admin's home delete.
var (
	// ErrNoHome: no home of that name in this environment.
	ErrNoHome = errors.New("no_home")
	// ErrHomeInUse: a live session holds the home.
	ErrHomeInUse = errors.New("home_in_use")
)

// HomeStatus is a student's home as the portal and the admin console
// show it.
type HomeStatus struct {
	Name  string `json:"name"`
	Group string `json:"group"`
	Size  string `json:"size"`
	// Student is the student whose home it is, as the sessions know them
	// ("" if no session ever held it).
	Student string `json:"student,omitempty"`
	// InUse: a live session holds it.
	InUse   bool      `json:"inUse"`
	LastUse time.Time `json:"lastUse"`
	// DeleteAt is when the reaper deletes it unless a session uses it
	// first; nil while in use or when homes are kept for ever.
	DeleteAt *time.Time `json:"deleteAt,omitempty"`
}

// HomeStatuses lists this environment's homes, by name, with when each
// goes; one being deleted is left out.
func (r *Reaper) HomeStatuses(ctx context.Context) ([]HomeStatus, error) {
	claims, err := r.Cluster.ListHomes(ctx)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(claims))
	for i, h := range claims {
		names[i] = h.Name
	}
	use, err := r.Store.HomeUse(ctx, names)
	if err != nil {
		return nil, err
	}
	out := make([]HomeStatus, 0, len(claims))
	for _, h := range claims {
		if h.Deleting {
			continue // on its way out: nobody's home any more
		}
		u := use[h.Name]
		st := HomeStatus{Name: h.Name, Group: h.Group, Size: h.Size, Student: u.Student, InUse: u.Live, LastUse: u.LastUse(h).UTC()}
		if !u.Live && r.Config.HomeRetention > 0 {
			at := u.DueAt(h, r.Config.HomeRetention).UTC()
			st.DeleteAt = &at
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// DeleteUnusedHome is the admin's delete of a home no session holds:
// ErrNoHome if this environment has none of that name, ErrHomeInUse while
// a live session holds it.
func (r *Reaper) DeleteUnusedHome(ctx context.Context, name string) error {
	claims, err := r.Cluster.ListHomes(ctx)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(claims, func(h HomeClaim) bool { return h.Name == name })
	if i < 0 {
		return fmt.Errorf("%w: this environment has no home %q", ErrNoHome, name)
	}
	use, err := r.Store.HomeUse(ctx, []string{name})
	if err != nil {
		return err
	}
	if use[name].Live {
		return fmt.Errorf("%w: a live session holds home %s; close it first", ErrHomeInUse, name)
	}
	return r.Cluster.DeleteHome(ctx, claims[i])
}

// planHomes is PlanHomes over this environment's homes (one list call),
// with their use read from the Store (one query).
func (r *Reaper) planHomes(ctx context.Context) ([]Item, error) {
	if r.Config.HomeRetention <= 0 {
		return nil, nil
	}
	homes, err := r.Cluster.ListHomes(ctx)
	if err != nil || len(homes) == 0 {
		return nil, err
	}
	names := make([]string, len(homes))
	for i, h := range homes {
		names[i] = h.Name
	}
	use, err := r.Store.HomeUse(ctx, names)
	if err != nil {
		return nil, fmt.Errorf("reading when homes were last used: %w", err)
	}
	return PlanHomes(r.Now(), homes, use, r.Config.Rules), nil
}

// deleteHome deletes an unused home after asking the sessions again: an
// open that took it since the plan (its row names the home before the
// home is mounted) keeps it. An open whose row lands between that
// question and the delete finds its home being deleted and is refused
// (session.ErrHomeBusy); its next open makes a new one.
func (r *Reaper) deleteHome(ctx context.Context, log *slog.Logger, it Item, dryRun bool, fail func(string, error)) bool {
	h := it.HomeClaim
	use, err := r.Store.HomeUse(ctx, []string{h.Name})
	if err != nil {
		fail(h.Name, fmt.Errorf("re-checking the home's use: %w", err))
		return false
	}
	if u := use[h.Name]; u.Live || r.Now().Before(u.DueAt(h, r.Config.HomeRetention)) {
		log.Info("home in use again; kept", "home", h.Name)
		return false
	}
	if dryRun {
		log.Info("would delete unused home", "home", h.Name, "reason", it.Reason)
		return true
	}
	if err := r.Cluster.DeleteHome(ctx, h); err != nil {
		fail(h.Name, err)
		return false
	}
	log.Info("deleted unused home", "home", h.Name, "reason", it.Reason)
	return true
}
