package benchtable

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Machine is what a result's figures depend on besides the code.
type Machine struct {
	Cores     int    `json:"cores"`
	CPU       string `json:"cpu,omitempty"`
	MemoryMiB int64  `json:"memoryMiB"`
	Kernel    string `json:"kernel"`
	// Cgroup is the cgroup version mounted at /sys/fs/cgroup: "v2",
	// "hybrid" (v1 controllers with the v2 hierarchy beside them) or "v1".
	Cgroup string `json:"cgroup"`
	Go     string `json:"go"`
}

// Result is one saved run of the table.
type Result struct {
	Date    time.Time `json:"date"`
	Quick   bool      `json:"quick"`
	Machine Machine   `json:"machine"`
	Rows    []Saved   `json:"rows"`
}

// Saved is a row as saved, with its ratio (nil when none).
type Saved struct {
	Row
	Ratio *float64 `json:"ratio"`
}

// NewResult pairs rows with their ratios.
func NewResult(date time.Time, quick bool, m Machine, rows []Row) Result {
	res := Result{Date: date.UTC(), Quick: quick, Machine: m, Rows: make([]Saved, 0, len(rows))}
	for _, r := range rows {
		s := Saved{Row: r}
		if ratio, ok := r.Ratio(); ok {
			s.Ratio = F(ratio)
		}
		res.Rows = append(res.Rows, s)
	}
	return res
}

// ThisMachine reads this machine's cores, CPU model, memory, kernel release
// and cgroup version; goVersion is the toolchain that built the benchmarks.
func ThisMachine(goVersion string) (Machine, error) {
	m := Machine{Cores: runtime.NumCPU(), Go: goVersion}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return m, fmt.Errorf("uname: %w", err)
	}
	m.Kernel = unix.ByteSliceToString(uts.Release[:])
	mem, err := procField("/proc/meminfo", "MemTotal")
	if err != nil {
		return m, err
	}
	kib, err := strconv.ParseInt(strings.TrimSuffix(mem, " kB"), 10, 64)
	if err != nil {
		return m, fmt.Errorf("/proc/meminfo MemTotal %q: %w", mem, err)
	}
	m.MemoryMiB = kib / 1024
	// Not every architecture names the CPU in /proc/cpuinfo; the model is
	// informative only.
	m.CPU, _ = procField("/proc/cpuinfo", "model name")
	m.Cgroup, err = cgroupVersion("/sys/fs/cgroup")
	return m, err
}

// procField is the value of the first "name: value" line of a /proc file.
func procField(path, name string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == name {
			return strings.TrimSpace(v), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s: no %q", path, name)
}

// cgroupVersion tells v2 (cgroup2 mounted at root), hybrid (v1 with the v2
// hierarchy at root/unified) and v1 apart by filesystem type.
func cgroupVersion(root string) (string, error) {
	var fs unix.Statfs_t
	if err := unix.Statfs(root, &fs); err != nil {
		return "", fmt.Errorf("statfs %s: %w", root, err)
	}
	if fs.Type == unix.CGROUP2_SUPER_MAGIC {
		return "v2", nil
	}
	var unified unix.Statfs_t
	err := unix.Statfs(root+"/unified", &unified)
	switch {
	case err == nil && unified.Type == unix.CGROUP2_SUPER_MAGIC:
		return "hybrid", nil
	case err == nil || errors.Is(err, syscall.ENOENT):
		return "v1", nil
	default:
		return "", fmt.Errorf("statfs %s/unified: %w", root, err)
	}
}

// Heading is the date and machine line printed above a result's table.
func (res Result) Heading() string {
	m := res.Machine
	return fmt.Sprintf("%s; %d cores (%s), %d MiB, kernel %s, cgroup %s, %s",
		res.Date.Format(time.RFC3339), m.Cores, m.CPU, m.MemoryMiB, m.Kernel, m.Cgroup, m.Go)
}

// TableRows are the result's rows as WriteMarkdown takes them.
func (res Result) TableRows() []Row {
	rows := make([]Row, len(res.Rows))
	for i, s := range res.Rows {
		rows[i] = s.Row
	}
	return rows
}
