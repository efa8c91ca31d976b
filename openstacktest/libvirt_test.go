package openstacktest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"

	"github.com/computeql/computeql/virttest"
)

// TestOpenStackLibvirtCompute brings the control plane up with a libvirt compute on a private
// libvirtd, boots a real guest through Nova, reads what it wrote on its serial console through
// Nova's console log, snapshots it into Glance, and deletes both.
func TestOpenStackLibvirtCompute(t *testing.T) {
	virttest.Require(t)
	kernel, initrd := GuestImages(t)
	h := virttest.Start(t, virttest.Options{HostNetwork: true})
	c := Start(t, Options{Libvirt: &Libvirt{URI: h.URI, Kernel: kernel, Initrd: initrd}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pc, eo, err := c.Client(ctx)
	if err != nil {
		t.Fatal(err)
	}
	compute, err := openstack.NewComputeV2(pc, eo)
	if err != nil {
		t.Fatal(err)
	}
	compute.Microversion = "2.52"
	image, err := openstack.NewImageV2(pc, eo)
	if err != nil {
		t.Fatal(err)
	}

	srv, err := servers.Create(ctx, compute, servers.CreateOpts{
		Name: "guest", FlavorRef: c.FlavorID, ImageRef: c.ImageID, Networks: []servers.Network{{UUID: c.NetworkID}},
	}, nil).Extract()
	if err != nil {
		t.Fatalf("create server: %v", err)
	}
	err = poll(ctx, 500*time.Millisecond, "the server ACTIVE", nil, func() error {
		s, err := servers.Get(ctx, compute, srv.ID).Extract()
		if err != nil {
			return err
		}
		if s.Status == "ERROR" {
			t.Fatalf("server in ERROR: %s", s.Fault.Message)
		}
		if s.Status != "ACTIVE" {
			return fmt.Errorf("server %s", s.Status)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The guest's own words, from its serial console through the log Nova keeps of it.
	err = poll(ctx, time.Second, "the guest's boot on its console", nil, func() error {
		out, err := servers.ShowConsoleOutput(ctx, compute, srv.ID, servers.ShowConsoleOutputOpts{}).Extract()
		if err != nil {
			return err
		}
		if !strings.Contains(out, "computeql-guest: ready") {
			return fmt.Errorf("console has %d bytes, no ready line yet", len(out))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	imageID, err := servers.CreateImage(ctx, compute, srv.ID, servers.CreateImageOpts{Name: "guest-snapshot"}).ExtractImageID()
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	err = poll(ctx, 500*time.Millisecond, "the snapshot active in Glance", nil, func() error {
		im, err := images.Get(ctx, image, imageID).Extract()
		if err != nil {
			return err
		}
		if im.Status != images.ImageStatusActive {
			return fmt.Errorf("image %s", im.Status)
		}
		if im.SizeBytes == 0 || im.Properties["kernel_id"] == nil {
			t.Fatalf("the snapshot has %d bytes and properties %v, want the disk and the guest's kernel", im.SizeBytes, im.Properties)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := images.Delete(ctx, image, imageID).ExtractErr(); err != nil {
		t.Fatalf("delete the snapshot: %v", err)
	}
	if err := servers.Delete(ctx, compute, srv.ID).ExtractErr(); err != nil {
		t.Fatalf("delete server: %v", err)
	}
	err = poll(ctx, 500*time.Millisecond, "server deletion", nil, func() error {
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
