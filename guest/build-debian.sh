#!/bin/bash
# build-debian.sh — the "debian" guest image: a small Debian 12 (bookworm) cloud image.
#
# Usage: guest/build-debian.sh [OUTDIR]          (default OUTDIR: ./images/debian)
#
# Outputs, each written to a temporary name and renamed into place:
#   OUTDIR/disk.qcow2   compressed qcow2 holding one ext4 filesystem (label "root", no partition
#                       table) of DEBIAN_DISK_SIZE (default 2G) virtual size; cloud-init grows it
#                       to the size of the disk it finds itself on (resize_rootfs).
#   OUTDIR/vmlinuz      the image's own kernel (linux-image-amd64 of bookworm)
#   OUTDIR/initrd.img   its initramfs (initramfs-tools, MODULES=list: virtio, scsi, ext4)
#   OUTDIR/cmdline      the kernel command line for direct kernel boot (root=/dev/vda ...)
#
# The image is built with debootstrap from the Debian mirror this machine's apt uses (the first
# URIs/deb line for suite bookworm in /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list;
# DEBIAN_MIRROR overrides), no other downloads. The filesystem is made without loop devices or
# mounts: mke2fs -d ROOTDIR, then qemu-img convert -c. Downloaded .debs are kept in
# OUTDIR/../cache/debootstrap so a rebuild does not fetch them again.
#
# Inside: systemd, cloud-init (NoCloud datasource only, default user "debian" without password,
# network by its fallback config: DHCP on the first NIC through systemd-networkd),
# openssh-server (host keys made at first boot), qemu-guest-agent (started by udev when the
# virtio-serial port org.qemu.guest_agent.0 appears), a getty on ttyS0, sudo. No recommends,
# no apt lists, docs, man pages or locales; only the kernel modules a VM needs.
#
# Ordering: cloud-init applies vendor-data/user-data write_files in cloud-init.service, which
# systemd orders before ssh.service, so an /etc/ssh/sshd_config.d/*.conf written there (for
# instance a TrustedUserCAKeys line) is read by sshd's first start; no restart is needed.
set -eu -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$PWD/images/debian}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cache=$(dirname "$out")/cache
size=${DEBIAN_DISK_SIZE:-2G}
suite=bookworm

log() { printf 'build-debian: %s\n' "$*"; }

[ "$(id -u)" = 0 ] || { echo "build-debian: must run as root (debootstrap, chroot)" >&2; exit 1; }
for t in debootstrap mke2fs qemu-img chroot; do
	command -v "$t" >/dev/null || { echo "build-debian: $t not found" >&2; exit 1; }
done

# The mirror: what this machine's apt is configured with.
mirror=${DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -f "$f" ] || continue
		mirror=$(awk -v suite="$suite" '
			BEGIN { RS = ""; FS = "\n" }
			{
				uris = ""; ok = 0
				for (i = 1; i <= NF; i++) {
					if ($i ~ /^URIs:/) { sub(/^URIs:[ \t]*/, "", $i); split($i, u, /[ \t]+/); uris = u[1] }
					if ($i ~ /^Suites:/) { n = split($i, s, /[ \t]+/); for (j = 2; j <= n; j++) if (s[j] == suite) ok = 1 }
				}
				if (ok && uris != "") { print uris; exit }
			}' "$f")
		[ -n "$mirror" ] && break
	done
fi
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
	mirror=$(awk -v suite="$suite" '$1 == "deb" { i = 2; if ($2 ~ /^\[/) { while ($i !~ /\]$/) i++; i++ } if ($(i+1) == suite) { print $i; exit } }' /etc/apt/sources.list)
fi
[ -n "$mirror" ] || { echo "build-debian: no $suite mirror found in apt's sources; set DEBIAN_MIRROR" >&2; exit 1; }
log "mirror $mirror"

work=$(mktemp -d "$out/.build.XXXXXX")
root=$work/root
# debootstrap mounts proc/sys in the target while it runs, and leaves one mounted when a
# process it started in the chroot still holds it; none may be left (nor copied into the image).
unmount_root() {
	for m in "$root/proc" "$root/sys" "$root/dev/pts" "$root/dev"; do
		mountpoint -q "$m" 2>/dev/null && umount -l "$m" || true
	done
}
cleanup() {
	unmount_root
	rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$cache/debootstrap"
pkgs=systemd-sysv,python3-cffi-backend,udev,linux-image-amd64,initramfs-tools,cloud-init,openssh-server,qemu-guest-agent,sudo,e2fsprogs,iproute2,netbase,isc-dhcp-client,less
log "debootstrap $suite (minbase + $pkgs) into $root"
debootstrap --variant=minbase --include="$pkgs" --cache-dir="$cache/debootstrap" \
	--components=main "$suite" "$root" "$mirror" | sed -u 's/^/  /'

log "configuring the image"
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"; }

# Files that come with this script (guest/debian/rootfs: cloud-init config, ssh drop-in, ...),
# owned by root whoever owns the checkout.
(cd "$here/debian/rootfs" && find . -type f) | while read -r f; do
	install -D -o 0 -g 0 -m 0644 "$here/debian/rootfs/$f" "$root/$f"
done
# The initramfs needs only these to find and mount an ext4 root on a virtio or SCSI disk.
printf '%s\n' virtio_pci virtio_blk virtio_scsi sd_mod ext4 crc32c_generic >>"$root/etc/initramfs-tools/modules"

cat >"$root/etc/apt/sources.list" <<EOF
deb $mirror $suite main
EOF
echo localhost >"$root/etc/hostname"
printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"
printf 'LABEL=root\t/\text4\tdefaults,discard,errors=remount-ro\t0\t1\n' >"$root/etc/fstab"
printf 'LANG=C.UTF-8\n' >"$root/etc/default/locale"

# systemd-networkd renders cloud-init's network config; enable it (offline, like systemctl).
in_root systemctl enable systemd-networkd.service systemd-networkd.socket >/dev/null 2>&1 ||
	in_root systemctl enable systemd-networkd.service
# Do not wait up to 2 minutes for "online": cloud-init orders itself after the network itself.
in_root systemctl mask systemd-networkd-wait-online.service >/dev/null 2>&1 || true
# A serial getty on ttyS0 (systemd also starts one for console=ttyS0 by itself).
in_root systemctl enable serial-getty@ttyS0.service >/dev/null 2>&1 || true

# SSH host keys are made at first boot (cloud-init's cc_ssh; ssh.service's drop-in as fallback).
rm -f "$root"/etc/ssh/ssh_host_*
# Unique per instance: systemd makes a machine-id at first boot.
: >"$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id"

# Trim kernel modules a VM never loads (GPUs, wireless, sound, media, ...).
kver=$(ls "$root/lib/modules" | sort -V | tail -n 1)
[ -n "$kver" ] || { echo "build-debian: no kernel installed in the image" >&2; exit 1; }
km=$root/lib/modules/$kver/kernel
log "kernel $kver: pruning modules"
for d in drivers/gpu drivers/media drivers/net/wireless drivers/infiniband drivers/staging \
	drivers/bluetooth drivers/isdn drivers/iio drivers/mtd drivers/nfc drivers/thunderbolt \
	drivers/usb/gadget drivers/w1 drivers/hwmon drivers/input/touchscreen drivers/input/joystick \
	drivers/input/misc drivers/net/can drivers/net/usb drivers/net/ieee802154 drivers/net/wwan \
	drivers/misc drivers/leds drivers/platform/chrome drivers/platform/surface \
	drivers/platform/mellanox drivers/edac drivers/fpga drivers/memstick drivers/mmc drivers/pcmcia \
	drivers/power/supply drivers/regulator drivers/mfd drivers/gnss drivers/atm drivers/firewire \
	drivers/parport drivers/spi drivers/i2c/busses drivers/target drivers/scsi/qla2xxx \
	drivers/scsi/lpfc drivers/scsi/mpt3sas drivers/scsi/megaraid drivers/scsi/aacraid \
	drivers/scsi/bfa drivers/scsi/be2iscsi drivers/scsi/bnx2fc drivers/scsi/qedf drivers/scsi/qedi \
	drivers/scsi/smartpqi drivers/scsi/fnic drivers/scsi/csiostor drivers/scsi/pm8001 \
	drivers/scsi/qla4xxx drivers/scsi/mpi3mr drivers/scsi/elx drivers/scsi/hisi_sas \
	drivers/net/ethernet/mellanox drivers/net/ethernet/chelsio drivers/net/ethernet/qlogic \
	drivers/net/ethernet/broadcom drivers/net/ethernet/marvell drivers/net/ethernet/sfc \
	drivers/net/ethernet/cavium drivers/net/ethernet/emulex drivers/net/ethernet/huawei \
	drivers/net/ethernet/pensando drivers/net/ethernet/netronome drivers/net/ethernet/amd \
	drivers/net/ethernet/cisco drivers/net/ethernet/mscc drivers/net/ethernet/microchip \
	drivers/net/ethernet/aquantia drivers/net/ethernet/atheros drivers/net/ethernet/brocade \
	drivers/net/ethernet/google drivers/net/ethernet/freescale drivers/net/ethernet/hisilicon \
	sound net/wireless net/mac80211 net/bluetooth net/nfc net/ieee802154 net/mac802154 \
	net/6lowpan net/can net/ceph fs/ocfs2 fs/gfs2 fs/ceph fs/nfs fs/nfsd fs/cifs fs/smb fs/ntfs3 \
	fs/xfs fs/btrfs fs/f2fs fs/jfs fs/nilfs2 fs/ubifs fs/orangefs fs/afs fs/coda fs/9p; do
	rm -rf "${km:?}/$d"
done
depmod -b "$root" "$kver"

# Rebuild the initramfs with only what a virtio/scsi VM needs to mount an ext4 root.
log "initramfs for $kver"
in_root update-initramfs -u -k "$kver" 2>&1 | sed -u 's/^/  /'

# Trim: no apt lists or caches, docs, man pages, locales; and keep them out of later installs.
log "trimming"
in_root apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/debconf/*-old \
	"$root"/var/log/*.log "$root"/var/log/apt/* "$root"/tmp/* "$root"/var/tmp/*
find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete 2>/dev/null || true
find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete 2>/dev/null || true
rm -rf "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/lintian \
	"$root"/usr/share/linda "$root"/usr/share/groff/*
find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} + 2>/dev/null || true
rm -rf "$root"/usr/share/i18n/locales/* "$root"/usr/share/i18n/charmaps/*

# Direct kernel boot files.
cp "$root/boot/vmlinuz-$kver" "$work/vmlinuz"
cp "$root/boot/initrd.img-$kver" "$work/initrd.img"
echo "root=/dev/vda ro console=ttyS0 rootfstype=ext4" >"$work/cmdline"

unmount_root
log "ext4 filesystem ($size) from the root directory"
mke2fs -q -t ext4 -L root -m 0 -E root_owner=0:0 -d "$root" "$work/disk.raw" "$size"
log "qcow2 (compressed)"
qemu-img convert -f raw -O qcow2 -c "$work/disk.raw" "$work/disk.qcow2"
rm -f "$work/disk.raw"

for f in vmlinuz initrd.img cmdline disk.qcow2; do
	mv -f "$work/$f" "$out/$f"
done
log "done: $(du -h "$out/disk.qcow2" | cut -f1) disk.qcow2, kernel $kver, in $out"
