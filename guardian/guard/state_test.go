package guard

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/guardian/victim"
)

func TestFileStore(t *testing.T) {
	saved := State{MemoryLimit: 1024 * mib, Kills: 2, Starts: 1,
		Budget: victim.KillBudget{Kills: []time.Time{time.Unix(1_000_000, 0).UTC()}}}
	tests := []struct {
		name      string
		content   *string // nil: no file
		want      State
		wantOK    bool
		wantErrIs error
	}{
		{name: "nothing saved yet", wantOK: false},
		{name: "torn file", content: ptr(`{"memory_limit": 10`), wantErrIs: ErrStateUnreadable},
		{name: "foreign file", content: ptr(`[1,2,3]`), wantErrIs: ErrStateUnreadable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := FileStore{Path: filepath.Join(t.TempDir(), "state.json")}
			if tt.content != nil {
				if err := os.WriteFile(f.Path, []byte(*tt.content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			got, ok, err := f.Load()
			if !errors.Is(err, tt.wantErrIs) || (tt.wantErrIs == nil && err != nil) {
				t.Fatalf("Load() error = %v; want %v", err, tt.wantErrIs)
			}
			if ok != tt.wantOK {
				t.Errorf("Load() ok = %v; want %v", ok, tt.wantOK)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Load() (-want +got):\n%s", diff)
			}
		})
	}
	t.Run("saved state loads back, replacing the old file whole", func(t *testing.T) {
		dir := t.TempDir()
		f := FileStore{Path: filepath.Join(dir, "state.json")}
		if err := f.Save(State{MemoryLimit: 1, Alerts: nil, Bombs: 7}); err != nil {
			t.Fatal(err)
		}
		if err := f.Save(saved); err != nil {
			t.Fatal(err)
		}
		got, ok, err := f.Load()
		if err != nil || !ok {
			t.Fatalf("Load() = %v, %v", ok, err)
		}
		if diff := cmp.Diff(saved, got); diff != "" {
			t.Errorf("Load() after Save (-want +got):\n%s", diff)
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 {
			t.Errorf("directory holds %d entries after two saves; want the state file only", len(entries))
		}
	})
}

// A state file guardian cannot read must not stop it: it starts afresh.
func TestStartWithUnreadableState(t *testing.T) {
	r := newRigWith(t, testConfig(), func(r *rig) {
		r.store.Path = filepath.Join(t.TempDir(), "state.json")
		if err := os.WriteFile(r.store.Path, []byte("{torn"), 0o600); err != nil {
			t.Fatal(err)
		}
	})
	if r.g.st.Starts != 1 {
		t.Errorf("starts = %d; want 1 (a fresh state)", r.g.st.Starts)
	}
	st, ok, err := r.store.Load()
	if err != nil || !ok || st.Starts != 1 {
		t.Errorf("state after start = %+v, %v, %v; want the fresh state saved over the torn one", st, ok, err)
	}
}

func ptr[T any](v T) *T { return &v }
