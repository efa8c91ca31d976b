package openstacktest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/floatingips"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"
)

// TestOpenStackControlPlane brings the control plane up and uses it as the region driver
// will: through clouds.yaml, it checks the seeded flavor, image and network, boots a server
// on the fake driver, waits for it to be ACTIVE with an ACTIVE port, gives the port a floating
// IP of the external network and releases it, and deletes the server.
func TestOpenStackControlPlane(t *testing.T) {
	c := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	if b, err := os.ReadFile(c.CloudsYAML); err != nil || len(b) == 0 {
		t.Fatalf("clouds.yaml: %v", err)
	}
	pc, eo, err := c.Client(ctx)
	if err != nil {
		t.Fatalf("authenticate through clouds.yaml: %v", err)
	}
	compute, err := openstack.NewComputeV2(pc, eo)
	if err != nil {
		t.Fatal(err)
	}
	image, err := openstack.NewImageV2(pc, eo)
	if err != nil {
		t.Fatal(err)
	}
	network, err := openstack.NewNetworkV2(pc, eo)
	if err != nil {
		t.Fatal(err)
	}

	fl, err := flavors.Get(ctx, compute, c.FlavorID).Extract()
	if err != nil || fl.VCPUs != 1 || fl.RAM != 64 {
		t.Fatalf("flavor %s: %+v, %v", c.FlavorID, fl, err)
	}
	im, err := images.Get(ctx, image, c.ImageID).Extract()
	if err != nil || im.Status != images.ImageStatusActive || im.SizeBytes != int64(len(ImageData)) {
		t.Fatalf("image %s: %+v, %v", c.ImageID, im, err)
	}
	nw, err := networks.Get(ctx, network, c.NetworkID).Extract()
	if err != nil || nw.Status != "ACTIVE" {
		t.Fatalf("network %s: %+v, %v", c.NetworkID, nw, err)
	}
	sn, err := subnets.Get(ctx, network, c.SubnetID).Extract()
	if err != nil || sn.NetworkID != c.NetworkID {
		t.Fatalf("subnet %s: %+v, %v", c.SubnetID, sn, err)
	}

	began := time.Now()
	srv, err := servers.Create(ctx, compute, servers.CreateOpts{
		Name: "computeql-probe", FlavorRef: c.FlavorID, ImageRef: c.ImageID,
		Networks: []servers.Network{{UUID: c.NetworkID}},
	}, nil).Extract()
	if err != nil {
		t.Fatalf("create server: %v", err)
	}
	var s *servers.Server
	err = poll(ctx, 200*time.Millisecond, "server", nil, func() error {
		s, err = servers.Get(ctx, compute, srv.ID).Extract()
		if err != nil {
			return err
		}
		if s.Status == "ACTIVE" || s.Status == "ERROR" {
			return nil
		}
		return errors.New("status " + s.Status)
	})
	if err != nil {
		t.Fatal(err)
	}
	if s.Status == "ERROR" {
		t.Fatalf("server went to ERROR: %s", s.Fault.Message)
	}
	t.Logf("server %s ACTIVE in %s", srv.ID, time.Since(began).Round(10*time.Millisecond))
	if s.TenantID != c.ProjectID {
		t.Errorf("server's project %s, want %s", s.TenantID, c.ProjectID)
	}

	// Nova published versioned notifications of the build on the control plane's RabbitMQ.
	err = poll(ctx, time.Second, "versioned notifications", nil, func() error {
		out, err := c.RabbitMQCtl(ctx, "list_queues", "name", "messages")
		if err != nil {
			return err
		}
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) == 2 && f[0] == "versioned_notifications.info" && f[1] != "0" {
				return nil
			}
		}
		return fmt.Errorf("no message in versioned_notifications.info: %s", out)
	})
	if err != nil {
		t.Fatal(err)
	}

	pages, err := ports.List(network, ports.ListOpts{DeviceID: srv.ID}).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := ports.ExtractPorts(pages)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 1 || ps[0].Status != "ACTIVE" || ps[0].NetworkID != c.NetworkID {
		t.Fatalf("server's ports: %+v", ps)
	}

	// The seeded router lets the external network's floating IPs reach the server's port.
	fip, err := floatingips.Create(ctx, network, floatingips.CreateOpts{FloatingNetworkID: c.ExternalNetworkID, PortID: ps[0].ID}).Extract()
	if err != nil {
		t.Fatalf("create a floating IP for the server's port: %v", err)
	}
	if !strings.HasPrefix(fip.FloatingIP, "198.51.100.") || fip.RouterID != c.RouterID {
		t.Errorf("floating IP %s through router %q, want one of 198.51.100.0/24 through %s", fip.FloatingIP, fip.RouterID, c.RouterID)
	}
	if err := floatingips.Delete(ctx, network, fip.ID).ExtractErr(); err != nil {
		t.Fatalf("delete the floating IP: %v", err)
	}

	if err := servers.Delete(ctx, compute, srv.ID).ExtractErr(); err != nil {
		t.Fatalf("delete server: %v", err)
	}
	err = poll(ctx, 200*time.Millisecond, "server deletion", nil, func() error {
		_, err := servers.Get(ctx, compute, srv.ID).Extract()
		if gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		return errors.New("still there")
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestRequireSkipsOrFails checks the rule for a missing OpenStack, with a binary that no
// machine has: the test is skipped, unless RequireEnv is 1, when it fails.
func TestRequireSkipsOrFails(t *testing.T) {
	saved := binaries
	binaries = append(append([]string(nil), saved...), "/nonexistent/openstack-service")
	t.Cleanup(func() { binaries = saved })
	for _, tc := range []struct {
		env        string
		fail, skip bool
	}{{"", false, true}, {"1", true, false}} {
		t.Setenv(RequireEnv, tc.env)
		r := &recorder{}
		done := make(chan struct{})
		go func() { defer close(done); Require(r) }()
		<-done
		if r.failed != tc.fail || r.skipped != tc.skip {
			t.Errorf("%s=%q: failed %v skipped %v (%s)", RequireEnv, tc.env, r.failed, r.skipped, r.msg)
		}
	}
}

// recorder is a testing.TB whose Fatalf and Skipf record the outcome and end the goroutine,
// as the real ones do.
type recorder struct {
	testing.TB
	failed, skipped bool
	msg             string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed, r.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *recorder) Skipf(format string, args ...any) {
	r.skipped, r.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}
