package guard

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

// DefaultStateMaxBytes is the size a FileStore's file is kept within
// unless told otherwise: far below the 1 Mi volume it lives on in the Pod,
// with room for the temporary copy written next to it.
const DefaultStateMaxBytes = 256 << 10

// FileStore keeps the state as JSON in one file of at most MaxBytes (0:
// DefaultStateMaxBytes), replaced atomically: a temporary file in the same
// directory, synced, then renamed over it. A full volume (ENOSPC) thus
// fails a save but leaves the previous state whole, and the file never
// grows with the alerts: Save drops the oldest until the state fits.
type FileStore struct {
	Path     string
	MaxBytes int
}

var _ StateStore = FileStore{}

func (f FileStore) maxBytes() int {
	if f.MaxBytes > 0 {
		return f.MaxBytes
	}
	return DefaultStateMaxBytes
}

// Load implements StateStore. A file larger than MaxBytes is not read
// whole: it is reported as ErrStateUnreadable like a torn one.
func (f FileStore) Load() (State, bool, error) {
	file, err := os.Open(f.Path)
	if errors.Is(err, os.ErrNotExist) {
		return State{}, false, nil
	}
	if err != nil {
		return State{}, false, fmt.Errorf("read state: %w", err)
	}
	defer file.Close()
	b, err := io.ReadAll(io.LimitReader(file, int64(f.maxBytes())+1))
	if err != nil {
		return State{}, false, fmt.Errorf("read state: %w", err)
	}
	if len(b) > f.maxBytes() {
		return State{}, false, fmt.Errorf("%s: %w: larger than %d bytes", f.Path, ErrStateUnreadable, f.maxBytes())
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return State{}, false, fmt.Errorf("%s: %w: %v", f.Path, ErrStateUnreadable, err)
	}
	return st, true, nil
}

// Save implements StateStore. When the state does not fit in MaxBytes the
// oldest alerts are left out of the file (the newest that fit are kept);
// should it not fit even without alerts, nothing is written and the
// previous file stays.
func (f FileStore) Save(st State) error {
	b, err := encodeWithin(st, f.maxBytes())
	if err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(f.Path), ".guardian-state-*")
	if err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	_, err = tmp.Write(b)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), f.Path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("save state: %w", err)
	}
	// The rename is durable once the directory is synced; without it a
	// crash could bring back the previous file, which is still whole.
	if dir, err := os.Open(filepath.Dir(f.Path)); err == nil {
		dir.Sync()
		dir.Close()
	}
	return nil
}

// encodeWithin encodes st as JSON of at most max bytes, keeping the
// newest alerts that fit.
func encodeWithin(st State, max int) ([]byte, error) {
	alerts := st.Alerts
	st.Alerts = nil
	base, err := json.Marshal(st)
	if err != nil {
		return nil, err
	}
	// Compact JSON: the alerts replace "null" with "[a,b,…]".
	size := len(base) - len("null") + len("[]")
	if size > max {
		return nil, fmt.Errorf("state without alerts is %d bytes, over the %d-byte cap", size, max)
	}
	keep := 0
	for i := len(alerts) - 1; i >= 0; i-- {
		b, err := json.Marshal(alerts[i])
		if err != nil {
			return nil, err
		}
		next := size + len(b)
		if i < len(alerts)-1 {
			next++ // the comma
		}
		if next > max {
			break
		}
		size, keep = next, len(alerts)-i
	}
	st.Alerts = alerts[len(alerts)-keep:]
	b, err := json.Marshal(st)
	if err != nil {
		return nil, err
	}
	if len(b) > max {
		return nil, fmt.Errorf("state is %d bytes, over the %d-byte cap", len(b), max)
	}
	return b, nil
}

// load takes up the saved state, with the kill budget and hang policy of
// the current configuration (the saved history, today's rules).
func (g *Guardian) load() error {
	if g.store == nil {
		return nil
	}
	st, ok, err := g.store.Load()
	if err != nil {
		// A torn, foreign or oversized file, or an unreadable volume,
		// must not stop protection: start afresh, and say so (the
		// alert's save replaces a bad file at once).
		g.log.Error("state unreadable, starting afresh", "err", err)
		g.raise("state-unreadable", "", alert.Warning, fmt.Sprintf("saved state ignored, guardian starts afresh: %v", err), nil)
		return nil
	}
	if !ok {
		return nil
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

// saveLogged saves, and logs and alerts a failure: a full or broken
// state volume costs what a restart would take up, never protection.
func (g *Guardian) saveLogged() {
	if err := g.save(); err != nil {
		g.log.Error("save state", "err", err)
		g.raise("state-save-failed", "", alert.Warning, fmt.Sprintf("guardian could not save its state: %v", err), nil)
	}
}
