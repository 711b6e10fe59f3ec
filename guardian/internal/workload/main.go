// Command workload is the misbehaving user of guardian's end-to-end tests.
// It only ever runs inside a test's limited cgroup. Subcommands:
//
//	workload hog -mb 200 -step 8 -every 20ms [-comm sshd]   grow memory fast, then hold it
//	workload bomb                                           fork bomb: every process starts two copies of itself
//	workload spin [-nice -20]                               burn one CPU (optionally try to renice itself first)
//	workload idle [-comm name] [-mb 10]                     hold some memory and sleep
//	workload fakesshd -addr 127.0.0.1:22                    take the SSH port: answer an SSH banner, burn one CPU
//	workload listen -addr 127.0.0.1:9090                    take a port and hold it, idle (guardian's API port)
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// init keeps main on the process's main thread. PR_SET_NAME renames only
// the calling thread, and the process's name (/proc/<pid>/comm, what
// guardian reads) is the main thread's: a main goroutine that had moved
// to another thread, as Go moves it after a blocking system call on a busy
// CPU, would rename a thread nobody looks at.
func init() { runtime.LockOSThread() }

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: workload hog|bomb|spin|idle [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	mb := fs.Int("mb", 200, "memory to allocate in MiB")
	step := fs.Int("step", 8, "MiB per step")
	every := fs.Duration("every", 20*time.Millisecond, "pause between steps")
	comm := fs.String("comm", "", "process name to take (prctl PR_SET_NAME)")
	nice := fs.Int("nice", 0, "nice value to try before spinning (0: leave)")
	addr := fs.String("addr", "127.0.0.1:22", "address to listen on (fakesshd)")
	fs.Parse(os.Args[2:])
	if *comm != "" {
		name, err := unix.BytePtrFromString(*comm)
		if err == nil {
			unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(name)), 0, 0, 0)
		}
	}
	switch os.Args[1] {
	case "hog":
		hold(grow(*mb, *step, *every))
	case "idle":
		hold(grow(*mb, *mb, 0))
	case "spin":
		if *nice != 0 {
			if err := unix.Setpriority(unix.PRIO_PROCESS, 0, *nice); err != nil {
				fmt.Fprintf(os.Stderr, "renice %d refused: %v\n", *nice, err)
			} else {
				fmt.Fprintf(os.Stderr, "reniced to %d\n", *nice)
			}
		}
		for x := 0; ; x++ {
			_ = x * x
		}
	case "bomb":
		bomb()
	case "threads": // workload threads [n]: start n threads (2000), hold 2 s, exit 0
		threads(fs.Args())
	case "fakesshd":
		fakeSSHD(*addr)
	case "listen":
		ln, err := net.Listen("tcp", *addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "listen:", err)
			os.Exit(1)
		}
		for range time.Tick(time.Hour) {
			_ = ln.Addr() // the listener stays referenced: held until killed
		}
	default:
		fmt.Fprintln(os.Stderr, "unknown subcommand", os.Args[1])
		os.Exit(2)
	}
}

// grow allocates and touches mb MiB, step MiB at a time.
func grow(mb, step int, every time.Duration) [][]byte {
	var chunks [][]byte
	for got := 0; got < mb; got += step {
		c := make([]byte, step<<20)
		for i := 0; i < len(c); i += 4096 {
			c[i] = 1
		}
		chunks = append(chunks, c)
		if every > 0 {
			time.Sleep(every)
		}
	}
	return chunks
}

func hold(keep [][]byte) {
	for {
		time.Sleep(time.Hour)
		_ = keep
	}
}

// bomb starts two copies of itself and waits for them, forever: the Go
// variant of :(){ :|:& };: — when a fork is refused it retries.
func bomb() {
	self, _ := os.Executable()
	for {
		var cmds []*exec.Cmd
		for i := 0; i < 2; i++ {
			c := exec.Command(self, "bomb")
			if err := c.Start(); err == nil {
				cmds = append(cmds, c)
			}
		}
		for _, c := range cmds {
			c.Wait()
		}
		if len(cmds) == 0 {
			time.Sleep(time.Millisecond)
		}
		syscall.Getpid()
	}
}

// fakeSSHD is a hostile root's own program on the SSH port: it answers
// connections with an OpenSSH banner (so a prober takes it for sshd) and
// burns a CPU.
func fakeSSHD(addr string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakesshd:", err)
		os.Exit(1)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				continue
			}
			c.Write([]byte("SSH-2.0-OpenSSH_9.2\r\n"))
			c.Close()
		}
	}()
	for x := 0; ; x++ {
		_ = x * x
	}
}
