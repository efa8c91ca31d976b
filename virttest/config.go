package virttest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// stateDirs are libvirt's directories that libvirtd sees as subdirectories of Host.Dir: the
// name of that subdirectory, then the path libvirtd uses.
var stateDirs = [][2]string{
	{"run", "/run/libvirt"},
	{"lib", "/var/lib/libvirt"},
	{"cache", "/var/cache/libvirt"},
	{"logdir", "/var/log/libvirt"},
	{"etc", "/etc/libvirt"},
}

// qemuAccounts are the users and groups libvirt may be built to run QEMU as (Debian:
// libvirt-qemu, Fedora: qemu). libvirtd refuses to start when its built-in user does not
// exist, even though qemu.conf then says root, so a missing one is added to private copies of
// /etc/passwd and /etc/group.
var qemuAccounts = []string{"libvirt-qemu", "qemu"}

// prepare writes the host's configuration and directories under h.Dir and returns the shell
// script that, inside the new mount namespace, puts them in place and execs libvirtd.
func (h *Host) prepare(sockDir string) (string, error) {
	var sc script
	sc.line("set -e")
	// The new mount namespace starts as a copy of ours, including the bind mounts that pin
	// every named network namespace (/run/netns/*): left there they would keep other hosts'
	// namespaces alive until this libvirtd exits. Nothing here needs them.
	sc.line(`for f in /run/netns/*; do umount -l "$f" 2>/dev/null || true; done`)
	sc.line(`umount -l /run/netns 2>/dev/null || true`)

	// A state directory that does not exist on this machine cannot be a mount point, and
	// making it would change the machine. Its parent is overlaid instead, with the upper
	// layer in h.Dir, so the directory is made in the overlay; everything else under the
	// parent stays visible.
	overlaid := map[string]bool{}
	for _, d := range stateDirs {
		if _, err := os.Stat(d[1]); err == nil {
			continue
		}
		parent := filepath.Dir(d[1])
		if overlaid[parent] {
			continue
		}
		if fi, err := os.Stat(parent); err != nil || !fi.IsDir() {
			return "", fmt.Errorf("virttest: %s is missing, and so is its parent %s", d[1], parent)
		}
		if !filesystemSupported("overlay") {
			return "", fmt.Errorf("virttest: %s is missing and the kernel has no overlayfs to add it privately", d[1])
		}
		overlaid[parent] = true
		upper := filepath.Join(h.Dir, "overlay", strconv.Itoa(len(overlaid)), "upper")
		work := filepath.Join(h.Dir, "overlay", strconv.Itoa(len(overlaid)), "work")
		for _, p := range []string{upper, work} {
			if err := os.MkdirAll(p, 0o755); err != nil {
				return "", fmt.Errorf("virttest: %w", err)
			}
		}
		if strings.ContainsAny(upper, ",:\\") {
			return "", fmt.Errorf("virttest: temp dir %s has a character overlayfs options cannot take", h.Dir)
		}
		sc.line("mount -t overlay -o %s overlay %s", quote("lowerdir="+parent+",upperdir="+upper+",workdir="+work), quote(parent))
	}
	// Once a parent is overlaid, a path under it means the overlay, not the directory on
	// the shared filesystem, so libvirtd's files there would be invisible to the test.
	for parent := range overlaid {
		for _, p := range []string{h.Dir, sockDir} {
			if p == parent || strings.HasPrefix(p, parent+"/") {
				return "", fmt.Errorf("virttest: temp dir %s is under %s, which the mount namespace overlays; use another TempDir", p, parent)
			}
		}
	}

	for _, d := range stateDirs {
		src := filepath.Join(h.Dir, d[0])
		if err := os.MkdirAll(src, 0o755); err != nil {
			return "", fmt.Errorf("virttest: %w", err)
		}
		sc.line("mkdir -p %s", quote(d[1]))
		sc.line("mount --bind %s %s", quote(src), quote(d[1]))
	}
	if err := h.writeConfig(sockDir); err != nil {
		return "", err
	}

	for _, f := range []string{"passwd", "group"} {
		changed, err := h.addAccounts(f)
		if err != nil {
			return "", err
		}
		if changed {
			sc.line("mount --bind %s %s", quote(filepath.Join(h.Dir, f)), quote("/etc/"+f))
		}
	}

	// sysfs shows the network devices of the namespace that mounted it. With the machine's
	// /sys, libvirt would read — and, for bridge settings, write — the attributes of the
	// machine's devices whenever a name matches one in the namespace. The namespace's own
	// sysfs has no cgroup mounts, which is why qemu.conf turns cgroups off.
	// Nor does libvirt see the machine's cgroup mounts, which /proc/mounts would still list
	// under the new sysfs: it would take cgroups for available, fail to find them under /sys,
	// and, on reconnecting to a running guest after a restart, kill the guest for it.
	sc.line(`awk '$3 ~ /^cgroup/ {print $2}' /proc/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done`)
	// In the machine's network namespace its /sys is already the right one (and the kernel
	// refuses a second sysfs of one namespace); the cgroup mounts above are gone from it all
	// the same.
	if !h.opts.HostNetwork {
		sc.line("mount -t sysfs sysfs /sys")
	}
	sc.line("exec %s --config %s --pid-file %s", quote(h.bins.libvirtd),
		quote(filepath.Join(h.Dir, "etc", "libvirtd.conf")), quote(filepath.Join(h.Dir, "libvirtd.pid")))
	return sc.String(), nil
}

// writeConfig makes the private /etc/libvirt: the machine's top-level configuration files,
// then libvirtd.conf and qemu.conf replaced by ours. Subdirectories (the machine's own domain,
// network and storage definitions) are not copied: this daemon starts with none.
func (h *Host) writeConfig(sockDir string) error {
	etc := filepath.Join(h.Dir, "etc")
	if entries, err := os.ReadDir("/etc/libvirt"); err == nil {
		for _, e := range entries {
			if !e.Type().IsRegular() {
				continue
			}
			b, err := os.ReadFile(filepath.Join("/etc/libvirt", e.Name()))
			if err != nil {
				return fmt.Errorf("virttest: copy /etc/libvirt: %w", err)
			}
			if err := os.WriteFile(filepath.Join(etc, e.Name()), b, 0o644); err != nil {
				return fmt.Errorf("virttest: copy /etc/libvirt: %w", err)
			}
		}
	}
	libvirtd := fmt.Sprintf(`# Written by virttest for a private libvirtd.
# Sockets on the shared filesystem, where the test process (outside the mount namespace)
# reaches them. Only root can enter the 0700 directory they are in.
unix_sock_dir = %q
unix_sock_group = "root"
unix_sock_ro_perms = "0770"
unix_sock_rw_perms = "0770"
unix_sock_admin_perms = "0700"
auth_unix_ro = "none"
auth_unix_rw = "none"
# A UUID of its own rather than the machine's SMBIOS one (dmidecode needs /dev/mem), so two
# hosts never look like the same machine.
host_uuid = %q
log_outputs = "%d:file:%s"
`, sockDir, randomUUID(), h.opts.LogLevel, h.LogPath)

	qemu := `# Written by virttest for a private libvirtd.
# QEMU runs as root with no security driver and no per-domain namespaces: the whole daemon is
# already confined to its own network and mount namespaces, and none of it is exposed.
user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
namespaces = [ ]
# The private /sys has no cgroup mounts, and cgroups made under the machine's hierarchy would
# be a change outside the namespaces.
cgroup_controllers = [ ]
# QEMU writes its output straight to /var/log/libvirt/qemu/<domain>.log (in Host.Dir), so no
# virtlogd has to be started, watched and stopped next to libvirtd.
stdio_handler = "file"
`
	for name, content := range map[string]string{"libvirtd.conf": libvirtd, "qemu.conf": qemu} {
		if err := os.WriteFile(filepath.Join(etc, name), []byte(content), 0o644); err != nil {
			return fmt.Errorf("virttest: write %s: %w", name, err)
		}
	}
	return nil
}

// addAccounts copies /etc/<file> (passwd or group) to h.Dir with the QEMU accounts it lacks
// added, and reports whether any was added (if not, the machine's file is used as it is).
func (h *Host) addAccounts(file string) (bool, error) {
	orig, err := os.ReadFile(filepath.Join("/etc", file))
	if err != nil {
		return false, fmt.Errorf("virttest: %w", err)
	}
	names := map[string]bool{}
	ids := map[int]bool{}
	sc := bufio.NewScanner(bytes.NewReader(orig))
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) < 3 {
			continue
		}
		names[fields[0]] = true
		if id, err := strconv.Atoi(fields[2]); err == nil {
			ids[id] = true
		}
	}
	out := bytes.TrimRight(orig, "\n")
	out = append(out, '\n')
	changed := false
	id := 64055 // the ID Debian gives libvirt-qemu; any free one will do
	for _, name := range qemuAccounts {
		if names[name] {
			continue
		}
		for ids[id] {
			id++
		}
		ids[id] = true
		if file == "passwd" {
			out = fmt.Appendf(out, "%s:x:%d:%d:virttest QEMU user:/nonexistent:/usr/sbin/nologin\n", name, id, id)
		} else {
			out = fmt.Appendf(out, "%s:x:%d:\n", name, id)
		}
		changed = true
	}
	if !changed {
		return false, nil
	}
	if err := os.WriteFile(filepath.Join(h.Dir, file), out, 0o644); err != nil {
		return false, fmt.Errorf("virttest: %w", err)
	}
	return true, nil
}

func filesystemSupported(fs string) bool {
	b, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && f[len(f)-1] == fs {
			return true
		}
	}
	return false
}

// script accumulates shell lines.
type script struct{ b strings.Builder }

func (s *script) line(format string, args ...any) {
	fmt.Fprintf(&s.b, format, args...)
	s.b.WriteByte('\n')
}

func (s *script) String() string { return s.b.String() }

// quote quotes s for sh.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
