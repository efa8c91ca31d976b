package bench

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/redistest"
)

func TestBareGraphQL(t *testing.T) {
	addr, stop, err := serveBare()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	}()
	c := newClient("http://"+addr+"/graphql", "", 1)
	defer c.close()
	tests := []struct {
		query   string
		want    string
		wantErr string
	}{
		{query: "{ ping }", want: `{"ping":"pong"}`},
		{query: "{ __typename ping }", want: `{"__typename":"Query","ping":"pong"}`},
		{query: "{ p: ping }", want: `{"p":"pong"}`},
		{query: "mutation { ping }", wantErr: "mutation"},
		{query: "{ pong }", wantErr: "pong"},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			var data json.RawMessage
			err := c.post(context.Background(), tt.query, nil, &data)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one about %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(data) != tt.want {
				t.Errorf("data = %s, want %s", data, tt.want)
			}
		})
	}
}

func TestRedisLimits(t *testing.T) {
	srv, err := redistest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	ctx := context.Background()
	l, err := redisLimits(ctx, rdb, "bench:{limits}:t:", 20, 300, 8)
	if err != nil {
		t.Fatal(err)
	}
	if l.Ping.Count != 20 || l.XAdd.Ops != 300 || l.XReadGroup.Ops != 300 {
		t.Errorf("limits = %+v; want 20 pings, 300 entries added and 300 read", l)
	}
	if l.XAdd.PerSecond <= 0 || l.XReadGroup.PerSecond <= 0 {
		t.Errorf("no rates: %+v", l)
	}
	if keys, err := rdb.Keys(ctx, "*").Result(); err != nil || len(keys) != 0 {
		t.Errorf("left keys %v (%v)", keys, err)
	}
}
