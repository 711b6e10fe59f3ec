package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// zstdModule is a Go module that vendors the zstd C library with its
// upstream Makefile: a real C project that builds offline with make and
// gcc, fetched through the Go module proxy like any other module.
const zstdModule = "github.com/valyala/gozstd@v1.21.1"

// zstdSources returns a writable copy of zstd's lib/ directory, kept under
// ~/.cache/labkeep/build-src, and skips the test with the reason when it
// cannot be had.
func zstdSources(t *testing.T) string {
	t.Helper()
	for _, tool := range []string{"/usr/bin/make", "/usr/bin/gcc"} {
		if _, err := os.Stat(tool); err != nil {
			t.Skipf("needs %s to build a real project: %v", tool, err)
		}
	}
	home, err := os.UserHomeDir()
	if err != nil {
		t.Skipf("no home directory for the source cache: %v", err)
	}
	cache := filepath.Join(home, ".cache", "labkeep", "build-src", "zstd-lib")
	if _, err := os.Stat(filepath.Join(cache, "Makefile")); err != nil {
		out, err := exec.Command("go", "mod", "download", "-json", zstdModule).Output()
		if err != nil {
			t.Skipf("cannot obtain zstd's sources (go mod download %s): %v", zstdModule, err)
		}
		var mod struct{ Dir string }
		if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
			t.Skipf("go mod download %s printed no module directory: %v", zstdModule, err)
		}
		tmp := cache + ".tmp"
		os.RemoveAll(tmp)
		if err := os.MkdirAll(filepath.Dir(cache), 0o755); err != nil {
			t.Fatal(err)
		}
		if b, err := exec.Command("cp", "-r", filepath.Join(mod.Dir, "zstd", "lib"), tmp).CombinedOutput(); err != nil {
			t.Fatalf("copy zstd sources: %v\n%s", err, b)
		}
		if err := os.Rename(tmp, cache); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(t.TempDir(), "zstd-lib")
	if b, err := exec.Command("cp", "-r", cache, dir).CombinedOutput(); err != nil {
		t.Fatalf("copy zstd sources: %v\n%s", err, b)
	}
	if b, err := exec.Command("chmod", "-R", "u+w", dir).CombinedOutput(); err != nil {
		t.Fatalf("chmod: %v\n%s", err, b)
	}
	return dir
}

// A parallel build of a real C project (make -j16, gcc) and a program with
// half the workspace's pids.max in threads (2,048 of 4,096 on the host;
// 512 of the 1,024 an emulated CPU gets) run inside the workspace's limits
// with guardian watching: both finish with exit 0, untouched — no
// fork-bomb alert, no containment, no kill.
func TestBuildsAreNoForkBombs(t *testing.T) {
	src := zstdSources(t)
	ws := newWorkspace(t, bombLimits)
	g := ws.startGuardian(t.TempDir()+"/state.json", defaultForkScan)

	n := bombLimits.Pids / 2
	threads := ws.user(bins.workload, "threads", strconv.Itoa(n))
	select {
	case <-threads.done:
	case <-time.After(scaled(2 * time.Minute)):
		t.Fatalf("the %d-thread program did not finish within %s", n, scaled(2*time.Minute))
	}
	if !threads.state.Success() {
		t.Errorf("the %d-thread program ended with %v: %s", n, threads.state, threads.stderr.String())
	}
	var got int
	if _, err := fmt.Sscanf(threads.stderr.String(), "threads %d", &got); err != nil || got < n {
		t.Errorf("the program did not report %d threads: %q", n, threads.stderr.String())
	}

	start := time.Now()
	// -O0: the build is here for its parallelism, not its code. An
	// emulated CPU runs each compiler process some 30 times slower (the
	// whole library took over 15 minutes), so there only the library's
	// common part is built: 8 compilations instead of 33, still all at
	// once.
	args := []string{"-C", src, "-j16", "libzstd.a", "CFLAGS=-O0"}
	if emulated() {
		args = append(args, "ZSTD_LIB_COMPRESSION=0", "ZSTD_LIB_DECOMPRESSION=0", "ZSTD_LEGACY_SUPPORT=0")
	}
	build := ws.user("/usr/bin/make", args...)
	select {
	case <-build.done:
	case <-time.After(scaled(8 * time.Minute)):
		t.Fatalf("make -j16 did not finish within %s", scaled(8*time.Minute))
	}
	if !build.state.Success() {
		t.Errorf("make -j16 ended with %v:\n%s", build.state, build.stderr.String())
	}
	if _, err := os.Stat(filepath.Join(src, "libzstd.a")); err != nil {
		t.Errorf("the build produced no library: %v", err)
	}
	t.Logf("make -j16 libzstd.a took %v", time.Since(start).Round(time.Millisecond))

	if a, ok := g.hasAlert("fork-bomb"); ok {
		t.Errorf("guardian took a build for a fork bomb: %q", a.Message)
	}
	for _, msg := range []string{"fork bomb detected", "containment finished", "memory victim killed"} {
		if n := len(g.records(msg)); n > 0 {
			t.Errorf("guardian logged %q %d times", msg, n)
		}
	}
}
