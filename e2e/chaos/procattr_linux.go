package chaos

import "syscall"

// sysProcAttr makes the kernel kill redis-server when the test binary dies without cleaning
// up (a panic, a timeout's kill), as the harness does for the processes it starts.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
