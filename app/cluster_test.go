package app

import (
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestParseClusterURL(t *testing.T) {
	tests := []struct {
		url     string
		want    redis.ClusterOptions
		wantErr bool
	}{
		{url: "redis+cluster://127.0.0.1:7001", want: redis.ClusterOptions{Addrs: []string{"127.0.0.1:7001"}}},
		{url: "redis+cluster://a:7001,b:7002,c:7003/", want: redis.ClusterOptions{Addrs: []string{"a:7001", "b:7002", "c:7003"}}},
		{
			url:  "redis+cluster://user:p%40ss@a:7001,b:7002?dial_timeout=3s&pool_size=40",
			want: redis.ClusterOptions{Addrs: []string{"a:7001", "b:7002"}, Username: "user", Password: "p@ss", DialTimeout: 3 * time.Second, PoolSize: 40},
		},
		{url: "rediss+cluster://a:7001", want: redis.ClusterOptions{Addrs: []string{"a:7001"}}},
		{url: "redis+cluster://a:7001,b:7002/0", wantErr: true},         // a cluster has no databases
		{url: "redis+cluster://a:7001,,b:7002", wantErr: true},          // an empty node
		{url: "redis+cluster://a", wantErr: true},                       // no port
		{url: "redis+cluster://a:7001?bogus=1", wantErr: true},          // unknown option
		{url: "http+cluster://a:7001", wantErr: true},                   // not a Redis scheme
		{url: "redis+cluster://a:7001?dial_timeout=%zz", wantErr: true}, // malformed query
	}
	for _, tt := range tests {
		got, err := parseClusterURL(tt.url)
		if tt.wantErr {
			if err == nil {
				t.Errorf("%s: accepted as %+v", tt.url, got)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tt.url, err)
			continue
		}
		if !slices.Equal(got.Addrs, tt.want.Addrs) || got.Username != tt.want.Username || got.Password != tt.want.Password ||
			got.DialTimeout != tt.want.DialTimeout || got.PoolSize != tt.want.PoolSize {
			t.Errorf("%s: got addrs %v user %q password %q dial %v pool %d", tt.url, got.Addrs, got.Username, got.Password, got.DialTimeout, got.PoolSize)
		}
		if tls := got.TLSConfig != nil; tls != (tt.url[:6] == "rediss") {
			t.Errorf("%s: TLS = %v", tt.url, tls)
		}
	}
}

// TestConnectChoosesTheClient: a cluster URL gives a cluster client, any other a client of one
// server; both satisfy the redis.UniversalClient every package takes.
func TestConnectChoosesTheClient(t *testing.T) {
	for url, cluster := range map[string]bool{
		"redis://127.0.0.1:1/0":               false,
		"redis+cluster://127.0.0.1:1,[::1]:2": true,
	} {
		rdb, closeRedis, err := connect(url)
		if err != nil {
			t.Fatalf("%s: %v", url, err)
		}
		if _, ok := rdb.(*redis.ClusterClient); ok != cluster {
			t.Errorf("%s: %T", url, rdb)
		}
		closeRedis()
	}
	if _, _, err := connect("redis+cluster://a:1/2"); err == nil {
		t.Error("a cluster URL with a database was accepted")
	}
}

// TestClusterPoolSize: a cluster client gets room for a worker's blocking reads on one node
// on top of the usual pool, unless the URL sizes the pool itself.
func TestClusterPoolSize(t *testing.T) {
	for url, want := range map[string]int{
		"redis+cluster://127.0.0.1:1":              10*runtime.GOMAXPROCS(0) + clusterBlockingReads,
		"redis+cluster://127.0.0.1:1?pool_size=40": 40,
	} {
		rdb, closeRedis, err := connect(url)
		if err != nil {
			t.Fatalf("%s: %v", url, err)
		}
		if got := rdb.(*redis.ClusterClient).Options().PoolSize; got != want {
			t.Errorf("%s: pool size %d, want %d", url, got, want)
		}
		closeRedis()
	}
}
