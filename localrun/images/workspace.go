package images

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The workspace image's recipe. Any change here changes the cache key, so
// the next Build rebuilds the image.
const (
	debianSuite = "bookworm" // Debian 12
	// workspacePackages are installed on top of debootstrap's minbase
	// (which has bash, coreutils, util-linux): sshd, and ps/kill/top.
	workspacePackages = "openssh-server,procps"
	// workspaceRecipe versions the steps below (bump it when they change
	// in a way the other constants do not show).
	workspaceRecipe = "1"
)

// workspaceInit is the image's entrypoint. sshd is the container's main
// process, so when a user kills the listener the container ends and the
// kubelet restarts it: SSH comes back, files on the Pod's volumes stay.
//
// Credentials come from the Pod, never from the image: the session's host
// key from /etc/labkeep/ssh-host-key when the Pod mounts one (else a fresh
// key per container start), and the authorized keys from
// /etc/labkeep/ssh-authorized-keys (plus root's own ~/.ssh/authorized_keys).
// Both are copied to root-only files first: a Secret volume is a tmpfs whose
// mount point is mode 1777, and sshd (StrictModes) refuses key files under a
// world-writable directory. LABKEEP_SSH_PORT (default 22) is the port.
const workspaceInit = `#!/bin/sh
# labkeep workspace entrypoint: sshd in the foreground as the main process.
set -eu
mkdir -p /run/sshd /root/.ssh
chmod 0755 /run/sshd
chmod 0700 /root/.ssh
hostkey=/run/sshd/ssh_host_key
if [ -s /etc/labkeep/ssh-host-key ]; then
  # A Secret volume's files may be group/world readable; sshd refuses those.
  install -m 0600 /etc/labkeep/ssh-host-key "$hostkey"
else
  rm -f "$hostkey" "$hostkey.pub"
  ssh-keygen -q -t ed25519 -N '' -f "$hostkey"
fi
keys=/run/sshd/authorized_keys
rm -f "$keys"
if [ -s /etc/labkeep/ssh-authorized-keys ]; then
  install -m 0600 /etc/labkeep/ssh-authorized-keys "$keys"
fi
exec /usr/sbin/sshd -D -e -p "${LABKEEP_SSH_PORT:-22}" -o HostKey="$hostkey"
`

// sshdConfig is read before Debian's defaults (first value wins): keys
// only, root by key, no PAM (pam_loginuid fails without CAP_AUDIT_CONTROL,
// which a workspace's root does not have). MaxStartups 100:30:200, not
// sshd's 10:30:100: the kubelet's readiness probe connects every second,
// and while a bomb slows sshd down its unfinished connections count as
// startups; on the cgroup v2 node sshd passed 10 and dropped connections,
// students' logins among them, for 16 s.
const sshdConfig = `# labkeep workspace
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
AuthorizedKeysFile /run/sshd/authorized_keys .ssh/authorized_keys
PrintMotd no
MaxStartups 100:30:200
`

// workspaceKey is the cache key of the workspace image: a hash of its
// whole recipe.
func workspaceKey() string {
	h := sha256.New()
	for _, s := range []string{workspaceRecipe, debianSuite, workspacePackages, workspaceInit, sshdConfig} {
		fmt.Fprintf(h, "%d:%s", len(s), s)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// workspaceImage returns the cached workspace archive, building it first
// when the cache has none for the current recipe: debootstrap's first
// stage downloads and unpacks Debian packages from the mirror apt uses
// here; its second stage (the packages' maintainer scripts) runs chrooted
// in new mount, PID and network namespaces, so nothing it starts can
// listen on the host, outlive it, or leave a mount behind. What differs
// between two builds of the same package versions (host keys, logs, apt
// caches, password-change dates, mtimes) is removed or fixed.
func workspaceImage(ctx context.Context, work, cache string, progress io.Writer) (Archive, error) {
	names := []string{Workspace}
	path := filepath.Join(cache, "workspace-"+workspaceKey()+".tar")
	if exists(path) {
		return Archive{Path: path, Names: names}, nil
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return Archive{}, ErrNoDebootstrap
	}
	pruneArchives(cache, "workspace")
	mirror := debianMirror("/etc/apt", debianSuite)
	fmt.Fprintf(progress, "labkeep: building image %s (once, about a minute; debootstrap %s from %s)\n", Workspace, debianSuite, mirror)
	root := filepath.Join(work, "workspace-root")
	if err := debootstrap(ctx, root, mirror, workspacePackages); err != nil {
		return Archive{}, err
	}
	if err := normalizeRootfs(root); err != nil {
		return Archive{}, err
	}
	cfg := v1.Config{
		Entrypoint: []string{"/usr/local/sbin/labkeep-workspace"},
		WorkingDir: "/root",
		Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"},
		ExposedPorts: map[string]struct{}{
			"22/tcp": {},
		},
	}
	if err := writeImage(ctx, work, root, path, cfg, names); err != nil {
		return Archive{}, err
	}
	return Archive{Path: path, Names: names}, nil
}

// debootstrap makes a minbase Debian root of debianSuite from mirror with
// the packages include (comma-separated) at root: its first stage
// downloads and unpacks the packages; its second stage (their maintainer
// scripts) runs chrooted in new mount, PID and network namespaces, so
// nothing it starts can listen on the host, outlive it, or leave a mount
// behind, with a policy-rc.d that forbids starting services (left in
// place: the caller removes it when the root is done).
func debootstrap(ctx context.Context, root, mirror, include string) error {
	if err := runBuildStep(ctx, "debootstrap", "--foreign", "--variant=minbase", "--include="+include, debianSuite, root, mirror); err != nil {
		return err
	}
	policy := filepath.Join(root, "usr/sbin/policy-rc.d")
	if err := os.WriteFile(policy, []byte("#!/bin/sh\nexit 101\n"), 0o755); err != nil {
		return err
	}
	return runBuildStep(ctx, "unshare", "--mount", "--propagation=private", "--net", "--pid", "--fork", "--kill-child",
		"chroot", root, "/debootstrap/debootstrap", "--second-stage")
}

// runBuildStep runs a command of an image build (Debian's tools
// non-interactive, in the C locale) and returns the end of its output on
// failure.
func runBuildStep(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
	if out, err := cmd.CombinedOutput(); err != nil {
		tail := string(out)
		if len(tail) > 3000 {
			tail = tail[len(tail)-3000:]
		}
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, tail)
	}
	return nil
}

// rootfsLeftovers are what a built Debian root holds that no container
// needs or that differs from build to build (globs under the root).
var rootfsLeftovers = []string{
	"usr/sbin/policy-rc.d",
	"var/cache/apt/*", "var/lib/apt/lists/*",
	"var/log/*", "var/cache/ldconfig/aux-cache",
	"var/cache/debconf/*-old", "var/lib/dpkg/*-old",
	"usr/share/doc/*", "usr/share/man/*", "usr/share/info/*",
	"dev/*", "run/*", "tmp/*", "proc/*", "sys/*",
}

// removeGlobs removes everything matching patterns under root.
func removeGlobs(root string, patterns []string) error {
	for _, pattern := range patterns {
		matches, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			return err
		}
		for _, m := range matches {
			if err := os.RemoveAll(m); err != nil {
				return err
			}
		}
	}
	return nil
}

// normalizeRootfs removes what is not needed in a container or differs
// from build to build, and adds labkeep's entrypoint and sshd settings.
func normalizeRootfs(root string) error {
	if err := removeGlobs(root, append([]string{"etc/ssh/ssh_host_*"}, rootfsLeftovers...)); err != nil {
		return err
	}
	// The days-since-epoch of the last password change would differ by
	// build date; an empty field means "aging disabled".
	shadow := filepath.Join(root, "etc/shadow")
	b, err := os.ReadFile(shadow)
	if err != nil {
		return err
	}
	lastChange := regexp.MustCompile(`(?m)^([^:\n]*:[^:\n]*:)[0-9]+:`)
	if err := os.WriteFile(shadow, lastChange.ReplaceAll(b, []byte("${1}:")), 0o640); err != nil {
		return err
	}
	for path, content := range map[string]string{
		"etc/machine-id":                     "",
		"etc/hostname":                       "workspace\n",
		"usr/local/sbin/labkeep-workspace":   workspaceInit,
		"etc/ssh/sshd_config.d/labkeep.conf": sshdConfig,
	} {
		mode := os.FileMode(0o644)
		if strings.HasPrefix(path, "usr/local/sbin/") {
			mode = 0o755
		}
		full := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(full, []byte(content), mode); err != nil {
			return err
		}
		if err := os.Chmod(full, mode); err != nil {
			return err
		}
	}
	return nil
}

// debianMirror returns the first archive URI apt uses for suite according
// to the sources under etcApt (deb822 .sources files and one-line .list
// files), or deb.debian.org when none names it.
func debianMirror(etcApt, suite string) string {
	files, _ := filepath.Glob(filepath.Join(etcApt, "sources.list.d", "*"))
	files = append([]string{filepath.Join(etcApt, "sources.list")}, files...)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if strings.HasSuffix(f, ".sources") || strings.Contains(string(b), "URIs:") {
			for _, stanza := range strings.Split(string(b), "\n\n") {
				fields := map[string]string{}
				sc := bufio.NewScanner(strings.NewReader(stanza))
				for sc.Scan() {
					if k, v, ok := strings.Cut(sc.Text(), ":"); ok && !strings.HasPrefix(k, "#") {
						fields[strings.TrimSpace(k)] = strings.TrimSpace(v)
					}
				}
				if hasWord(fields["Suites"], suite) && hasWord(fields["Types"], "deb") {
					if uris := strings.Fields(fields["URIs"]); len(uris) > 0 {
						return uris[0]
					}
				}
			}
			continue
		}
		sc := bufio.NewScanner(strings.NewReader(string(b)))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) >= 3 && f[0] == "deb" {
				if strings.HasPrefix(f[1], "[") { // options: deb [arch=amd64] URI suite
					for len(f) > 1 && !strings.HasSuffix(f[1], "]") {
						f = append(f[:1], f[2:]...)
					}
					f = append(f[:1], f[2:]...)
				}
				if len(f) >= 3 && f[2] == suite {
					return f[1]
				}
			}
		}
	}
	return "http://deb.debian.org/debian"
}

func hasWord(list, w string) bool {
	for _, f := range strings.Fields(list) {
		if f == w {
			return true
		}
	}
	return false
}
