package images

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/crypto/ssh"

	"labkeep/localrun/controlplane"
)

// The guest disk image (built once into the real binary cache, as `make
// test` and `make run` use it) is a containerDisk as KubeVirt reads it, and
// its disk boots under QEMU's software emulation the way a KubeVirt VM
// starts it: a qcow2 overlay backed by the image's disk, virtio disks and
// NIC, the cloud-init NoCloud ISO KubeVirt makes (xorrisofs with its flags)
// holding user data shaped like labkeep's (root's authorized key, the
// session's ed25519 host key, files), DHCP on the addresses of KubeVirt's
// masquerade binding, and the guest agent's channel. The serial console
// shows a login prompt; root logs in over SSH with the session's key,
// verified against the session's host key, and with no other key; the
// guest agent answers and replaces root's keys as KubeVirt's
// accessCredentials do.
func TestGuestDiskBootsWithCloudInit(t *testing.T) {
	for _, tool := range []string{"qemu-system-x86_64", "qemu-img", "xorrisofs", "ssh"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not installed (localrun/setup.sh test installs it): %v", tool, err)
		}
	}
	a := guestDiskArchive(t)
	dir := t.TempDir()
	base := extractGuestDisk(t, a, dir)

	// What virt-handler checks (qemu-img info: a qcow2 without backing
	// file) and virt-launcher does (a qcow2 overlay backed by the disk)
	// before QEMU starts.
	type diskInfo struct {
		Format      string `json:"format"`
		BackingFile string `json:"backing-filename"`
		VirtualSize int64  `json:"virtual-size"`
	}
	var info diskInfo
	if err := json.Unmarshal(mustRun(t, "qemu-img", "info", "--output", "json", base), &info); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(diskInfo{"qcow2", "", 4 << 30}, info); diff != "" {
		t.Errorf("qemu-img info of %s (-want +got):\n%s", GuestDiskPath, diff)
	}
	overlay := filepath.Join(dir, "disk_0.qcow2")
	mustRun(t, "qemu-img", "create", "-f", "qcow2", "-b", base, "-F", "qcow2", overlay)

	hostSeed := sha256.Sum256([]byte("labkeep guest disk test host key"))
	hostPriv, hostPub := sshKey(t, dir, "host", hostSeed[:])
	sessionKey, sessionPub := sshKey(t, dir, "session", nil)
	otherKey, _ := sshKey(t, dir, "other", nil)
	agentKey, agentPub := sshKey(t, dir, "agent", nil)
	const hostname, sessionID = "lab-node", "s-guestdisk-test"
	var ud strings.Builder
	ud.WriteString("#cloud-config\n")
	fmt.Fprintf(&ud, "hostname: %s\n", hostname)
	ud.WriteString("disable_root: false\nssh_pwauth: false\n")
	fmt.Fprintf(&ud, "ssh_authorized_keys:\n  - %q\n", sessionPub)
	ud.WriteString("ssh_deletekeys: true\nssh_keys:\n")
	fmt.Fprintf(&ud, "  ed25519_private: %q\n  ed25519_public: %q\n", hostPriv, hostPub)
	fmt.Fprintf(&ud, "write_files:\n  - path: /etc/labkeep/session\n    permissions: '0644'\n    content: %q\n", sessionID+"\n")
	seed := noCloudISO(t, dir, ud.String(), fmt.Sprintf(`{"instance-id":"%s.default","local-hostname":"%s"}`, hostname, hostname))

	g := bootGuest(t, dir, overlay, seed, hostPub)
	prompt := g.waitSerial(t, regexp.MustCompile(`(?m)^`+hostname+` login: `), 15*time.Minute)
	t.Logf("boot to the serial console's login prompt: %s", prompt.Round(time.Second))
	ready := g.waitSSH(t, sessionKey, 10*time.Minute)
	t.Logf("boot to root over SSH: %s", ready.Round(time.Second))

	t.Run("keys", func(t *testing.T) {
		for _, tc := range []struct {
			name, key string
			ok        bool
		}{
			{"session key", sessionKey, true},
			{"other key", otherKey, false},
		} {
			t.Run(tc.name, func(t *testing.T) { g.checkLogin(t, tc.key, tc.ok) })
		}
	})

	t.Run("system", func(t *testing.T) {
		for _, tc := range []struct {
			cmd, want string
		}{
			{"timeout 300 cloud-init status --wait >/dev/null; cloud-init status", "status: done"},
			{"id -u", "0"},
			{"hostname", hostname},
			{"cat /etc/labkeep/session", sessionID},
			{"systemctl is-system-running --wait", "running"},
			{"systemctl is-active qemu-guest-agent ssh", "active\nactive"},
			{"ip -4 -o addr show scope global | awk '{print $4}'", "10.0.2.2/24"},
			{"findmnt -rno FSTYPE,OPTIONS / | cut -d, -f1", "ext4 rw"},
			{"cat /etc/ssh/ssh_host_ed25519_key.pub | cut -d' ' -f1-2", hostPub},
			{"ls /etc/ssh/ | grep host", "ssh_host_ed25519_key\nssh_host_ed25519_key.pub"},
			{"sshd -T | grep -E '^(permitrootlogin|passwordauthentication) '", "permitrootlogin without-password\npasswordauthentication no"},
		} {
			t.Run(tc.cmd, func(t *testing.T) {
				out, err := g.ssh(sessionKey, tc.cmd)
				if diff := cmp.Diff(tc.want, strings.TrimSpace(out)); diff != "" {
					t.Errorf("%s (err %v) (-want +got):\n%s", tc.cmd, err, diff)
				}
			})
		}
		if out, err := g.ssh(sessionKey, "systemd-analyze time; systemd-analyze blame | head -12"); err == nil {
			t.Logf("guest boot:\n%s", out)
		}
		out, err := g.ssh(sessionKey, "df -B1M --output=avail / | tail -1")
		if mib, _ := strconv.Atoi(strings.TrimSpace(out)); err != nil || mib < 3000 {
			t.Errorf("free space on / = %q MiB (err %v), want at least 3000", out, err)
		}
	})

	t.Run("guest agent", func(t *testing.T) {
		ag := dialAgent(t, g.agentSock, 2*time.Minute)
		var pong struct{}
		ag.call(t, "guest-ping", nil, &pong)
		var gi struct {
			Version  string `json:"version"`
			Commands []struct {
				Name    string `json:"name"`
				Enabled bool   `json:"enabled"`
			} `json:"supported_commands"`
		}
		ag.call(t, "guest-info", nil, &gi)
		enabled := map[string]bool{}
		for _, c := range gi.Commands {
			enabled[c.Name] = c.Enabled
		}
		// KubeVirt 1.7's virt-handler reports the agent unsupported without
		// the first list, and propagates SSH keys with the second (or the
		// guest-exec/guest-file-* fallback).
		var missing []string
		for _, c := range slices.Concat(kubevirtAgentCommands, kubevirtSSHAgentCommands) {
			if !enabled[c] {
				missing = append(missing, c)
			}
		}
		if len(missing) > 0 {
			t.Errorf("guest agent %s lacks or disables %v", gi.Version, missing)
		}
		// libvirt's AuthorizedSSHKeysSet without flags, as KubeVirt calls
		// it: root's keys become exactly these.
		ag.call(t, "guest-ssh-add-authorized-keys", map[string]any{"username": "root", "keys": []string{agentPub}, "reset": true}, nil)
		var keys struct {
			Keys []string `json:"keys"`
		}
		ag.call(t, "guest-ssh-get-authorized-keys", map[string]any{"username": "root"}, &keys)
		if diff := cmp.Diff([]string{agentPub}, keys.Keys); diff != "" {
			t.Errorf("root's keys after the agent set them (-want +got):\n%s", diff)
		}
		for _, tc := range []struct {
			name, key string
			ok        bool
		}{
			{"agent key", agentKey, true},
			{"session key replaced", sessionKey, false},
		} {
			t.Run(tc.name, func(t *testing.T) { g.checkLogin(t, tc.key, tc.ok) })
		}
	})
}

// KubeVirt 1.7's lists of guest agent commands (pkg/virt-handler/guestagent.go):
// required for a supported agent, and for SSH keys by the agent.
var (
	kubevirtAgentCommands = []string{"guest-ping", "guest-get-time", "guest-info", "guest-shutdown",
		"guest-network-get-interfaces", "guest-get-fsinfo", "guest-get-host-name", "guest-get-users",
		"guest-get-timezone", "guest-get-osinfo"}
	kubevirtSSHAgentCommands = []string{"guest-ssh-get-authorized-keys", "guest-ssh-add-authorized-keys",
		"guest-ssh-remove-authorized-keys"}
)

// guestDiskArchive builds (or takes from the real binary cache) the guest
// disk archive under the cache's lock, as Build takes it, and checks that a
// build left no loop device behind.
func guestDiskArchive(t *testing.T) Archive {
	t.Helper()
	bin, err := controlplane.DefaultCacheDir(os.Getenv("LABKEEP_BIN_CACHE"))
	if err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(bin, "images")
	if err := os.MkdirAll(cache, 0o755); err != nil {
		t.Fatal(err)
	}
	lock, err := controlplane.LockFile(filepath.Join(cache, ".lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	work := t.TempDir()
	start := time.Now()
	var progress strings.Builder
	a, err := GuestDisk(context.Background(), work, cache, &progress)
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	if progress.Len() > 0 {
		t.Logf("built in %s:\n%s", time.Since(start).Round(time.Second), progress.String())
	}
	if st, err := os.Stat(a.Path); err == nil {
		t.Logf("archive %s: %d MiB", filepath.Base(a.Path), st.Size()>>20)
	}
	if diff := cmp.Diff([]string{GuestDebian}, a.Names); diff != "" {
		t.Errorf("names (-want +got):\n%s", diff)
	}
	// The kernel detaches an autoclear loop device a moment after its last
	// user goes.
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := loopDevicesUnder(t, work)
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("loop devices left attached to the build's files: %v", left)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return a
}

// loopDevicesUnder lists the loop devices whose backing file is under dir.
func loopDevicesUnder(t *testing.T, dir string) []string {
	t.Helper()
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var left []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), dir+"/") {
			left = append(left, strings.Split(f, "/")[3]+" "+strings.TrimSpace(string(b)))
		}
	}
	return left
}

// extractGuestDisk checks the image's layout (one layer holding the disk
// alone, readable by KubeVirt's uid 107; no entrypoint) and writes its disk
// into dir.
func extractGuestDisk(t *testing.T, a Archive, dir string) string {
	t.Helper()
	img := load(t, a, GuestDebian)
	if diff := cmp.Diff(map[string]os.FileMode{GuestDiskPath: 0o444}, files(t, img)); diff != "" {
		t.Errorf("files (-want +got):\n%s", diff)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if len(cf.Config.Entrypoint)+len(cf.Config.Cmd) > 0 || cf.OS != "linux" {
		t.Errorf("config: entrypoint %q, cmd %q, os %q; want none, none, linux", cf.Config.Entrypoint, cf.Config.Cmd, cf.OS)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers (%v), want 1", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	out := filepath.Join(dir, "base.qcow2")
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			t.Fatalf("no %s in the layer", GuestDiskPath)
		}
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Clean("/"+h.Name) != GuestDiskPath {
			continue
		}
		f, err := os.Create(out)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(f, tr); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d MiB", GuestDiskPath, h.Size>>20)
		return out
	}
}

// mustRun runs a command and returns its standard output, failing the test
// when it fails.
func mustRun(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	var stderr strings.Builder
	cmd := exec.Command(name, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// sshKey writes an ed25519 private key (from seed, or a fresh one when seed
// is nil) to dir/name in OpenSSH's format and returns its path and its
// public key as an authorized_keys line without comment. For the host key
// it returns the private key's PEM instead of a path.
func sshKey(t *testing.T, dir, name string, seed []byte) (string, string) {
	t.Helper()
	var priv ed25519.PrivateKey
	if seed != nil {
		priv = ed25519.NewKeyFromSeed(seed)
	} else {
		var err error
		if _, priv, err = ed25519.GenerateKey(rand.Reader); err != nil {
			t.Fatal(err)
		}
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	pub, err := ssh.NewPublicKey(priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub)))
	if seed != nil {
		return string(pem.EncodeToMemory(block)), line
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, line
}

// noCloudISO makes the NoCloud seed as KubeVirt 1.7's virt-launcher makes
// it for a cloudInitNoCloud volume (pkg/cloud-init: xorrisofs, volume id
// cidata, Joliet and Rock Ridge).
func noCloudISO(t *testing.T, dir, userData, metaData string) string {
	t.Helper()
	src := filepath.Join(dir, "noCloud")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{"user-data": userData, "meta-data": metaData} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	iso := filepath.Join(dir, "noCloud.iso")
	mustRun(t, "xorrisofs", "-output", iso, "-volid", "cidata", "-joliet", "-rock", "-partition_cyl_align", "on", src)
	return iso
}

// guest is a booted VM.
type guest struct {
	dir, serial, agentSock, knownHosts string
	port                               int
	start                              time.Time
}

// bootGuest starts QEMU under TCG on the overlay and the seed, its serial
// console to a file, SSH forwarded from a free local port, the guest
// agent's channel on a unix socket, and kills it when the test ends.
func bootGuest(t *testing.T, dir, overlay, seed, hostPub string) *guest {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &guest{
		dir:        dir,
		serial:     filepath.Join(dir, "serial.log"),
		agentSock:  filepath.Join(dir, "qga.sock"),
		knownHosts: filepath.Join(dir, "known_hosts"),
		port:       l.Addr().(*net.TCPAddr).Port,
	}
	l.Close()
	if err := os.WriteFile(g.knownHosts, []byte(fmt.Sprintf("[127.0.0.1]:%d %s\n", g.port, hostPub)), 0o644); err != nil {
		t.Fatal(err)
	}
	qemuLog, err := os.Create(filepath.Join(dir, "qemu.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("qemu-system-x86_64",
		"-machine", "q35", "-accel", "tcg", "-m", "1024", "-smp", "1", "-nographic", "-monitor", "none",
		"-serial", "file:"+g.serial,
		"-drive", "if=none,id=root,format=qcow2,file="+overlay, "-device", "virtio-blk-pci,drive=root,bootindex=1",
		"-drive", "if=none,id=cloudinit,format=raw,readonly=on,file="+seed, "-device", "virtio-blk-pci,drive=cloudinit",
		// The addresses of KubeVirt's masquerade binding: the guest gets
		// 10.0.2.2/24 by DHCP, the gateway is 10.0.2.1.
		"-netdev", fmt.Sprintf("user,id=net0,net=10.0.2.0/24,host=10.0.2.1,dhcpstart=10.0.2.2,hostfwd=tcp:127.0.0.1:%d-:22", g.port),
		"-device", "virtio-net-pci,netdev=net0",
		"-chardev", "socket,id=qga0,server=on,wait=off,path="+g.agentSock,
		"-device", "virtio-serial-pci", "-device", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0",
	)
	cmd.Stdout, cmd.Stderr = qemuLog, qemuLog
	g.start = time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); qemuLog.Close(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(qemuLog.Name())
			t.Logf("qemu output:\n%s\nserial console (end):\n%s", b, fileTail(g.serial, 6000))
		}
	})
	return g
}

func fileTail(path string, n int) string {
	b, _ := os.ReadFile(path)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// waitSerial waits until the serial console's output matches re and
// returns the time since QEMU started.
func (g *guest) waitSerial(t *testing.T, re *regexp.Regexp, timeout time.Duration) time.Duration {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		b, _ := os.ReadFile(g.serial)
		if re.Match(b) {
			return time.Since(g.start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q on the serial console within %s", re, timeout)
		}
		time.Sleep(time.Second)
	}
}

// ssh runs cmd in the guest as root with the private key at key,
// verifying the host key against the session's, and returns its output
// (standard error after standard output).
func (g *guest) ssh(key, cmd string) (string, error) {
	c := exec.Command("ssh", "-F", "/dev/null", "-i", key, "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
		"-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile="+g.knownHosts,
		"-o", "GlobalKnownHostsFile=/dev/null", "-o", "ConnectTimeout=20", "-o", "LogLevel=ERROR",
		"-p", strconv.Itoa(g.port), "root@127.0.0.1", cmd)
	var stdout, stderr strings.Builder
	c.Stdout, c.Stderr = &stdout, &stderr
	err := c.Run()
	return stdout.String() + stderr.String(), err
}

// waitSSH waits until root logs in with key and returns the time since
// QEMU started.
func (g *guest) waitSSH(t *testing.T, key string, timeout time.Duration) time.Duration {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		out, err := g.ssh(key, "id -u")
		if err == nil && strings.TrimSpace(out) == "0" {
			return time.Since(g.start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no SSH login as root within %s: %v\n%s", timeout, err, out)
		}
		time.Sleep(2 * time.Second)
	}
}

// checkLogin checks that root logs in with key (ok) or that the server
// refuses the key.
func (g *guest) checkLogin(t *testing.T, key string, ok bool) {
	t.Helper()
	out, err := g.ssh(key, "id -u")
	switch {
	case ok && (err != nil || strings.TrimSpace(out) != "0"):
		t.Errorf("login with %s: %v\n%s", filepath.Base(key), err, out)
	case !ok && (err == nil || !strings.Contains(out, "Permission denied (publickey)")):
		t.Errorf("login with %s was not refused: %v\n%s", filepath.Base(key), err, out)
	}
}

// agent is a connection to the guest agent (QEMU guest agent protocol:
// JSON commands and replies on the virtio-serial channel).
type agent struct {
	conn net.Conn
	dec  *json.Decoder
}

// dialAgent connects to the agent's socket and synchronizes with
// guest-sync (a reply with a fresh id: anything before it is stale),
// retrying until timeout while the agent does not answer.
func dialAgent(t *testing.T, sock string, timeout time.Duration) *agent {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for id := time.Now().UnixNano() % 1e9; ; id++ {
		a, err := syncAgent(sock, id)
		if err == nil {
			t.Cleanup(func() { a.conn.Close() })
			return a
		}
		if time.Now().After(deadline) {
			t.Fatalf("guest agent on %s: %v", sock, err)
		}
		time.Sleep(time.Second)
	}
}

func syncAgent(sock string, id int64) (*agent, error) {
	conn, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		return nil, err
	}
	a := &agent{conn: conn, dec: json.NewDecoder(bufio.NewReader(conn))}
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(conn, `{"execute":"guest-sync","arguments":{"id":%d}}`+"\n", id); err != nil {
		conn.Close()
		return nil, err
	}
	for {
		var reply struct {
			Return *int64 `json:"return"`
		}
		if err := a.dec.Decode(&reply); err != nil {
			conn.Close()
			return nil, err
		}
		if reply.Return != nil && *reply.Return == id {
			conn.SetDeadline(time.Time{})
			return a, nil
		}
	}
}

// call runs one agent command and decodes its return value into out (nil:
// ignored), failing the test on an error reply.
func (a *agent) call(t *testing.T, cmd string, args any, out any) {
	t.Helper()
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	a.conn.SetDeadline(time.Now().Add(30 * time.Second))
	defer a.conn.SetDeadline(time.Time{})
	if err := json.NewEncoder(a.conn).Encode(req); err != nil {
		t.Fatalf("%s: %v", cmd, err)
	}
	var reply struct {
		Return json.RawMessage `json:"return"`
		Error  *struct {
			Class string `json:"class"`
			Desc  string `json:"desc"`
		} `json:"error"`
	}
	if err := a.dec.Decode(&reply); err != nil {
		t.Fatalf("%s: %v", cmd, err)
	}
	if reply.Error != nil {
		t.Fatalf("%s: %s: %s", cmd, reply.Error.Class, reply.Error.Desc)
	}
	if out != nil {
		if err := json.Unmarshal(reply.Return, out); err != nil {
			t.Fatalf("%s: %v in %s", cmd, err, reply.Return)
		}
	}
}

// The CHS fields of the MBR's partition entry (BIOSes without LBA read
// them): 255 heads, 63 sectors per track, saturated past cylinder 1023.
func TestCHS(t *testing.T) {
	for _, tc := range []struct {
		lba  uint32
		want []byte
	}{
		{0, []byte{0, 1, 0}},
		{guestPartStart, []byte{32, 33, 0}},
		{300 * 255 * 63, []byte{0, 1 | 1<<6, 300 & 0xff}},
		{guestDiskSize/512 - 1, []byte{42, 32 | 2<<6, 522 & 0xff}},
		{1024 * 255 * 63, []byte{254, 0xff, 0xff}},
	} {
		if diff := cmp.Diff(tc.want, chs(tc.lba)); diff != "" {
			t.Errorf("chs(%d) (-want +got):\n%s", tc.lba, diff)
		}
	}
}

// A loop device attachLoop made spans the given extent of its file and is
// gone once the returned file is closed: nothing else holds it.
func TestAttachLoopDetachesOnClose(t *testing.T) {
	file := filepath.Join(t.TempDir(), "disk.raw")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, 8<<20); err != nil {
		t.Fatal(err)
	}
	loop, err := attachLoop(file, 1<<20, 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	sys := filepath.Join("/sys/block", filepath.Base(loop.Name()), "loop")
	got := map[string]string{}
	for _, attr := range []string{"backing_file", "offset", "sizelimit", "autoclear"} {
		b, err := os.ReadFile(filepath.Join(sys, attr))
		if err != nil {
			loop.Close()
			t.Fatal(err)
		}
		got[attr] = strings.TrimSpace(string(b))
	}
	want := map[string]string{"backing_file": file, "offset": "1048576", "sizelimit": "4194304", "autoclear": "1"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("%s (-want +got):\n%s", loop.Name(), diff)
	}
	if err := loop.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(loopDevicesUnder(t, filepath.Dir(file))) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s still attached to %s after its last close", loop.Name(), file)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
