package instance_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/eventually"

	"github.com/computeql/computeql/instance"
	"github.com/computeql/computeql/redistest"
	"github.com/computeql/computeql/region"
)

// TestStoreOutageIsUnavailable: with Redis gone, every operation that needs the store fails
// with UNAVAILABLE, which tells a caller to retry, not with INTERNAL, which tells it the
// request is broken.
func TestStoreOutageIsUnavailable(t *testing.T) {
	srv, err := redistest.Start()
	if err != nil {
		t.Fatal(err)
	}
	e := serviceOn(t, srv.Client(t), region.Demo())
	inst := e.create(t, acmeMember, validCreate())
	srv.Stop()

	second := validCreate()
	second.Name = "web-2"
	desc := "changed"
	tests := []struct {
		name string
		call func() error
	}{
		{"create", func() error { _, err := e.svc.Create(acmeMember, second); return err }},
		{"get", func() error { _, err := e.svc.Get(acmeMember, inst.ID); return err }},
		{"list", func() error {
			_, err := e.svc.List(acmeMember, instance.ListRequest{OrganizationID: "acme"})
			return err
		}},
		{"update", func() error {
			_, err := e.svc.Update(acmeMember, instance.UpdateRequest{ID: inst.ID, Description: &desc})
			return err
		}},
		{"delete", func() error { _, err := e.svc.Delete(acmeMember, inst.ID, nil); return err }},
		{"quota", func() error { _, err := e.svc.Quota(acmeMember, "acme"); return err }},
	}
	for _, tt := range tests {
		if got := instance.CodeOf(tt.call()); got != instance.CodeUnavailable {
			t.Errorf("%s with Redis gone: %s, want UNAVAILABLE", tt.name, got)
		}
	}
}

// TestReadOnlyReplicaIsUnavailable: pointed at a replica (a failover not yet followed), every
// write is READONLY, which passes: UNAVAILABLE, and nothing is written anywhere.
func TestReadOnlyReplicaIsUnavailable(t *testing.T) {
	primary, err := redistest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(primary.Stop)
	replica, err := redistest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(replica.Stop)
	host, port, _ := net.SplitHostPort(primary.Addr)
	rdb := replica.Client(t)
	if err := rdb.Do(context.Background(), "REPLICAOF", host, port).Err(); err != nil {
		t.Fatal(err)
	}
	eventually.Holds(t, 10*time.Second, func() bool {
		info, err := rdb.Info(context.Background(), "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	}, "the replica follows its primary")
	e := serviceOn(t, rdb, region.Demo())
	if _, err := e.svc.Create(acmeMember, validCreate()); instance.CodeOf(err) != instance.CodeUnavailable {
		t.Errorf("create on a read-only replica: %v, want UNAVAILABLE", err)
	}
	if n, err := primary.Client(t).DBSize(context.Background()).Result(); err != nil || n != 0 {
		t.Errorf("the primary holds %d keys (%v) after a refused create, want none", n, err)
	}
}

// TestTransientRedisRepliesAreUnavailable: Redis's replies for states that pass — loading its
// data after a restart, a primary gone, a cluster down or resharding — answer UNAVAILABLE; any
// other error reply stays INTERNAL. A server in those states is hard to hold still in a test,
// so a listener answers every command with the exact reply Redis sends in each.
func TestTransientRedisRepliesAreUnavailable(t *testing.T) {
	for _, tc := range []struct {
		reply string
		want  instance.Code
	}{
		{"LOADING Redis is loading the dataset in memory", instance.CodeUnavailable},
		{"MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.", instance.CodeUnavailable},
		{"CLUSTERDOWN The cluster is down", instance.CodeUnavailable},
		{"TRYAGAIN Multiple keys request during rehashing of slot", instance.CodeUnavailable},
		{"ERR max number of clients reached", instance.CodeUnavailable},
		{"ERR something else went wrong", instance.CodeInternal},
	} {
		t.Run(strings.Fields(tc.reply)[0]+" "+strings.Fields(tc.reply)[1], func(t *testing.T) {
			addr := answeringWith(t, tc.reply)
			rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, Protocol: 2})
			t.Cleanup(func() { _ = rdb.Close() })
			e := serviceOn(t, rdb, region.Demo())
			if _, err := e.svc.Create(acmeMember, validCreate()); instance.CodeOf(err) != tc.want {
				t.Errorf("create against %q: %v, want %s", tc.reply, err, tc.want)
			}
		})
	}
}

// answeringWith listens on a loopback port and answers every command of every connection with
// the error reply.
func answeringWith(t *testing.T, reply string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					if err := skipCommand(r); err != nil {
						return
					}
					if _, err := io.WriteString(c, "-"+reply+"\r\n"); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// skipCommand reads one RESP command (an array of bulk strings).
func skipCommand(r *bufio.Reader) error {
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "*")))
	if err != nil {
		return err
	}
	for range n {
		if _, err := r.ReadString('\n'); err != nil { // $len
			return err
		}
		if _, err := r.ReadString('\n'); err != nil { // the bulk string
			return err
		}
	}
	return nil
}

// TestLoadingRedisIsUnavailable: a real redis-server loading its data after a restart (made
// slow, so that it is caught loading) answers LOADING, which passes: UNAVAILABLE for reads and
// writes alike.
func TestLoadingRedisIsUnavailable(t *testing.T) {
	first, err := redistest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(first.Stop)
	ctx := context.Background()
	c := first.Client(t)
	if err := c.Eval(ctx, "for i = 1, 20000 do redis.call('SET', 'k' .. i, 'v') end", nil).Err(); err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	if err := c.Save(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	dir, err := c.ConfigGet(ctx, "dir").Result()
	if err != nil {
		t.Fatal(err)
	}
	dump, err := os.ReadFile(filepath.Join(dir["dir"], "dump.rdb"))
	if err != nil {
		t.Fatal(err)
	}
	restarted := t.TempDir()
	if err := os.WriteFile(filepath.Join(restarted, "dump.rdb"), dump, 0o600); err != nil {
		t.Fatal(err)
	}
	// A millisecond a key: twenty seconds of loading, answering commands (with LOADING) as it goes.
	loading, err := redistest.Start("--dir", restarted, "--key-load-delay", "1000", "--loading-process-events-interval-bytes", "1024")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(loading.Stop)
	rdb := redis.NewClient(&redis.Options{Addr: loading.Addr})
	t.Cleanup(func() { rdb.Close() })
	if info, err := rdb.Info(ctx, "persistence").Result(); err != nil || !strings.Contains(info, "loading:1") {
		t.Fatalf("the restarted server is not loading (%v): the test shows nothing", err)
	}
	e := serviceOn(t, rdb, region.Demo())
	if _, err := e.svc.Create(acmeMember, validCreate()); instance.CodeOf(err) != instance.CodeUnavailable {
		t.Errorf("create on a loading server: %v, want UNAVAILABLE", err)
	}
	if _, err := e.svc.Get(acmeViewer, "0190c7a4-6b1e-7c3d-9f00-1a2b3c4d5e6f"); instance.CodeOf(err) != instance.CodeUnavailable {
		t.Errorf("get on a loading server: %v, want UNAVAILABLE", err)
	}
}
