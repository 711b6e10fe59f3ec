package guard

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"labkeep/guardian/alert"
	"labkeep/guardian/victim"
)

// State is what guardian persists so a restarted guardian takes up where
// the previous one stopped: the limit M it derived, the kill history (the
// kill-loop pause must survive a restart), the hang escalation and the
// recent alerts.
type State struct {
	MemoryLimit uint64             `json:"memory_limit"`
	Budget      victim.KillBudget  `json:"kill_budget"`
	Hang        victim.HangTracker `json:"hang"`
	Alerts      []alert.Alert      `json:"alerts"`
	LastOOMKill uint64             `json:"last_oom_kill"`
	Kills       int                `json:"kills"`
	Bombs       int                `json:"bombs"`
	Starts      int                `json:"starts"`
}

// StateStore keeps State across guardian restarts (FileStore implements
// it). A nil StateStore in Deps means nothing is persisted.
type StateStore interface {
	// Load returns the saved state; ok is false when none was saved yet.
	// A saved state that cannot be decoded is reported with an error
	// wrapping ErrStateUnreadable, any other error means the store itself
	// failed.
	Load() (st State, ok bool, err error)
	// Save replaces the saved state so that a crash at any moment leaves
	// either the previous or the new state, never a torn one.
	Save(State) error
}

// ErrStateUnreadable marks saved state that exists but cannot be decoded
// (torn or foreign); guardian then starts afresh rather than not at all.
var ErrStateUnreadable = errors.New("saved state unreadable")

// FileStore keeps the state as JSON in one file, replaced atomically
// (temporary file in the same directory, then rename).
type FileStore struct{ Path string }

var _ StateStore = FileStore{}

// Load implements StateStore.
func (f FileStore) Load() (State, bool, error) {
	b, err := os.ReadFile(f.Path)
	if errors.Is(err, os.ErrNotExist) {
		return State{}, false, nil
	}
	if err != nil {
		return State{}, false, fmt.Errorf("read state: %w", err)
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return State{}, false, fmt.Errorf("%s: %w: %v", f.Path, ErrStateUnreadable, err)
	}
	return st, true, nil
}

// Save implements StateStore.
func (f FileStore) Save(st State) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(f.Path), ".guardian-state-*")
	if err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("save state: %w", err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), f.Path)
}

// load takes up the saved state, with the kill budget and hang policy of
// the current configuration (the saved history, today's rules).
func (g *Guardian) load() error {
	if g.store == nil {
		return nil
	}
	st, ok, err := g.store.Load()
	if errors.Is(err, ErrStateUnreadable) {
		// A torn or foreign file must not stop protection: start afresh.
		g.log.Error("state unreadable, starting afresh", "err", err)
		return nil
	}
	if err != nil || !ok {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	st.Budget.Max, st.Budget.Window, st.Budget.Pause = g.cfg.KillMax, g.cfg.KillWindow, g.cfg.KillPause
	st.Hang.Policy = g.cfg.Hang
	g.st = st
	return nil
}

// save persists the state with the current recent alerts.
func (g *Guardian) save() error {
	if g.store == nil {
		return nil
	}
	g.mu.Lock()
	g.st.Alerts = g.alerts.Recent()
	st := g.st
	// The loops keep changing the kill history in place; the store gets
	// its own copy.
	st.Budget.Kills = append([]time.Time(nil), g.st.Budget.Kills...)
	g.mu.Unlock()
	return g.store.Save(st)
}

func (g *Guardian) saveLogged() {
	if err := g.save(); err != nil {
		g.log.Error("save state", "err", err)
	}
}
