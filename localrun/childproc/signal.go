package childproc

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
)

var (
	signalMu   sync.Mutex
	signalFns  = map[int]func(){}
	signalNext int
	signalOnce sync.Once
)

// CleanupOnSignal runs fn when the process gets SIGINT or SIGTERM; after all
// registered functions have run, the default disposition is restored and
// the signal re-sent, so the process still ends as it would have. It is for
// test binaries, whose TestMain cleanup never runs on Ctrl-C. The returned
// func unregisters fn.
func CleanupOnSignal(fn func()) (unregister func()) {
	signalMu.Lock()
	id := signalNext
	signalNext++
	signalFns[id] = fn
	signalMu.Unlock()
	signalOnce.Do(func() {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
		go func() {
			sig := <-ch
			signalMu.Lock()
			fns := make([]func(), 0, len(signalFns))
			for _, f := range signalFns {
				fns = append(fns, f)
			}
			signalMu.Unlock()
			for _, f := range fns {
				f()
			}
			signal.Reset(os.Interrupt, syscall.SIGTERM)
			_ = syscall.Kill(os.Getpid(), sig.(syscall.Signal))
		}()
	})
	return func() {
		signalMu.Lock()
		delete(signalFns, id)
		signalMu.Unlock()
	}
}
