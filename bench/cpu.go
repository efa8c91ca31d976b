package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/redisproc"
)

// CPUCost is what one request of a run cost each process in CPU time (user and system), in
// microseconds: the load generator (this process), the server that answered (the API or the
// bare handler; 0 when it is not this run's child, as with --target) and Redis. The processes
// share the machine's cores, so a request's throughput is bounded by their sum.
type CPUCost struct {
	Client float64 `json:"clientMicros"`
	Server float64 `json:"serverMicros,omitempty"`
	Redis  float64 `json:"redisMicros"`
}

// cpuTimes is the CPU time the processes of a run have used so far.
type cpuTimes struct {
	client, server, redis time.Duration
}

// readCPU reads the CPU time of this process, of the server process (pid 0: none) and of
// Redis.
func readCPU(ctx context.Context, server int, rdb redis.UniversalClient) (cpuTimes, error) {
	var t cpuTimes
	var err error
	if t.client, err = selfCPU(); err != nil {
		return t, err
	}
	if server != 0 {
		if t.server, err = processCPU(server); err != nil {
			return t, err
		}
	}
	t.redis, err = redisproc.CPU(ctx, rdb)
	return t, err
}

// selfCPU is this process's CPU time so far, user and system.
func selfCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// clockTicks is the unit of /proc/PID/stat's times (USER_HZ), 100 a second on Linux.
const clockTicks = 100

// processCPU is a process's CPU time so far, user and system, from /proc/PID/stat.
func processCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: the fields follow its last ')'.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	// utime and stime are the 14th and 15th fields, counting the pid and the name.
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the name", pid, len(fields))
	}
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// per is the cost per request of the n requests made between the readings a and b.
func (b cpuTimes) per(a cpuTimes, n int) *CPUCost {
	if n == 0 {
		return nil
	}
	micros := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(n) }
	return &CPUCost{Client: micros(b.client - a.client), Server: micros(b.server - a.server), Redis: micros(b.redis - a.redis)}
}

// metered runs the load and records in it what its requests cost each process in CPU time.
// server is the answering process, when it is this run's child; a failed reading leaves the
// cost out and says so.
func (r *runner) metered(ctx context.Context, server *child, run func() Load) Load {
	pid := 0
	if server != nil {
		pid = server.cmd.Process.Pid
	}
	before, err := readCPU(ctx, pid, r.sys.rdb)
	l := run()
	if err == nil {
		var after cpuTimes
		if after, err = readCPU(ctx, pid, r.sys.rdb); err == nil {
			l.CPU = after.per(before, l.Requests)
		}
	}
	if err != nil {
		r.say("CPU per request not measured: %v", err)
	}
	return l
}

// cpuValue shows a cost as "client / server / Redis µs".
func cpuValue(c *CPUCost) string {
	if c == nil {
		return "not measured"
	}
	server := "not measured"
	if c.Server > 0 {
		server = strconv.FormatFloat(c.Server, 'f', 0, 64)
	}
	return fmt.Sprintf("%.0f / %s / %.0f µs", c.Client, server, c.Redis)
}

// cpuRatio is what a request cost the system under test (its server and Redis) as a multiple
// of what one cost the limit's; n/a when a server's share was not measured.
func cpuRatio(c, limit *CPUCost) string {
	if c == nil || limit == nil || c.Server == 0 || limit.Server == 0 {
		return "n/a"
	}
	return times(c.Server+c.Redis, limit.Server+limit.Redis)
}
