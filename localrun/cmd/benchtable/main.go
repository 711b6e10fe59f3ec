// Command benchtable ends `make bench` and `make bench-quick`: it reads the
// rows the benchmarks recorded (localrun/benchtable, file
// $LABKEEP_BENCH_ROWS), saves them with the machine they ran on (cores,
// memory, kernel, cgroup version, Go) and the date as
// $LABKEEP_BENCH_RESULTS/<UTC date-time>.json, and prints the one table:
// every figure with its baseline from the same run and their ratio, or why
// the baseline could not run here. No rows is an error: the benchmarks did
// not run.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/kelseyhightower/envconfig"

	"labkeep/localrun/benchtable"
)

type config struct {
	BenchRows    string `envconfig:"BENCH_ROWS" required:"true"`
	BenchResults string `envconfig:"BENCH_RESULTS" default:"test/bench/results"`
	BenchQuick   bool   `envconfig:"BENCH_QUICK"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
}

func run() error {
	var cfg config
	if err := envconfig.Process("labkeep", &cfg); err != nil {
		return err
	}
	rows, err := benchtable.ReadRowsFile(cfg.BenchRows)
	if err != nil {
		return err
	}
	if len(rows) == 0 {
		return errors.New(cfg.BenchRows + ": no rows: no BenchmarkTable… recorded a figure")
	}
	benchtable.Sort(rows)
	m, err := benchtable.ThisMachine(runtime.Version())
	if err != nil {
		return err
	}
	now := time.Now().UTC()
	res := benchtable.NewResult(now, cfg.BenchQuick, m, rows)
	out, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(cfg.BenchResults, 0o755); err != nil {
		return err
	}
	path := filepath.Join(cfg.BenchResults, now.Format("2006-01-02T150405Z")+".json")
	if err := os.WriteFile(path, append(out, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Printf("\n%s; %d cores (%s), %d MiB, kernel %s, cgroup %s, %s\n\n",
		now.Format(time.RFC3339), m.Cores, m.CPU, m.MemoryMiB, m.Kernel, m.Cgroup, m.Go)
	if err := benchtable.WriteMarkdown(os.Stdout, rows); err != nil {
		return err
	}
	fmt.Printf("\nsaved %s\n", path)
	return nil
}
