package bench

import (
	"fmt"
	"syscall"
)

// fileMargin is the descriptors a process of a run needs besides the subscribers' sockets: the
// HTTP clients' connections, Redis pools, listeners, logs and pipes. At 10,000 subscribers the
// benchmark held about 90 more and the API about 45; before the fan-out, under 200 each.
const fileMargin = 1024

// filesNeeded is the open files each side of the fan-out holds at its peak: the benchmark
// holds one end of every subscriber's socket and the API process the other, and the fan-out
// opens twice --subscribers.
func filesNeeded(subscribers int) uint64 { return 2*uint64(subscribers) + fileMargin }

// fileLimit is what raising the open-file limit came to.
type fileLimit struct {
	// Soft and Hard are the limits after the attempt.
	Soft, Hard uint64
	// Short, when not empty, says why the limit stays below what the run needs.
	Short string
}

// raiseFileLimit sets this process's RLIMIT_NOFILE, soft and hard, to need or the hard limit,
// whichever is higher, before the benchmark starts its processes, which inherit it. It sets it
// even when it is high enough: Go's runtime raises its own soft limit to just under the hard
// one at start, but os/exec gives children the soft limit the process started with unless the
// program set the limit itself. Raising the hard limit takes CAP_SYS_RESOURCE; without it the
// soft limit goes up to the hard one, and Short says why that is not enough.
func raiseFileLimit(need uint64, get, set func(*syscall.Rlimit) error) fileLimit {
	var cur syscall.Rlimit
	if err := get(&cur); err != nil {
		return fileLimit{Short: fmt.Sprintf("the open-file limit could not be read: %v", err)}
	}
	want := syscall.Rlimit{Cur: max(cur.Max, need), Max: max(cur.Max, need)}
	err := set(&want)
	if err == nil {
		return fileLimit{Soft: want.Cur, Hard: want.Max}
	}
	up := syscall.Rlimit{Cur: cur.Max, Max: cur.Max}
	if set(&up) == nil {
		cur = up
	}
	l := fileLimit{Soft: cur.Cur, Hard: cur.Max}
	if l.Soft < need {
		l.Short = fmt.Sprintf("the open-file limit is %s and raising it to the %s a process of this run needs failed: %v"+
			" (raising a hard limit takes CAP_SYS_RESOURCE, which this process lacks)", count(float64(l.Soft)), count(float64(need)), err)
	}
	return l
}

func getFileLimit(l *syscall.Rlimit) error { return syscall.Getrlimit(syscall.RLIMIT_NOFILE, l) }
func setFileLimit(l *syscall.Rlimit) error { return syscall.Setrlimit(syscall.RLIMIT_NOFILE, l) }
