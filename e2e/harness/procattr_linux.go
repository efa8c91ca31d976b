package harness

import "syscall"

// ProcAttr makes the kernel kill a child when the test binary dies without cleaning up
// (a panic, a timeout's kill), so no process of the binary outlives its test. (Strictly, the
// signal follows the thread that started the child; Go keeps its threads for the binary's
// life unless a goroutine exits while locked to one, which the harness never does.)
func ProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
