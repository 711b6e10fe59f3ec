package images

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"labkeep/localrun/controlplane"
)

// files lists the regular files of img's flattened filesystem with their
// modes.
func files(t *testing.T, img v1.Image) map[string]os.FileMode {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	got := map[string]os.FileMode{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			got[filepath.Clean("/"+h.Name)] = h.FileInfo().Mode().Perm()
		}
	}
}

func load(t *testing.T, a Archive, ref string) v1.Image {
	t.Helper()
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(a.Path, &tag)
	if err != nil {
		t.Fatalf("%s in %s: %v", ref, a.Path, err)
	}
	return img
}

// The static images hold exactly their binary, executable, as entrypoint,
// for this platform; every name is in an archive; and a rebuild from the
// same sources gives the same image digests (reproducible builds).
func TestStaticImages(t *testing.T) {
	ctx := context.Background()
	var digests [2]map[string]string
	coredns := filepath.Join(t.TempDir(), "coredns")
	if err := os.WriteFile(coredns, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range digests {
		archives, err := Build(ctx, Options{CacheDir: t.TempDir(), NoWorkspace: true, CoreDNS: coredns})
		if err != nil {
			t.Fatal(err)
		}
		names := Names(archives)
		sort.Strings(names)
		if diff := cmp.Diff([]string{Guardian, CoreDNS, Pause, VirtLauncher}, names); diff != "" {
			t.Fatalf("names (-want +got):\n%s", diff)
		}
		digests[i] = map[string]string{}
		for _, tc := range []struct {
			ref, entrypoint string
		}{
			{Pause, "/pause"},
			{VirtLauncher, "/launcher"},
			{Guardian, "/ko-app/guardian"},
			{CoreDNS, "/coredns"},
		} {
			var a Archive
			for _, x := range archives {
				for _, n := range x.Names {
					if n == tc.ref {
						a = x
					}
				}
			}
			img := load(t, a, tc.ref)
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]string{tc.entrypoint}, cf.Config.Entrypoint); diff != "" {
				t.Errorf("%s entrypoint (-want +got):\n%s", tc.ref, diff)
			}
			if cf.OS != "linux" || cf.Architecture == "" {
				t.Errorf("%s platform %s/%s", tc.ref, cf.OS, cf.Architecture)
			}
			if diff := cmp.Diff(map[string]os.FileMode{tc.entrypoint: 0o755}, files(t, img)); diff != "" {
				t.Errorf("%s files (-want +got):\n%s", tc.ref, diff)
			}
			d, err := img.Digest()
			if err != nil {
				t.Fatal(err)
			}
			digests[i][tc.ref] = d.String()
		}
	}
	if diff := cmp.Diff(digests[0], digests[1]); diff != "" {
		t.Fatalf("two builds of the same sources differ (-first +second):\n%s", diff)
	}
}

// The workspace image (built once into the real binary cache, as `make
// test` and `make run` use it) has sshd, a login shell and labkeep's
// entrypoint, and no SSH host key: every container gets its own or the
// session's.
func TestWorkspaceImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a Debian rootfs on a cold cache")
	}
	bin, err := controlplane.DefaultCacheDir(os.Getenv("LABKEEP_BIN_CACHE"))
	if err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(bin, "images")
	if err := os.MkdirAll(cache, 0o755); err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	a, err := workspaceImage(context.Background(), work, cache, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	img := load(t, a, Workspace)
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"/usr/local/sbin/labkeep-workspace"}, cf.Config.Entrypoint); diff != "" {
		t.Errorf("entrypoint (-want +got):\n%s", diff)
	}
	fs := files(t, img)
	for _, want := range []string{"/usr/sbin/sshd", "/usr/bin/bash", "/usr/bin/ssh-keygen", "/usr/local/sbin/labkeep-workspace", "/usr/bin/ps"} {
		if fs[want]&0o111 == 0 {
			t.Errorf("%s missing or not executable (mode %v)", want, fs[want])
		}
	}
	for f := range fs {
		if matched, _ := filepath.Match("/etc/ssh/ssh_host_*", f); matched {
			t.Errorf("image carries a host key: %s", f)
		}
	}
}

// The mirror is the one apt uses for the suite, in either sources format.
func TestDebianMirror(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"deb822", map[string]string{"sources.list.d/debian.sources": "Types: deb\n# http://snapshot.debian.org/x\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\nTypes: deb\nURIs: http://security.example/debian-security\nSuites: bookworm-security\n"}, "http://mirror.example/debian"},
		{"one-line with options", map[string]string{"sources.list": "# comment\ndeb [arch=amd64 signed-by=/k.gpg] http://one.example/debian bookworm main\n"}, "http://one.example/debian"},
		{"other suites only", map[string]string{"sources.list": "deb http://one.example/debian trixie main\n"}, "http://deb.debian.org/debian"},
		{"none", nil, "http://deb.debian.org/debian"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for p, c := range tc.files {
				os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755)
				if err := os.WriteFile(filepath.Join(dir, p), []byte(c), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if got := debianMirror(dir, "bookworm"); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}
