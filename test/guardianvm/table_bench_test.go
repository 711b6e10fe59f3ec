package guardianvm

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"labkeep/localrun/benchtable"
)

// BenchV2Env set to 1 puts guardian's table rows measured on cgroup v2 in
// `make bench`'s table.
const BenchV2Env = "LABKEEP_BENCH_V2"

// rowsMark starts each table row the guest prints back.
const rowsMark = "BENCHROW "

// BenchmarkTableGuardianV2 runs guardian/e2e's table benchmarks
// (BenchmarkTableGuardian…) in the cgroup v2 guest, always at their quick
// scale (at full scale the emulated scenarios, whose waits are stretched
// eightfold, outlast the guest's time), and records the rows they measured
// there.
// The guest's CPU is emulated (TCG, several times slower than the host):
// its latencies are emulation speed, the ratios to the baselines measured
// in the same guest are what carries over. It runs only when
// LABKEEP_BENCH_V2=1: booting the guest and running the scenarios under
// emulation does not fit make bench's 30-minute budget.
func BenchmarkTableGuardianV2(b *testing.B) {
	if os.Getenv(BenchV2Env) != "1" {
		b.Skipf("cgroup v2 runs only in the emulated guest, too slow for make bench's budget: %s=1 includes it", BenchV2Env)
	}
	for range b.N {
		rows := &guestRows{TB: b}
		console := &lineLog{tb: rows, start: time.Now()}
		// One line: the guest takes its command one argument a line.
		script := `export ` + benchtable.RowsEnv + `="$0/rows.jsonl" ` + benchtable.QuickEnv + `=1; ` +
			`"$0/e2e.test" -test.run '^$' -test.bench "$1" -test.benchtime 1x -test.timeout=25m; rc=$?; ` +
			`while read -r row; do echo "` + rowsMark + `$row"; done < "$0/rows.jsonl"; exit $rc`
		if code := runInGuest(b, console, script, "^BenchmarkTableGuardian"); code != 0 {
			b.Fatalf("the table benchmarks exited %d in the guest (output above)", code)
		}
		if len(rows.rows) == 0 {
			b.Fatal("the guest recorded no row")
		}
		for _, r := range rows.rows {
			benchtable.Record(b, r)
		}
	}
}

// guestRows is the benchmark's TB for the console log: it collects the
// rows the guest prints back after rowsMark.
type guestRows struct {
	testing.TB
	rows []benchtable.Row
}

// Logf logs the console line and collects a row from it.
func (g *guestRows) Logf(format string, args ...any) {
	g.TB.Helper()
	line := fmt.Sprintf(format, args...)
	g.TB.Log(line)
	_, row, found := strings.Cut(line, rowsMark)
	if !found {
		return
	}
	var r benchtable.Row
	if err := json.Unmarshal([]byte(row), &r); err != nil {
		g.TB.Errorf("a row from the guest does not decode: %v: %q", err, row)
		return
	}
	g.rows = append(g.rows, r)
}
