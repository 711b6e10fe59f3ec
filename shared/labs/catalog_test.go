package labs

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// mount is a directory laid out as the kubelet lays out a ConfigMap
// volume: labs.yaml -> ..data/labs.yaml, ..data -> a timestamped
// directory, and an update writes a new directory and swaps ..data.
type mount struct {
	t       *testing.T
	dir     string
	version int
}

func newMount(t *testing.T, content string) *mount {
	t.Helper()
	m := &mount{t: t, dir: t.TempDir()}
	m.write(content)
	if err := os.Symlink(filepath.Join("..data", "labs.yaml"), m.path()); err != nil {
		t.Fatal(err)
	}
	return m
}

func (m *mount) path() string { return filepath.Join(m.dir, "labs.yaml") }

// write puts content in a new version directory and swaps ..data to it,
// atomically, as the kubelet does.
func (m *mount) write(content string) {
	m.t.Helper()
	m.version++
	v := filepath.Join(m.dir, "..v"+strings.Repeat("1", m.version))
	if err := os.Mkdir(v, 0o755); err != nil {
		m.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(v, "labs.yaml"), []byte(content), 0o644); err != nil {
		m.t.Fatal(err)
	}
	tmp := filepath.Join(m.dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(v), tmp); err != nil {
		m.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(m.dir, "..data")); err != nil {
		m.t.Fatal(err)
	}
}

// counted is a Metrics that keeps what it was told: the generation and
// labs last loaded, and the refusals.
type counted struct {
	generation, labs, failures float64
}

func (c *counted) Loaded(gen int64, labs int) { c.generation, c.labs = float64(gen), float64(labs) }
func (c *counted) Refused()                   { c.failures++ }

const added = good + `
- name: net-lab
  kind: pod
  image: docker.io/library/debian:12
  nodes: [{role: workspace}]
  capabilities: [NET_RAW]
`

// TestLiveReloadsGoodAndRefusesBad drives the watcher with its own tick
// channel through good → bad → unreadable → good files and checks what is
// in force, the log and what Metrics was told after each.
func TestLiveReloadsGoodAndRefusesBad(t *testing.T) {
	m := newMount(t, good)
	var logs bytes.Buffer
	metrics := &counted{}
	live, err := OpenLive(m.path(), slog.New(slog.NewTextHandler(&logs, nil)), metrics)
	if err != nil {
		t.Fatal(err)
	}
	// step runs Watch for exactly one tick: once Watch has returned, its
	// Reload is over, so the state and the log read next are all of it.
	step := func() {
		tick := make(chan time.Time)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { live.Watch(ctx, tick); close(done) }()
		tick <- time.Time{}
		cancel()
		<-done
	}

	type state struct {
		Names      []string
		Generation float64
		Failures   float64
		Labs       float64
	}
	now := func() state {
		return state{live.Names(), metrics.generation, metrics.failures, metrics.labs}
	}
	three := []string{"k8s-cluster", "linux-basics", "shell"}
	four := []string{"k8s-cluster", "linux-basics", "net-lab", "shell"}
	steps := []struct {
		name    string
		change  func()
		want    state
		wantLog string
	}{
		{"unchanged file keeps generation 1", func() {}, state{three, 1, 0, 3}, ""},
		{"a lab added is in force", func() { m.write(added) }, state{four, 2, 0, 4}, "lab catalog reloaded"},
		{"an invalid catalog is refused and the last good stays", func() {
			m.write(strings.Replace(added, "kind: pod", "kind: container", 1))
		}, state{four, 2, 1, 4}, `lab catalog refused; the last good catalog stays in force`},
		{"the same bad file is reported once", func() {}, state{four, 2, 1, 4}, ""},
		{"an unreadable file is refused too", func() {
			if err := os.Remove(m.path()); err != nil {
				t.Fatal(err)
			}
		}, state{four, 2, 2, 4}, "no such file"},
		{"a good file again is in force", func() {
			if err := os.Symlink(filepath.Join("..data", "labs.yaml"), m.path()); err != nil {
				t.Fatal(err)
			}
			m.write(good)
		}, state{three, 3, 2, 3}, "lab catalog reloaded"},
	}
	for _, s := range steps {
		logs.Reset()
		s.change()
		step()
		if diff := cmp.Diff(s.want, now()); diff != "" {
			t.Errorf("%s (-want +got):\n%s", s.name, diff)
		}
		if got := logs.String(); (s.wantLog == "") != (got == "") || !strings.Contains(got, s.wantLog) {
			t.Errorf("%s: log %q, want one containing %q", s.name, got, s.wantLog)
		}
	}
}

// TestLiveSnapshotsOutliveReload: a catalog taken before a reload (as an
// open in flight holds its lab) is not changed by it.
func TestLiveSnapshotsOutliveReload(t *testing.T) {
	m := newMount(t, added)
	live, err := OpenLive(m.path(), slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	before := live.Current()
	lab, _ := live.Get("net-lab")
	m.write(good)
	if err := live.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, ok := live.Get("net-lab"); ok {
		t.Error("net-lab still in force after it was removed from the file")
	}
	if got, ok := before.Get("net-lab"); !ok || !cmp.Equal(lab, got) {
		t.Errorf("snapshot taken before the reload lost net-lab: %v %v", got, ok)
	}
	if err := live.Reload(); !errors.Is(err, ErrUnchanged) {
		t.Errorf("second Reload of the same file: %v, want ErrUnchanged", err)
	}
}

func TestOpenLiveRefusesBadCatalog(t *testing.T) {
	m := newMount(t, "labs: []\n")
	if _, err := OpenLive(m.path(), slog.New(slog.DiscardHandler), nil); err == nil || !strings.Contains(err.Error(), "no labs defined") {
		t.Errorf("OpenLive of an empty catalog: %v, want no labs defined", err)
	}
}
