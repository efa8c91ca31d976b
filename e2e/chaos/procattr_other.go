//go:build !linux

package chaos

import "syscall"

// sysProcAttr is empty where the kernel cannot kill a child with its parent: the test's
// cleanup stops redis-server.
func sysProcAttr() *syscall.SysProcAttr { return nil }
