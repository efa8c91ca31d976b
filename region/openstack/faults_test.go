package openstack

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/region"
)

func TestFaultClassification(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		body   string
		want   error
		msg    string
	}{
		{"nova conflict", 409, `{"conflictingRequest": {"code": 409, "message": "Cannot 'stop' instance while it is in vm_state stopped"}}`,
			region.ErrRefused, "Cannot 'stop' instance while it is in vm_state stopped"},
		{"nova bad request", 400, `{"badRequest": {"code": 400, "message": "Invalid flavorRef provided."}}`, region.ErrRefused, "Invalid flavorRef provided."},
		{"nova quota", 403, `{"forbidden": {"code": 403, "message": "Quota exceeded for instances: Requested 1, but already used 10 of 10 instances"}}`,
			region.ErrNoCapacity, "Quota exceeded for instances"},
		{"neutron quota", 409, `{"NeutronError": {"type": "OverQuota", "message": "Quota exceeded for resources: ['port'].", "detail": ""}}`,
			region.ErrNoCapacity, "Quota exceeded for resources: ['port']."},
		{"neutron out of addresses", 409, `{"NeutronError": {"type": "IpAddressGenerationFailure", "message": "No more IP addresses available on network x.", "detail": ""}}`,
			region.ErrNoCapacity, "No more IP addresses available on network x."},
		{"neutron conflict", 409, `{"NeutronError": {"type": "InUse", "message": "Security group x in use.", "detail": ""}}`,
			region.ErrRefused, "Security group x in use."},
		{"not found", 404, `{"itemNotFound": {"code": 404, "message": "Instance x could not be found."}}`, errNotFound, "Instance x could not be found."},
		{"server error", 500, `{"computeFault": {"code": 500, "message": "Unexpected API Error."}}`, region.ErrUnavailable, "500 Unexpected API Error."},
		{"gateway", 502, `<html>Bad Gateway</html>`, region.ErrUnavailable, "502 Bad Gateway"},
		{"too many requests after the retries", 429, ``, region.ErrUnavailable, "429 Too Many Requests"},
		{"credentials refused", 401, `{"error": {"code": 401, "message": "The request you have made requires authentication."}}`,
			region.ErrUnavailable, "The request you have made requires authentication."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := fault("do it", gophercloud.ErrUnexpectedResponseCode{Actual: tc.status, Body: []byte(tc.body)})
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("fault: %v; want %v with %q", err, tc.want, tc.msg)
			}
			for _, other := range []error{region.ErrRefused, region.ErrNoCapacity, region.ErrUnavailable, errNotFound} {
				if other != tc.want && errors.Is(err, other) {
					t.Errorf("fault: %v is also %v", err, other)
				}
			}
		})
	}
}

func TestRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		header func() string
		least  time.Duration
	}{
		{func() string { return "1" }, time.Second},
		{func() string { return "" }, time.Second},
		// A date has whole seconds: two from now are more than one.
		{func() string { return time.Now().Add(2 * time.Second).UTC().Format(http.TimeFormat) }, time.Second},
		{func() string { return "-5" }, 0},
	} {
		began := time.Now()
		header := tc.header()
		resp := &gophercloud.ErrUnexpectedResponseCode{Actual: 429, ResponseHeader: http.Header{"Retry-After": {header}}}
		if err := retryAfter(t.Context(), resp, *resp, 1); err != nil {
			t.Errorf("Retry-After %q: %v", header, err)
		}
		if took := time.Since(began); took < tc.least || took > tc.least+2*time.Second {
			t.Errorf("Retry-After %q waited %s, want at least %s", header, took, tc.least)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	resp := &gophercloud.ErrUnexpectedResponseCode{Actual: 429, ResponseHeader: http.Header{"Retry-After": {"3600"}}}
	began := time.Now()
	if err := retryAfter(ctx, resp, *resp, 1); err == nil || time.Since(began) > time.Second {
		t.Errorf("a Retry-After beyond the context: %v after %s, want its end at once", err, time.Since(began))
	}
}

// TestUnreachableCloud: a cloud whose Keystone nothing listens for is ErrUnreachable, on every
// call, and a watch of it goes on until its context ends.
func TestUnreachableCloud(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	clouds := filepath.Join(t.TempDir(), "clouds.yaml")
	if err := os.WriteFile(clouds, []byte(`clouds:
  gone:
    auth:
      auth_url: http://`+addr+`/v3
      username: u
      password: p
      user_domain_name: Default
      project_name: p
      project_domain_name: Default
    region_name: RegionOne
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cat, err := region.Parse([]byte(`{"regions": [{"id": "os", "name": "OS", "driver": "openstack",
		"openstack": {"cloud": "gone", "requestTimeout": "5s", "pollInterval": "10ms"}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	mr := miniredis.RunT(t)
	d, err := New(Options{Region: cat.Regions[0], Catalog: cat, Redis: redis.NewClient(&redis.Options{Addr: mr.Addr()}),
		CloudsFile: clouds, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	for range 2 {
		if _, err := d.GetServer(t.Context(), "x"); !errors.Is(err, region.ErrUnreachable) {
			t.Errorf("GetServer of an unreachable cloud: %v, want ErrUnreachable", err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if err := d.Watch(ctx, "", func(region.Event) error { return errors.New("no event was expected") }); err != nil {
		t.Errorf("Watch of an unreachable cloud: %v, want nil once its context ended", err)
	}
}

func TestNewRefuses(t *testing.T) {
	cat, err := region.Parse([]byte(`{"regions": [{"id": "os", "name": "OS", "driver": "openstack", "openstack": {"cloud": "nowhere"}},
		{"id": "sim", "name": "Sim"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(t.TempDir(), "clouds.yaml")
	if err := os.WriteFile(empty, []byte("clouds: {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	for name, opts := range map[string]Options{
		"a sim region":          {Region: cat.Regions[1], Catalog: cat, Redis: rdb},
		"no catalogue":          {Region: cat.Regions[0], Redis: rdb, CloudsFile: empty},
		"no Redis":              {Region: cat.Regions[0], Catalog: cat, CloudsFile: empty},
		"a cloud not in clouds": {Region: cat.Regions[0], Catalog: cat, Redis: rdb, CloudsFile: empty},
	} {
		if _, err := New(opts); err == nil {
			t.Errorf("New with %s: no error", name)
		}
	}
}
