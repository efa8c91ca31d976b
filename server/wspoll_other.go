//go:build !linux

package server

// idlePoller is Linux's epoll (wspoll_linux.go); elsewhere there is none, and an idle
// socket's reader waits in its read, with the stack its reading grew.
type idlePoller struct{}

func newIdlePoller() (*idlePoller, error) { return nil, nil }

func (*idlePoller) park(*wsConn) bool { return false }
func (*idlePoller) unpark(*wsConn)    {}
func (*idlePoller) parkedCount() int  { return 0 }
func (*idlePoller) close()            {}
