//go:build !linux

package harness

import "syscall"

// sysProcAttr: only Linux can tie a child's life to its parent's; elsewhere the test's cleanup
// is all that stops the processes.
func ProcAttr() *syscall.SysProcAttr { return nil }
