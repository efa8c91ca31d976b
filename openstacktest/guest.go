package openstacktest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// ImagesEnv names the directory of the guest images (make images fills images/, which make
// openstack-test passes): busybox/vmlinuz and busybox/initrd.img.
const ImagesEnv = "COMPUTEQL_IMAGES_DIR"

// GuestImages returns the busybox guest's kernel and initramfs, skipping the test when they are
// missing, or failing it when RequireEnv is 1.
func GuestImages(tb testing.TB) (kernel, initrd string) {
	tb.Helper()
	dir := os.Getenv(ImagesEnv)
	kernel, initrd = filepath.Join(dir, "busybox", "vmlinuz"), filepath.Join(dir, "busybox", "initrd.img")
	for _, p := range []string{kernel, initrd} {
		if _, err := os.Stat(p); dir == "" || err != nil {
			msg := fmt.Sprintf("no guest image %s: run make images and set %s (make openstack-test does)", p, ImagesEnv)
			if os.Getenv(RequireEnv) == "1" {
				tb.Fatal(msg)
			}
			tb.Skip(msg)
		}
	}
	return kernel, initrd
}
