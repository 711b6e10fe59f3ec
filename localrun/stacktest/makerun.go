package stacktest

import (
	"context"
	"io"
	"os"
	"testing"

	"labkeep/localrun/devserve"
	"labkeep/localrun/stack"
)

// MakeRun starts what `make run` serves (devserve.Start) on st, as a
// newcomer's `make run` would: the settings production must be given are
// left to its local defaults (any LABKEEP_* of the test's environment for
// them is cleared), it listens on a free loopback port, in a sessions
// namespace of its own, with settings (LABKEEP_* name → value) on top. It
// prints to out (nothing kept if nil) and is stopped when t ends.
func MakeRun(t testing.TB, st *stack.Stack, settings map[string]string, out io.Writer) *devserve.Server {
	t.Helper()
	for _, k := range []string{"LABKEEP_ENV", "LABKEEP_DATABASE_URL", "LABKEEP_JWT_SECRET", "LABKEEP_WORKSPACE_KEY", "LABKEEP_LABS_FILE", "LABKEEP_KUBECONFIG", "LABKEEP_SCHEDULER_TOKEN", "LABKEEP_PORTAL"} {
		t.Setenv(k, "")
		os.Unsetenv(k) // Start fills these with local defaults
	}
	t.Setenv("LABKEEP_NAMESPACE", "run-"+Suffix())
	t.Setenv("LABKEEP_HTTP_ADDR", "127.0.0.1:0")
	for k, v := range settings {
		t.Setenv(k, v)
	}
	if out == nil {
		out = io.Discard
	}
	srv, err := devserve.Start(context.Background(), st, t.TempDir(), Discard(), out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Error(err)
		}
	})
	return srv
}
