#!/bin/sh
# build-busybox.sh — the "busybox" guest image: a Debian kernel and a busybox initramfs that
# boots in seconds under QEMU TCG, with no root disk (guest/README.md).
#
# Usage: guest/build-busybox.sh [OUTDIR]          (default OUTDIR: ./images/busybox)
#
# Outputs, each written to a temporary name and renamed into place:
#   OUTDIR/vmlinuz      the kernel of Debian's linux-image-amd64 (the package it depends on)
#   OUTDIR/initrd.img   gzip'd newc cpio: /bin/busybox (busybox-static) and its applet links,
#                       guest/busybox/init as /init, the udhcpc script, the acpid power button
#                       handler, and the kernel modules listed below with everything they
#                       depend on (from that kernel's modules.dep), loaded in order by /init.
# Boot: qemu -kernel vmlinuz -initrd initrd.img -append console=ttyS0 (nothing else needed).
#
# The kernel package is fetched with `apt-get download` (only if `apt-get update` is needed
# first is that run) and unpacked with dpkg-deb -x into OUTDIR/../cache/kernel; the host's
# /boot and /lib/modules are not used. busybox is the host's /bin/busybox from busybox-static.
# Runs as any user who can run apt-get download (the archive's files are owned by root).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$PWD/images/busybox}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cache=$(dirname "$out")/cache/kernel
busybox=${BUSYBOX:-/bin/busybox}

# What the guest needs: virtio PCI devices, virtio NIC and disks, the seed on a virtio disk or an
# IDE/SATA/SCSI cdrom (ISO9660, Joliet, Rock Ridge), the ACPI power button as an input event.
MODULES="virtio virtio_ring virtio_pci virtio_pci_modern_dev virtio_pci_legacy_dev
virtio_net net_failover failover virtio_blk virtio_scsi scsi_mod scsi_common sd_mod sr_mod cdrom
isofs libata ata_piix ahci libahci button evdev"

log() { printf 'build-busybox: %s\n' "$*"; }
die() { printf 'build-busybox: %s\n' "$*" >&2; exit 1; }

[ -x "$busybox" ] || die "$busybox not found (apt-get install busybox-static)"
"$busybox" --list | grep -qx udhcpc || die "$busybox has no udhcpc: not busybox-static?"
for t in apt-get apt-cache dpkg-deb depmod cpio gzip; do
	command -v "$t" >/dev/null || PATH=$PATH:/usr/sbin:/sbin command -v "$t" >/dev/null || die "$t not found"
done
PATH=$PATH:/usr/sbin:/sbin

# The kernel: the package linux-image-amd64 depends on, e.g. linux-image-6.1.0-56-amd64.
kpkg_of() { apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)$/\1/p' | head -n 1; }
kpkg=$(kpkg_of)
if [ -z "$kpkg" ]; then
	log "apt knows no linux-image-amd64: apt-get update"
	apt-get update -q
	kpkg=$(kpkg_of)
	[ -n "$kpkg" ] || die "no kernel package for linux-image-amd64"
fi
kver=${kpkg#linux-image-}
mkdir -p "$cache"
kroot=$cache/$kpkg
if [ ! -f "$kroot/.unpacked" ]; then
	tmp=$(mktemp -d "$cache/.dl.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	log "apt-get download $kpkg"
	if ! (cd "$tmp" && apt-get download -q "$kpkg"); then
		log "download failed: apt-get update, then again"
		apt-get update -q
		(cd "$tmp" && apt-get download -q "$kpkg")
	fi
	deb=$(ls "$tmp"/*.deb)
	log "dpkg-deb -x $(basename "$deb")"
	mkdir "$tmp/root"
	dpkg-deb -x "$deb" "$tmp/root"
	# The package's postinst would run depmod; do it here, into the unpacked tree.
	log "depmod $kver"
	depmod -b "$tmp/root" "$kver"
	touch "$tmp/root/.unpacked"
	rm -rf "$kroot"
	mv "$tmp/root" "$kroot"
	rm -rf "$tmp"
	trap - EXIT
fi
moddir=$kroot/lib/modules/$kver
[ -f "$moddir/modules.dep" ] || die "$moddir/modules.dep missing"
vmlinuz=$kroot/boot/vmlinuz-$kver
[ -f "$vmlinuz" ] || die "$vmlinuz missing"
log "kernel $kver"

work=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/root
mkdir -p "$root/bin" "$root/sbin" "$root/usr/bin" "$root/usr/sbin" "$root/etc/udhcpc" \
	"$root/etc/acpi/PWRF" "$root/lib/modules" "$root/proc" "$root/sys" "$root/dev" "$root/run" \
	"$root/tmp" "$root/www" "$root/root"
chmod 1777 "$root/tmp"

# busybox and a link for each of its applets.
cp "$busybox" "$root/bin/busybox"
"$busybox" --list-full | while read -r a; do
	[ "$a" = bin/busybox ] && continue
	case $a in
	bin/*) ln -sf busybox "$root/$a" ;;
	sbin/*) ln -sf ../bin/busybox "$root/$a" ;;
	usr/bin/* | usr/sbin/*) ln -sf ../../bin/busybox "$root/$a" ;;
	esac
done

# The guest-side files.
cp "$here/busybox/init" "$root/init"
cp "$here/busybox/udhcpc.script" "$root/etc/udhcpc/default.script"
cp "$here/busybox/acpi/PWRF/00000080" "$root/etc/acpi/PWRF/00000080"
chmod 0755 "$root/init" "$root/etc/udhcpc/default.script" "$root/etc/acpi/PWRF/00000080"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"

# Modules: the closure of $MODULES over modules.dep, dependencies first. Built-in ones (in
# modules.builtin) need nothing; one that is neither is an error.
awk -v want="$MODULES" -v builtin="$moddir/modules.builtin" '
	function name(p) { sub(/.*\//, "", p); sub(/\.ko(\.[a-z]+)?$/, "", p); gsub(/-/, "_", p); return p }
	function visit(n,   i, k, d) {
		if (n in done) return
		done[n] = 1
		k = split(deps[n], d, " ")
		for (i = 1; i <= k; i++) visit(name(d[i]))
		print path[n]
	}
	BEGIN { while ((getline l < builtin) > 0) isbuiltin[name(l)] = 1 }
	{ p = $1; sub(/:$/, "", p); n = name(p); path[n] = p; $1 = ""; deps[n] = $0 }
	END {
		k = split(want, w, /[ \t\n]+/)
		for (i = 1; i <= k; i++) {
			if (w[i] == "") continue
			if (w[i] in path) visit(w[i])
			else if (!(w[i] in isbuiltin)) { print "unknown module " w[i] > "/dev/stderr"; exit 1 }
		}
	}' "$moddir/modules.dep" >"$work/load-order"
while read -r m; do
	mkdir -p "$root/lib/modules/$(dirname "$m")"
	case $m in
	*.ko) cp "$moddir/$m" "$root/lib/modules/$m" ;;
	*.ko.xz) xz -dc "$moddir/$m" >"$root/lib/modules/${m%.xz}" ;;
	*.ko.zst) zstd -qdc "$moddir/$m" >"$root/lib/modules/${m%.zst}" ;;
	*.ko.gz) gzip -dc "$moddir/$m" >"$root/lib/modules/${m%.gz}" ;;
	*) die "module $m: unknown compression" ;;
	esac
done <"$work/load-order"
sed 's/\.ko\.[a-z]*$/.ko/' "$work/load-order" >"$root/lib/modules/load-order"
log "$(wc -l <"$work/load-order") modules: $(sed 's|.*/||; s|\.ko.*||' "$work/load-order" | tr '\n' ' ')"

# The archive: sorted, owned by root, mtimes of the sources (reproducible enough).
log "cpio | gzip -9"
(cd "$root" && find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0 --reproducible) |
	gzip -9n >"$work/initrd.img"
cp "$vmlinuz" "$work/vmlinuz"
mv -f "$work/vmlinuz" "$out/vmlinuz"
mv -f "$work/initrd.img" "$out/initrd.img"
log "done: vmlinuz $(du -h "$out/vmlinuz" | cut -f1), initrd.img $(du -h "$out/initrd.img" | cut -f1), in $out"
