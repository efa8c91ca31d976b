package nocloud

import (
	"bytes"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// These tests have real ISO9660 readers read what ISO writes: isoinfo and isovfy
// (genisoimage), xorriso, blkid, and the Linux kernel through a loop mount.

// needTool returns the path of a command the test needs. Outside CI a missing one skips the
// test; under CI, which installs them, it fails it.
func needTool(t *testing.T, name, debianPackage string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s is not installed (Debian package %s); CI must install it", name, debianPackage)
	}
	t.Skipf("%s is not installed (Debian package %s)", name, debianPackage)
	return ""
}

func run(t *testing.T, name string, args ...string) (stdout []byte, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out.String(), errb.String())
	}
	return out.Bytes(), errb.String()
}

// toolSeeds are the seeds every tool reads: the typical one, an empty user data, and user data
// that fills whole sectors or spills into the next one.
func toolSeeds(t *testing.T) []struct {
	name string
	seed Seed
} {
	rnd := rand.New(rand.NewPCG(1, 2))
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rnd.Uint32())
		}
		return b
	}
	with := func(userData []byte) Seed { s := fullSeed(t); s.UserData = userData; return s }
	return []struct {
		name string
		seed Seed
	}{
		{"typical", fullSeed(t)},
		{"empty user data, no keys", Seed{InstanceID: "i-empty", Hostname: "empty"}},
		{"user data of one sector", with(random(2048))},
		{"user data of 32 KiB", with(random(32 << 10))},
		{"user data of 32 KiB plus one", with(random(32<<10 + 1))},
	}
}

// writeSeed writes the seed's image to a file and returns its path and the files it must hold.
func writeSeed(t *testing.T, s Seed) (string, map[string][]byte) {
	t.Helper()
	img, err := s.ISO()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "seed.iso")
	if err := os.WriteFile(path, img, 0o644); err != nil {
		t.Fatal(err)
	}
	files, err := s.files()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{}
	for _, f := range files {
		want[f.name] = f.data
	}
	return path, want
}

var isoinfoName = regexp.MustCompile(`\]\s+(\S+)\s*$`)

// isoinfoNames are the names of an isoinfo -l listing, without . and ..
func isoinfoNames(listing []byte) []string {
	var names []string
	for line := range strings.Lines(string(listing)) {
		if m := isoinfoName.FindStringSubmatch(line); m != nil && m[1] != "." && m[1] != ".." {
			names = append(names, m[1])
		}
	}
	return names
}

func TestIsoinfo(t *testing.T) {
	isoinfo := needTool(t, "isoinfo", "genisoimage")
	for _, tt := range toolSeeds(t) {
		t.Run(tt.name, func(t *testing.T) {
			path, want := writeSeed(t, tt.seed)

			desc, _ := run(t, isoinfo, "-d", "-i", path)
			for _, line := range []string{"Volume id: cidata", "Logical block size is: 2048", "Joliet with UCS level 3 found", "Rock Ridge signatures version 1 found"} {
				if !strings.Contains(string(desc), line+"\n") {
					t.Errorf("isoinfo -d lacks %q:\n%s", line, desc)
				}
			}

			for _, ext := range []struct{ flag, want string }{
				{"-R", "meta-data user-data vendor-data"},
				{"-J", "meta-data user-data vendor-data"},
				{"", "META_DAT.;1 USER_DAT.;1 VENDOR_D.;1"},
			} {
				args := slices.DeleteFunc([]string{ext.flag, "-l", "-i", path}, func(s string) bool { return s == "" })
				listing, _ := run(t, isoinfo, args...)
				if got := strings.Join(isoinfoNames(listing), " "); got != ext.want {
					t.Errorf("isoinfo %s -l: names %q, want %q\n%s", ext.flag, got, ext.want, listing)
				}
			}

			for _, flag := range []string{"-R", "-J"} {
				for name, data := range want {
					got, _ := run(t, isoinfo, flag, "-x", "/"+name, "-i", path)
					if !bytes.Equal(got, data) {
						t.Errorf("isoinfo %s -x /%s: %d bytes differ from the %d written", flag, name, len(got), len(data))
					}
				}
			}
		})
	}
}

// TestIsovfy runs genisoimage's structure checker, which looks at what listing does not:
// path tables against directories, and record placement.
func TestIsovfy(t *testing.T) {
	isovfy := needTool(t, "isovfy", "genisoimage")
	for _, tt := range toolSeeds(t) {
		t.Run(tt.name, func(t *testing.T) {
			path, _ := writeSeed(t, tt.seed)
			out, _ := run(t, isovfy, "-i", path)
			if !strings.Contains(string(out), "No errors found") {
				t.Errorf("isovfy:\n%s", out)
			}
		})
	}
}

func TestXorriso(t *testing.T) {
	xorriso := needTool(t, "xorriso", "xorriso")
	for _, tt := range toolSeeds(t) {
		t.Run(tt.name, func(t *testing.T) {
			path, want := writeSeed(t, tt.seed)
			out := filepath.Join(t.TempDir(), "out")
			// -report_about WARNING makes xorriso print every complaint it has about the image.
			stdout, stderr := run(t, xorriso, "-report_about", "WARNING", "-indev", path,
				"-pvd_info", "-toc", "-ls", "/", "--", "-osirrox", "on", "-extract", "/", out)
			if regexp.MustCompile(`(WARNING|SORRY|FAILURE|FATAL|ABORT)`).MatchString(stderr) {
				t.Errorf("xorriso complained:\n%s", stderr)
			}
			for _, line := range []string{"Volume Id    : cidata\n", "ISO offers   : Rock_Ridge Joliet", "ISO loaded   : Rock_Ridge", "'meta-data'\n'user-data'\n'vendor-data'\n"} {
				if !strings.Contains(string(stdout), line) {
					t.Errorf("xorriso output lacks %q:\n%s", line, stdout)
				}
			}
			compareDir(t, out, want)
		})
	}
}

func TestBlkid(t *testing.T) {
	blkid := needTool(t, "blkid", "util-linux")
	path, _ := writeSeed(t, fullSeed(t))
	// -c /dev/null: no cache, probe the file now.
	out, _ := run(t, blkid, "-c", "/dev/null", path)
	for _, tag := range []string{`LABEL="cidata"`, `TYPE="iso9660"`} {
		if !strings.Contains(string(out), tag) {
			t.Errorf("blkid lacks %s: %s", tag, out)
		}
	}
}

// compareDir checks that dir holds exactly the files of want, byte for byte.
func compareDir(t *testing.T, dir string, want map[string][]byte) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "meta-data user-data vendor-data" {
		t.Errorf("%s holds %q", dir, names)
	}
	for name, data := range want {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Error(err)
			continue
		}
		if !bytes.Equal(got, data) {
			t.Errorf("%s: %d bytes differ from the %d written", name, len(got), len(data))
		}
	}
}

// kernelHasISO9660 reports whether the running kernel can mount iso9660, loading the module
// if it can.
func kernelHasISO9660() bool {
	has := func() bool {
		b, _ := os.ReadFile("/proc/filesystems")
		return regexp.MustCompile(`(?m)\siso9660$`).Match(b)
	}
	if has() {
		return true
	}
	_ = exec.Command("modprobe", "isofs").Run()
	return has()
}

// TestMount is the reader that matters most: Linux's isofs, as in the guest. It mounts with
// Rock Ridge (the default), and with norock to read the Joliet tree.
func TestMount(t *testing.T) {
	mount := needTool(t, "mount", "mount")
	umount := needTool(t, "umount", "mount")
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("mounting needs root, and CI runs as root")
		}
		t.Skip("mounting needs root")
	}
	if !kernelHasISO9660() {
		// No package installs a kernel module into this kernel: CI skips here too.
		t.Skip("the running kernel has no iso9660 file system (not in /proc/filesystems; modprobe isofs failed)")
	}
	for _, tt := range toolSeeds(t) {
		for _, opts := range []string{"loop,ro", "loop,ro,norock"} {
			t.Run(tt.name+"/"+opts, func(t *testing.T) {
				path, want := writeSeed(t, tt.seed)
				dir := t.TempDir()
				run(t, mount, "-o", opts, "-t", "iso9660", path, dir)
				t.Cleanup(func() {
					if out, err := exec.Command(umount, dir).CombinedOutput(); err != nil {
						t.Errorf("umount: %v\n%s", err, out)
					}
				})
				compareDir(t, dir, want)
			})
		}
	}
}
