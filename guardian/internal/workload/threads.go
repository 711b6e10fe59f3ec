package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// threads starts n threads (args[0], default 2000: goroutines locked to
// their own OS thread), reports how many threads the process has on
// stderr, holds them for two seconds and exits 0: a heavily threaded
// program, inside pids.max, that is no fork bomb.
func threads(args []string) {
	n := 2000
	if len(args) > 0 {
		v, err := strconv.Atoi(args[0])
		if err != nil {
			fmt.Fprintln(os.Stderr, "threads: count:", err)
			os.Exit(2)
		}
		n = v
	}
	var ready, done sync.WaitGroup
	release := make(chan struct{})
	for i := 0; i < n; i++ {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			runtime.LockOSThread()
			ready.Done()
			<-release
		}()
	}
	ready.Wait()
	fmt.Fprintf(os.Stderr, "threads %d\n", threadCount())
	time.Sleep(2 * time.Second)
	close(release)
	done.Wait()
}

// threadCount reads the Threads: line of /proc/self/status.
func threadCount() int {
	b, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}
