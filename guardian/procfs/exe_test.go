package procfs

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"labkeep/guardian/victim"
)

func statID(t *testing.T, path string) victim.FileID {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return victim.FileID{Dev: st.Dev, Ino: st.Ino}
}

// ExeFile names the file a process runs, and keeps naming it after the
// path was given to another file; FileInRoot names the file at a path
// now.
func TestExeFileAndFileInRoot(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "sleep")
	b, err := os.ReadFile("/bin/sleep")
	if err != nil {
		t.Skip("no /bin/sleep")
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	orig := statID(t, bin)
	cmd := exec.Command(bin, "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	fs := New("/proc", "")
	pid := cmd.Process.Pid

	if got, err := fs.ExeFile(pid); err != nil || got != orig {
		t.Errorf("ExeFile() = %v, %v; want %v", got, err, orig)
	}
	if got, err := fs.FileInRoot(pid, bin); err != nil || got != orig {
		t.Errorf("FileInRoot() = %v, %v; want %v", got, err, orig)
	}

	// Replace the file at the path, as a user swapping a binary would.
	if err := os.WriteFile(bin+".new", b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(bin+".new", bin); err != nil {
		t.Fatal(err)
	}
	replaced := statID(t, bin)
	if replaced == orig {
		t.Fatal("the new file has the old inode")
	}
	if got, err := fs.ExeFile(pid); err != nil || got != orig {
		t.Errorf("after the replacement ExeFile() = %v, %v; want the running file %v", got, err, orig)
	}
	if got, err := fs.FileInRoot(pid, bin); err != nil || got != replaced {
		t.Errorf("after the replacement FileInRoot() = %v, %v; want the new file %v", got, err, replaced)
	}
	if _, err := fs.FileInRoot(pid, filepath.Join(dir, "missing")); err == nil {
		t.Error("FileInRoot() of a missing file succeeded")
	}
	cmd.Process.Kill()
	cmd.Wait()
	if _, err := fs.ExeFile(pid); err == nil {
		t.Error("ExeFile() of an exited process succeeded")
	}
}
