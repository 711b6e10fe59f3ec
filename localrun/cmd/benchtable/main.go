// Command benchtable ends `make bench` and `make bench-quick`: it reads the
// rows the benchmarks recorded (localrun/benchtable, file
// $LABKEEP_BENCH_ROWS), saves them with the machine they ran on (cores,
// memory, kernel, cgroup version, Go) and the date as
// $LABKEEP_BENCH_RESULTS/<UTC date-time>.json, and prints the one table:
// every figure with its baseline from the same run and their ratio, or why
// the baseline could not run here. No rows is an error: the benchmarks did
// not run. With $LABKEEP_BENCH_README set (`make bench` sets it to
// test/bench/README.md) it also writes the table into that file, between
// its markers.
//
// `benchtable SAVED.json` renders a saved result instead: it prints the
// table and writes it into $LABKEEP_BENCH_README, reading no rows and
// saving nothing.
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
	BenchRows    string `envconfig:"BENCH_ROWS"`
	BenchReadme  string `envconfig:"BENCH_README"`
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
	if len(os.Args) > 1 {
		return render(cfg, os.Args[1])
	}
	if cfg.BenchRows == "" {
		return errors.New("LABKEEP_BENCH_ROWS is required")
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
	if err := show(cfg, res, path); err != nil {
		return err
	}
	fmt.Printf("\nsaved %s\n", path)
	return nil
}

// render shows the result saved at path.
func render(cfg config, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var res benchtable.Result
	if err := json.Unmarshal(data, &res); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if len(res.Rows) == 0 {
		return errors.New(path + ": no rows")
	}
	return show(cfg, res, path)
}

// show prints res and, with LABKEEP_BENCH_README set, writes it into that
// file; savedAs is where res is saved.
func show(cfg config, res benchtable.Result, savedAs string) error {
	fmt.Printf("\n%s\n\n", res.Heading())
	if err := benchtable.WriteMarkdown(os.Stdout, res.TableRows()); err != nil {
		return err
	}
	if cfg.BenchReadme == "" {
		return nil
	}
	doc, err := os.ReadFile(cfg.BenchReadme)
	if err != nil {
		return err
	}
	if doc, err = benchtable.ReplaceTable(doc, res, filepath.ToSlash(savedAs)); err != nil {
		return fmt.Errorf("%s: %w", cfg.BenchReadme, err)
	}
	if err := os.WriteFile(cfg.BenchReadme, doc, 0o644); err != nil {
		return err
	}
	fmt.Printf("\nwrote the table into %s\n", cfg.BenchReadme)
	return nil
}
