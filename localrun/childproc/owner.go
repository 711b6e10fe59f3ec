package childproc

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
)

// StartOwner runs this test binary again with only the test named test and
// the extra environment env: a separate process that owns something (a
// stack, a node) and can then be killed the way a real owner dies. The
// owner prints a JSON line describing what it owns; StartOwner decodes the
// first line that ready accepts into what and returns the running owner,
// whose stderr is this process's. The caller signals and waits for it.
func StartOwner[T any](test string, env []string, ready func(T) bool) (*exec.Cmd, T, error) {
	var what T
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.v")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, what, err
	}
	if err := cmd.Start(); err != nil {
		return nil, what, err
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		var v T
		if json.Unmarshal(sc.Bytes(), &v) == nil && ready(v) {
			return cmd, v, nil
		}
	}
	cmd.Process.Kill()
	err = cmd.Wait()
	return nil, what, errors.Join(fmt.Errorf("owner process %s reported nothing it owns", test), err)
}
