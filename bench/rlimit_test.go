package bench

import (
	"errors"
	"strings"
	"syscall"
	"testing"
)

// fakeLimits is a process's RLIMIT_NOFILE as the kernel keeps it: without privilege the hard
// limit can be lowered, not raised.
type fakeLimits struct {
	cur        syscall.Rlimit
	privileged bool
	getErr     error
	sets       []syscall.Rlimit
}

func (f *fakeLimits) get(l *syscall.Rlimit) error {
	*l = f.cur
	return f.getErr
}

func (f *fakeLimits) set(l *syscall.Rlimit) error {
	f.sets = append(f.sets, *l)
	switch {
	case l.Cur > l.Max:
		return syscall.EINVAL
	case l.Max > f.cur.Max && !f.privileged:
		return syscall.EPERM
	}
	f.cur = *l
	return nil
}

func TestRaiseFileLimit(t *testing.T) {
	need := filesNeeded(10_000)
	if need != 21_024 {
		t.Fatalf("filesNeeded(10,000) = %d, want 21,024: both ends of 20,000 sockets and the margin", need)
	}
	tests := []struct {
		name       string
		cur        syscall.Rlimit
		privileged bool
		getErr     error
		soft, hard uint64
		short      []string // what Short says; none: the run has what it needs
	}{
		{name: "privileged, below need", cur: syscall.Rlimit{Cur: 19_999, Max: 20_000}, privileged: true, soft: need, hard: need},
		{name: "unprivileged, below need", cur: syscall.Rlimit{Cur: 19_999, Max: 20_000}, soft: 20_000, hard: 20_000,
			short: []string{"is 20,000", "to the 21,024", "operation not permitted", "CAP_SYS_RESOURCE"}},
		// Set even when high enough, so that the processes inherit the soft limit too.
		{name: "unprivileged, hard limit enough", cur: syscall.Rlimit{Cur: 1024, Max: 1 << 20}, soft: 1 << 20, hard: 1 << 20},
		{name: "unreadable", getErr: errors.New("no"), short: []string{"could not be read: no"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeLimits{cur: tt.cur, privileged: tt.privileged, getErr: tt.getErr}
			l := raiseFileLimit(need, f.get, f.set)
			if l.Soft != tt.soft || l.Hard != tt.hard {
				t.Errorf("limits %d / %d, want %d / %d", l.Soft, l.Hard, tt.soft, tt.hard)
			}
			if tt.getErr == nil && f.cur != (syscall.Rlimit{Cur: tt.soft, Max: tt.hard}) {
				t.Errorf("the process's limit is %+v, want soft %d and hard %d (sets %+v)", f.cur, tt.soft, tt.hard, f.sets)
			}
			if (l.Short == "") != (len(tt.short) == 0) {
				t.Fatalf("Short = %q, want it to say %q", l.Short, tt.short)
			}
			for _, want := range tt.short {
				if !strings.Contains(l.Short, want) {
					t.Errorf("Short = %q, lacks %q", l.Short, want)
				}
			}
		})
	}
}
