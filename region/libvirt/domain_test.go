package libvirt

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/computeql/computeql/region"
)

func TestRegionState(t *testing.T) {
	stopBy := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name      string
		state     golibvirt.DomainState
		reason    int32
		rec       record
		want      region.ServerState
		wantInMsg string
	}{
		{"running, guest has not taken its address", golibvirt.DomainRunning, 0, record{}, region.ServerBuilding, ""},
		{"running and built", golibvirt.DomainRunning, 0, record{Built: true}, region.ServerRunning, ""},
		{"running with a stop under way", golibvirt.DomainRunning, 0, record{Built: true, StopBy: stopBy}, region.ServerStopping, ""},
		{"shutting down", golibvirt.DomainShutdown, 0, record{Built: true}, region.ServerStopping, ""},
		{"shut off", golibvirt.DomainShutoff, int32(golibvirt.DomainShutoffShutdown), record{Built: true}, region.ServerStopped, ""},
		{"shut off after a crash", golibvirt.DomainShutoff, int32(golibvirt.DomainShutoffCrashed), record{Built: true}, region.ServerError, "crashed"},
		{"failed to start", golibvirt.DomainShutoff, int32(golibvirt.DomainShutoffFailed), record{}, region.ServerError, "failed to start"},
		{"crashed", golibvirt.DomainCrashed, 0, record{Built: true}, region.ServerError, "crashed"},
		{"could not be made", golibvirt.DomainShutoff, 0, record{Error: "no volume"}, region.ServerError, "no volume"},
		{"running with a soft reboot under way", golibvirt.DomainRunning, 0, record{Built: true, RebootBy: stopBy}, region.ServerRebooting, ""},
		{"shutting down for a soft reboot", golibvirt.DomainShutdown, 0, record{Built: true, RebootBy: stopBy}, region.ServerRebooting, ""},
		{"paused as it powers off for a soft reboot", golibvirt.DomainPaused, int32(golibvirt.DomainPausedShuttingDown), record{Built: true, RebootBy: stopBy}, region.ServerRebooting, ""},
		{"shut off by a soft reboot, to be started again", golibvirt.DomainShutoff, int32(golibvirt.DomainShutoffShutdown), record{Built: true, RebootBy: stopBy}, region.ServerRebooting, ""},
		{"crashed during a soft reboot", golibvirt.DomainCrashed, 0, record{Built: true, RebootBy: stopBy}, region.ServerError, "crashed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &server{state: tt.state, reason: tt.reason, rec: tt.rec}
			got, msg := s.regionState()
			if got != tt.want || !strings.Contains(msg, tt.wantInMsg) {
				t.Errorf("regionState() = %s %q, want %s with %q", got, msg, tt.want, tt.wantInMsg)
			}
		})
	}
}

func TestLastAddressAndBridgeName(t *testing.T) {
	for prefix, want := range map[string]string{"10.0.0.0/24": "10.0.0.255", "10.1.0.0/16": "10.1.255.255", "192.168.4.0/30": "192.168.4.3"} {
		if got := lastAddress(netip.MustParsePrefix(prefix)).String(); got != want {
			t.Errorf("lastAddress(%s) = %s, want %s", prefix, got, want)
		}
	}
	a, b := bridgeName(&region.Network{ID: strings.Repeat("n", 63)}), bridgeName(&region.Network{ID: "other"})
	if len(a) > 15 || a == b {
		t.Errorf("bridge names %q and %q: want at most 15 characters (the kernel's limit) and distinct", a, b)
	}
}

// TestDomainXML checks what a guest is given, and that the record survives the trip through
// the domain's metadata as libvirt stores it.
func TestDomainXML(t *testing.T) {
	rec := &record{
		Spec: region.ServerSpec{Scope: region.Scope{OrganizationID: "acme", RegionID: "lab"}, Name: "web-1",
			UserData: []byte("#!/bin/sh\necho '<&>'\n"), Tags: map[string]string{region.InstanceTag: "i-1"}},
		MAC: "52:54:00:00:00:01", IP: "10.0.0.2",
	}
	flavor := &region.Flavor{ID: "tiny", CPUs: 2, MemoryGiB: 1}
	tests := []struct {
		name                  string
		spec                  domainSpec
		disks, nics           int
		tcgCache, kernelBoot  bool
		hostPassthroughCPU    bool
		wantDomainType, agent string
	}{
		{"disk image under TCG", domainSpec{domainType: "qemu", image: &region.Image{File: "/base.qcow2"}, disk: "/pool/d.qcow2", seed: "/pool/s.iso"},
			2, 1, true, false, false, "qemu", agentChannel},
		{"direct kernel boot without disk under KVM", domainSpec{domainType: "kvm", image: &region.Image{Kernel: "/k", Initrd: "/i", Cmdline: "console=ttyS0"}, seed: "/pool/s.iso"},
			1, 1, false, true, true, "kvm", agentChannel},
		{"a server that could not be made", domainSpec{domainType: "qemu", image: &region.Image{File: "/base.qcow2"}},
			0, 0, true, false, false, "qemu", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.spec.name, tt.spec.id, tt.spec.flavor, tt.spec.rec, tt.spec.network = "computeql-x", "6f1b2c3d-0000-4000-8000-000000000001", flavor, rec, "computeql-net"
			doc, err := domainXML(tt.spec)
			if err != nil {
				t.Fatal(err)
			}
			var dom libvirtxml.Domain
			if err := dom.Unmarshal(doc); err != nil {
				t.Fatal(err)
			}
			if dom.Type != tt.wantDomainType || dom.Memory.Value != 1024 || dom.Memory.Unit != "MiB" || dom.VCPU.Value != 2 {
				t.Errorf("type %s, memory %d %s, vcpus %d: want %s, 1024 MiB, 2", dom.Type, dom.Memory.Value, dom.Memory.Unit, dom.VCPU.Value, tt.wantDomainType)
			}
			if got := dom.Features.TCG != nil && dom.Features.TCG.TBCache != nil; got != tt.tcgCache {
				t.Errorf("TCG translation cache set: %v, want %v", got, tt.tcgCache)
			}
			if got := dom.CPU != nil && dom.CPU.Mode == "host-passthrough"; got != tt.hostPassthroughCPU {
				t.Errorf("host CPU passed through: %v, want %v", got, tt.hostPassthroughCPU)
			}
			if got := dom.OS.Kernel != ""; got != tt.kernelBoot {
				t.Errorf("direct kernel boot: %v, want %v", got, tt.kernelBoot)
			}
			if len(dom.Devices.Disks) != tt.disks || len(dom.Devices.Interfaces) != tt.nics {
				t.Errorf("%d disks and %d NICs, want %d and %d", len(dom.Devices.Disks), len(dom.Devices.Interfaces), tt.disks, tt.nics)
			}
			if tt.disks > 0 {
				seed := dom.Devices.Disks[len(dom.Devices.Disks)-1]
				if seed.ReadOnly == nil || seed.Source.File.File != "/pool/s.iso" {
					t.Errorf("the seed disk is not the read-only seed volume: %+v", seed)
				}
			}
			if tt.nics > 0 && dom.Devices.Interfaces[0].MAC.Address != rec.MAC {
				t.Errorf("NIC MAC %s, want the reserved %s", dom.Devices.Interfaces[0].MAC.Address, rec.MAC)
			}
			agent := ""
			for _, ch := range dom.Devices.Channels {
				agent = ch.Target.VirtIO.Name
			}
			if agent != tt.agent {
				t.Errorf("agent channel %q, want %q", agent, tt.agent)
			}
			// libvirt keeps the metadata element as given; read it back as readServer does.
			s, err := decodeRecord(dom.Metadata.XML)
			if err != nil {
				t.Fatal(err)
			}
			if string(s.Spec.UserData) != string(rec.Spec.UserData) || s.Spec.Tags[region.InstanceTag] != "i-1" || s.IP != rec.IP {
				t.Errorf("record after the round trip: %+v, want %+v", s, rec)
			}
		})
	}
}
