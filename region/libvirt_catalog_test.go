package region

import (
	"encoding/json"
	"reflect"
	"testing"
)

// libvirtRegion turns base's region "eu" into a libvirt one on the local system daemon and gives
// its image a disk to boot, so that the catalogue stays valid; edit then changes one thing.
func libvirtRegion(edit func(c *Catalog, l *LibvirtRegion)) func(*Catalog) {
	return func(c *Catalog) {
		c.Regions[0].Driver = DriverLibvirt
		c.Regions[0].Libvirt = &LibvirtRegion{URI: "qemu:///system"}
		c.Images[0].File = "/srv/images/i1.qcow2"
		if edit != nil {
			edit(c, c.Regions[0].Libvirt)
		}
	}
}

func TestLibvirtRegionDefaults(t *testing.T) {
	for _, tc := range []struct {
		name   string
		region string // the region's JSON
		want   Region
	}{
		{"sim by default", `{"id": "eu", "name": "EU"}`, Region{ID: "eu", Name: "EU", Driver: DriverSim}},
		{"sim named", `{"id": "eu", "name": "EU", "driver": "sim"}`, Region{ID: "eu", Name: "EU", Driver: DriverSim}},
		{"libvirt with only a uri", `{"id": "eu", "name": "EU", "driver": "libvirt", "libvirt": {"uri": "qemu:///system"}}`,
			Region{ID: "eu", Name: "EU", Driver: DriverLibvirt, Libvirt: &LibvirtRegion{
				URI: "qemu:///system", Pool: "computeql", PoolPath: "/var/lib/libvirt/images/computeql", Accel: AccelAuto, StopTimeout: "60s", BuildTimeout: "10m",
			}}},
		{"libvirt pool path follows the pool", `{"id": "eu", "name": "EU", "driver": "libvirt", "libvirt": {"uri": "qemu:///system", "pool": "fast"}}`,
			Region{ID: "eu", Name: "EU", Driver: DriverLibvirt, Libvirt: &LibvirtRegion{
				URI: "qemu:///system", Pool: "fast", PoolPath: "/var/lib/libvirt/images/fast", Accel: AccelAuto, StopTimeout: "60s", BuildTimeout: "10m",
			}}},
		{"libvirt settings given are kept", `{"id": "eu", "name": "EU", "driver": "libvirt", "libvirt": {"uri": "qemu+tcp://host/system",
			"pool": "p", "poolPath": "/data/p", "accel": "tcg", "stopTimeout": "2m30s", "buildTimeout": "20m"}}`,
			Region{ID: "eu", Name: "EU", Driver: DriverLibvirt, Libvirt: &LibvirtRegion{
				URI: "qemu+tcp://host/system", Pool: "p", PoolPath: "/data/p", Accel: AccelTCG, StopTimeout: "2m30s", BuildTimeout: "20m",
			}}},
		{"libvirt hosts", `{"id": "eu", "name": "EU", "driver": "libvirt", "libvirt": {"hosts": [
			{"name": "a", "uri": "qemu+tcp://a/system"}, {"name": "b", "uri": "qemu+tcp://b/system", "poolPath": "/data/b"}]}}`,
			Region{ID: "eu", Name: "EU", Driver: DriverLibvirt, Libvirt: &LibvirtRegion{
				Hosts: []LibvirtHost{{Name: "a", URI: "qemu+tcp://a/system"}, {Name: "b", URI: "qemu+tcp://b/system", PoolPath: "/data/b"}},
				Pool:  "computeql", PoolPath: "/var/lib/libvirt/images/computeql", Accel: AccelAuto, StopTimeout: "60s", BuildTimeout: "10m",
			}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(`{"regions": [` + tc.region + `]}`))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			got := c.Regions[0]
			if got.ID != tc.want.ID || got.Name != tc.want.Name || got.Driver != tc.want.Driver ||
				(got.Libvirt == nil) != (tc.want.Libvirt == nil) || got.Libvirt != nil && !reflect.DeepEqual(*got.Libvirt, *tc.want.Libvirt) {
				t.Errorf("region %s, want %s", dump(got), dump(tc.want))
			}
		})
	}
}

func dump(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestLibvirtParseRefuses(t *testing.T) {
	const eu, i1 = `catalog: regions[0] "eu": `, `catalog: images[0] "i1": `
	image := func(edit func(im *Image)) func(*Catalog) {
		return func(c *Catalog) { edit(&c.Images[0]) }
	}
	for _, tc := range []struct {
		name   string
		modify func(*Catalog)
		want   string // the whole error: one fault, one message
	}{
		{"unknown driver", func(c *Catalog) { c.Regions[0].Driver = "xen" }, eu + `unknown driver "xen" (want sim, libvirt or openstack)`},
		{"driver in upper case", func(c *Catalog) { c.Regions[0].Driver = "LIBVIRT" }, eu + `unknown driver "LIBVIRT" (want sim, libvirt or openstack)`},
		{"libvirt without settings", func(c *Catalog) {
			c.Regions[0].Driver = DriverLibvirt
			c.Images[0].File = "/srv/images/i1.qcow2"
		}, eu + `driver "libvirt" needs "libvirt": {"uri": ...}`},
		{"libvirt settings of a default sim region", func(c *Catalog) { c.Regions[0].Libvirt = &LibvirtRegion{URI: "qemu:///system"} },
			eu + `libvirt settings given, but the driver is "sim"`},
		{"libvirt settings of a sim region", func(c *Catalog) {
			c.Regions[0].Driver = DriverSim
			c.Regions[0].Libvirt = &LibvirtRegion{URI: "qemu:///system"}
		}, eu + `libvirt settings given, but the driver is "sim"`},
		{"no uri", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) { l.URI = "" }), eu + `libvirt: "uri" (one host) or "hosts" (several) is missing`},
		{"uri and hosts", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) { l.Hosts = twoHosts() }),
			eu + `libvirt: give "uri" for a region of one host or "hosts" for several, not both`},
		{"host without a name", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) { l.URI, l.Hosts = "", twoHosts(); l.Hosts[1].Name = "" }),
			eu + `libvirt: hosts[1] "": name: want lower-case letters, digits and '-', at most 63`},
		{"host name in upper case", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) { l.URI, l.Hosts = "", twoHosts(); l.Hosts[0].Name = "Rack1" }),
			eu + `libvirt: hosts[0] "Rack1": name: want lower-case letters, digits and '-', at most 63`},
		{"host name twice", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) { l.URI, l.Hosts = "", twoHosts(); l.Hosts[1].Name = "rack1" }),
			eu + `libvirt: hosts[1] "rack1": duplicate host name`},
		{"host uri twice", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) { l.URI, l.Hosts = "", twoHosts(); l.Hosts[1].URI = l.Hosts[0].URI }),
			eu + `libvirt: hosts[1] "rack2": uri "qemu+tcp://rack1/system" names a host listed before`},
		{"host uri twice, once with its default port", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) {
			l.URI, l.Hosts = "", twoHosts()
			l.Hosts[1].URI = "qemu+tcp://rack1:16509/system"
		}), eu + `libvirt: hosts[1] "rack2": uri "qemu+tcp://rack1:16509/system" names a host listed before`},
		{"host without a uri", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) { l.URI, l.Hosts = "", twoHosts(); l.Hosts[1].URI = "" }),
			eu + `libvirt: hosts[1] "rack2": uri is missing`},
		{"host with a relative poolPath", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) { l.URI, l.Hosts = "", twoHosts(); l.Hosts[0].PoolPath = "pool" }),
			eu + `libvirt: hosts[0] "rack1": poolPath "pool" is not an absolute path`},
		{"session uri", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) { l.URI = "qemu:///session" }),
			eu + `libvirt: uri "qemu:///session": want the system daemon (path /system): a session daemon cannot make networks`},
		{"ssh uri with a password", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) { l.URI = "qemu+ssh://root:secret@host/system" }),
			eu + `libvirt: uri "qemu+ssh://root:secret@host/system": a password does not belong in the catalogue; log in with a key (keyfile=)`},
		{"unknown accel", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) { l.Accel = "hvf" }),
			eu + `libvirt: unknown accel "hvf" (want auto, kvm or tcg)`},
		{"stopTimeout not a duration", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) { l.StopTimeout = "60" }),
			eu + `libvirt: stopTimeout "60" is not a positive duration such as 60s`},
		{"zero stopTimeout", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) { l.StopTimeout = "0s" }),
			eu + `libvirt: stopTimeout "0s" is not a positive duration such as 60s`},
		{"negative stopTimeout", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) { l.StopTimeout = "-5s" }),
			eu + `libvirt: stopTimeout "-5s" is not a positive duration such as 60s`},
		{"buildTimeout not a duration", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) { l.BuildTimeout = "ten minutes" }),
			eu + `libvirt: buildTimeout "ten minutes" is not a positive duration such as 10m`},
		{"zero buildTimeout", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) { l.BuildTimeout = "0" }),
			eu + `libvirt: buildTimeout "0" is not a positive duration such as 10m`},
		{"relative poolPath", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) { l.PoolPath = "images/computeql" }),
			eu + `libvirt: poolPath "images/computeql" is not an absolute path`},
		{"pool with a space", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) { l.Pool = "my pool" }),
			eu + `libvirt: pool "my pool": want letters, digits, '.', '_' and '-'`},
		{"pool with a slash", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) { l.Pool, l.PoolPath = "a/b", "/p" }),
			eu + `libvirt: pool "a/b": want letters, digits, '.', '_' and '-'`},
		{"pool starting with a dot", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) { l.Pool = ".." }),
			eu + `libvirt: pool "..": want letters, digits, '.', '_' and '-'`},

		{"relative image file", image(func(im *Image) { im.File = "disks/i1.qcow2" }), i1 + `file "disks/i1.qcow2" is not an absolute path`},
		{"relative kernel", image(func(im *Image) { im.Kernel = "vmlinuz" }), i1 + `kernel "vmlinuz" is not an absolute path`},
		{"relative initrd", image(func(im *Image) { im.Kernel, im.Initrd = "/boot/vmlinuz", "initrd.img" }),
			i1 + `initrd "initrd.img" is not an absolute path`},
		{"bad volume name", image(func(im *Image) { im.Volume = "base/i1" }), i1 + `volume "base/i1": want letters, digits, '.', '_' and '-'`},
		{"file and volume", image(func(im *Image) { im.File, im.Volume = "/srv/i1.qcow2", "i1-base" }), i1 + `give file or volume, not both`},
		{"initrd without kernel", image(func(im *Image) { im.File, im.Initrd = "/srv/i1.qcow2", "/boot/initrd.img" }),
			i1 + `initrd given without a kernel`},
		{"cmdline without kernel", image(func(im *Image) { im.File, im.Cmdline = "/srv/i1.qcow2", "console=ttyS0" }),
			i1 + `cmdline given without a kernel`},
		{"ready image with nothing to boot in a libvirt region", libvirtRegion(func(c *Catalog, _ *LibvirtRegion) { c.Images[0].File = "" }),
			i1 + `offered in a libvirt region: needs a file, a volume or a kernel to boot`},
		{"ready image with nothing to boot in a sim and a libvirt region", func(c *Catalog) {
			c.Regions[1].Driver, c.Regions[1].Libvirt = DriverLibvirt, &LibvirtRegion{URI: "qemu:///system"}
			c.Images[0].Regions = []string{"eu", "us"}
		}, i1 + `offered in a libvirt region: needs a file, a volume or a kernel to boot`},
		{"ready image with only an initrd in a libvirt region", libvirtRegion(func(c *Catalog, _ *LibvirtRegion) {
			c.Images[0].File, c.Images[0].Initrd = "", "/boot/initrd.img"
		}), i1 + `initrd given without a kernel`},
	} {
		t.Run(tc.name, func(t *testing.T) { refusedExactly(t, tc.modify, tc.want) })
	}
}

func TestLibvirtParseAccepts(t *testing.T) {
	for _, tc := range []struct {
		name   string
		modify func(*Catalog)
	}{
		{"libvirt region with a file image", libvirtRegion(nil)},
		{"kvm", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) { l.Accel = AccelKVM })},
		{"tcg", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) { l.Accel = AccelTCG })},
		{"auto named", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) { l.Accel = AccelAuto })},
		{"sub-second stopTimeout", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) { l.StopTimeout = "500ms" })},
		{"hour-long buildTimeout", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) { l.BuildTimeout = "1h" })},
		{"socket uri", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) { l.URI = "qemu+unix:///system?socket=/run/libvirt/libvirt-sock" })},
		{"tcp uri", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) { l.URI = "qemu+tcp://kvm1.example:16510/system" })},
		{"pool with dots, dashes and underscores", libvirtRegion(func(_ *Catalog, l *LibvirtRegion) { l.Pool = "Pool_1.a-b" })},
		{"volume image", libvirtRegion(func(c *Catalog, _ *LibvirtRegion) { c.Images[0].File, c.Images[0].Volume = "", "i1-base.qcow2" })},
		{"kernel and initrd without a disk", libvirtRegion(func(c *Catalog, _ *LibvirtRegion) {
			im := &c.Images[0]
			im.File, im.Kernel, im.Initrd, im.Cmdline = "", "/boot/vmlinuz", "/boot/initramfs.cpio.gz", "console=ttyS0 quiet"
		})},
		{"kernel with a disk", libvirtRegion(func(c *Catalog, _ *LibvirtRegion) { c.Images[0].Kernel = "/boot/vmlinuz" })},
		{"pending image with nothing to boot", libvirtRegion(func(c *Catalog, _ *LibvirtRegion) {
			c.Images[0].File, c.Images[0].State = "", ImageStatePending
		})},
		{"failed image with nothing to boot", libvirtRegion(func(c *Catalog, _ *LibvirtRegion) {
			c.Images[0].File, c.Images[0].State = "", ImageStateFailed
		})},
		{"ready image with nothing to boot in sim regions only", func(c *Catalog) {
			c.Regions[1].Driver, c.Regions[1].Libvirt = DriverLibvirt, &LibvirtRegion{URI: "qemu:///system"}
		}},
		{"boot fields in a sim region", func(c *Catalog) { c.Images[0].File = "/srv/i1.qcow2" }},
		{"two libvirt regions on different hosts", func(c *Catalog) {
			for i, uri := range []string{"qemu+tcp://a/system", "qemu+tcp://b/system"} {
				c.Regions[i].Driver, c.Regions[i].Libvirt = DriverLibvirt, &LibvirtRegion{URI: uri}
			}
			c.Images[0].Volume = "i1"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := parseModified(t, tc.modify); err != nil {
				t.Fatalf("refused:\n%v", err)
			}
		})
	}
}

func TestParseLibvirtURI(t *testing.T) {
	const system = "qemu:///system"
	for _, tc := range []struct {
		uri  string
		want LibvirtURI
	}{
		{"qemu:///system", LibvirtURI{Network: "unix", Address: "/var/run/libvirt/libvirt-sock", Name: system}},
		{"qemu+unix:///system", LibvirtURI{Network: "unix", Address: "/var/run/libvirt/libvirt-sock", Name: system}},
		{"qemu+unix:///system?socket=/x/y", LibvirtURI{Network: "unix", Address: "/x/y", Name: system}},
		{"qemu:///system?socket=/run/libvirt/libvirt-sock", LibvirtURI{Network: "unix", Address: "/run/libvirt/libvirt-sock", Name: system}},
		{"qemu+tcp://h/system", LibvirtURI{Network: "tcp", Address: "h:16509", Name: system}},
		{"qemu+tcp://h:1234/system", LibvirtURI{Network: "tcp", Address: "h:1234", Name: system}},
		{"qemu+tcp://192.0.2.7/system", LibvirtURI{Network: "tcp", Address: "192.0.2.7:16509", Name: system}},
		{"qemu+tcp://[2001:db8::1]:1234/system", LibvirtURI{Network: "tcp", Address: "[2001:db8::1]:1234", Name: system}},
		{"qemu+tcp://[2001:db8::1]/system", LibvirtURI{Network: "tcp", Address: "[2001:db8::1]:16509", Name: system}},
		{"qemu+ssh://h/system", LibvirtURI{Network: "ssh", Address: "h:22", Name: system,
			SSH: LibvirtSSH{Socket: "/var/run/libvirt/libvirt-sock"}}},
		{"qemu+ssh://ops@h:2222/system?socket=/run/l.sock&keyfile=/k/id&known_hosts=/k/hosts", LibvirtURI{Network: "ssh", Address: "h:2222", Name: system,
			SSH: LibvirtSSH{User: "ops", Socket: "/run/l.sock", KeyFile: "/k/id", KnownHosts: "/k/hosts"}}},
	} {
		t.Run(tc.uri, func(t *testing.T) {
			got, err := ParseLibvirtURI(tc.uri)
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestParseLibvirtURIRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, uri, want string
	}{
		{"empty", "", "uri is missing"},
		{"session daemon", "qemu:///session",
			`uri "qemu:///session": want the system daemon (path /system): a session daemon cannot make networks`},
		{"session over tcp", "qemu+tcp://h/session",
			`uri "qemu+tcp://h/session": want the system daemon (path /system): a session daemon cannot make networks`},
		{"no path", "qemu+tcp://h", `uri "qemu+tcp://h": want the system daemon (path /system): a session daemon cannot make networks`},
		{"trailing slash", "qemu:///system/", `uri "qemu:///system/": want the system daemon (path /system): a session daemon cannot make networks`},
		{"ssh without a host", "qemu+ssh:///system", `uri "qemu+ssh:///system": qemu+ssh needs a host`},
		{"ssh session", "qemu+ssh://h/session", `uri "qemu+ssh://h/session": want the system daemon (path /system): a session daemon cannot make networks`},
		{"ssh with a password", "qemu+ssh://u:p@h/system", `uri "qemu+ssh://u:p@h/system": a password does not belong in the catalogue; log in with a key (keyfile=)`},
		{"ssh unknown parameter", "qemu+ssh://h/system?no_verify=1",
			`uri "qemu+ssh://h/system?no_verify=1": parameter no_verify is not supported over ssh (want socket, keyfile or known_hosts)`},
		{"ssh relative keyfile", "qemu+ssh://h/system?keyfile=id_ed25519", `uri "qemu+ssh://h/system?keyfile=id_ed25519": keyfile "id_ed25519" is not an absolute path`},
		{"ssh keyfile twice", "qemu+ssh://h/system?keyfile=/a&keyfile=/b", `uri "qemu+ssh://h/system?keyfile=/a&keyfile=/b": parameter keyfile given 2 times`},
		{"tls", "qemu+tls://h/system", `uri "qemu+tls://h/system": scheme "qemu+tls" is not supported (want qemu, qemu+unix, qemu+tcp or qemu+ssh)`},
		{"xen", "xen:///system", `uri "xen:///system": scheme "xen" is not supported (want qemu, qemu+unix, qemu+tcp or qemu+ssh)`},
		{"relative socket", "qemu+unix:///system?socket=run/libvirt-sock",
			`uri "qemu+unix:///system?socket=run/libvirt-sock": socket "run/libvirt-sock" is not an absolute path`},
		{"empty socket", "qemu:///system?socket=", `uri "qemu:///system?socket=": socket "" is not an absolute path`},
		{"unknown parameter", "qemu:///system?mode=legacy", `uri "qemu:///system?mode=legacy": only the parameter socket is supported`},
		{"socket twice", "qemu:///system?socket=/a&socket=/b", `uri "qemu:///system?socket=/a&socket=/b": only the parameter socket is supported`},
		{"parameters over tcp", "qemu+tcp://h/system?socket=/a", `uri "qemu+tcp://h/system?socket=/a": parameters are not supported over tcp`},
		{"host on a local uri", "qemu://h/system", `uri "qemu://h/system": a local URI has no host; use qemu+tcp://h/system`},
		{"host on a unix uri", "qemu+unix://h:1/system", `uri "qemu+unix://h:1/system": a local URI has no host; use qemu+tcp://h:1/system`},
		{"tcp without a host", "qemu+tcp:///system", `uri "qemu+tcp:///system": qemu+tcp needs a host`},
		{"tcp with only a port", "qemu+tcp://:16509/system", `uri "qemu+tcp://:16509/system": qemu+tcp needs a host`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseLibvirtURI(tc.uri)
			if err == nil {
				t.Fatalf("accepted as %+v; want %q", got, tc.want)
			}
			if err.Error() != tc.want {
				t.Errorf("error:\n%v\nwant exactly\n%s", err, tc.want)
			}
			if got != (LibvirtURI{}) {
				t.Errorf("returned %+v along with the error", got)
			}
		})
	}
	t.Run("not a URL", func(t *testing.T) {
		if _, err := ParseLibvirtURI("qemu+tcp://h:port/system"); err == nil {
			t.Errorf("accepted a URI with a port that is not a number")
		}
	})
}

func TestRegionOffers(t *testing.T) {
	plain := &Flavor{ID: "plain"}
	gpu := &Flavor{ID: "gpu", GPU: &GPU{Vendor: "NVIDIA", Model: "A100", MemoryGiB: 80, PhysicalCount: 1}}
	metal := &Flavor{ID: "metal", Baremetal: true}
	gpuMetal := &Flavor{ID: "gpu-metal", Baremetal: true, GPU: gpu.GPU}
	const noGPU, noMetal = "it runs virtual machines on libvirt hosts, without GPUs", "it runs virtual machines on libvirt hosts, not bare metal"
	for _, tc := range []struct {
		name      string
		region    Region
		publicIPs bool
		runs      map[*Flavor]string // flavor → why not ("" runs it)
	}{
		{"sim", Region{ID: "r", Driver: DriverSim}, true, map[*Flavor]string{plain: "", gpu: "", metal: "", gpuMetal: ""}},
		// A region written as a literal, not parsed, has no driver yet: the default, sim.
		{"no driver", Region{ID: "r"}, true, map[*Flavor]string{plain: "", gpu: "", metal: "", gpuMetal: ""}},
		{"libvirt", Region{ID: "r", Driver: DriverLibvirt, Libvirt: &LibvirtRegion{URI: "qemu:///system"}}, false,
			map[*Flavor]string{plain: "", gpu: noGPU, metal: noMetal, gpuMetal: noGPU}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.region.OffersPublicIPs(); got != tc.publicIPs {
				t.Errorf("OffersPublicIPs = %t, want %t", got, tc.publicIPs)
			}
			for f, want := range tc.runs {
				if got := tc.region.RunsFlavor(f); got != want {
					t.Errorf("RunsFlavor(%s) = %q, want %q", f.ID, got, want)
				}
			}
		})
	}
}

// The example catalogue of docs/libvirt.md of a libvirt region loads as it is.
func TestExampleLibvirtCatalogLoads(t *testing.T) {
	c, err := Load("../docs/libvirt/catalog.json")
	if err != nil {
		t.Fatal(err)
	}
	if lab, ok := c.Region("lab"); !ok || lab.Driver != DriverLibvirt {
		t.Errorf("region lab: %+v, want a libvirt region", lab)
	}
	if sg, ok := c.SecurityGroup("lab-web"); !ok || len(sg.Rules) != 2 {
		t.Errorf("security group lab-web: %+v, want its two rules", sg)
	}
}

// twoHosts are two valid hosts of a libvirt region.
func twoHosts() []LibvirtHost {
	return []LibvirtHost{{Name: "rack1", URI: "qemu+tcp://rack1/system"}, {Name: "rack2", URI: "qemu+tcp://rack2/system"}}
}

func TestLibvirtHostList(t *testing.T) {
	for _, tc := range []struct {
		name   string
		region LibvirtRegion
		want   []LibvirtHost
	}{
		{"one host by uri", LibvirtRegion{URI: "qemu:///system", Pool: "p", PoolPath: "/data/p"},
			[]LibvirtHost{{Name: DefaultLibvirtHost, URI: "qemu:///system", Pool: "p", PoolPath: "/data/p"}}},
		{"hosts take the region's pool, and its path unless they give one",
			LibvirtRegion{Hosts: []LibvirtHost{{Name: "a", URI: "qemu+tcp://a/system"}, {Name: "b", URI: "qemu+tcp://b/system", PoolPath: "/b"}}, Pool: "p", PoolPath: "/data/p"},
			[]LibvirtHost{{Name: "a", URI: "qemu+tcp://a/system", Pool: "p", PoolPath: "/data/p"}, {Name: "b", URI: "qemu+tcp://b/system", Pool: "p", PoolPath: "/b"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.region.HostList(); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("HostList() = %+v, want %+v", got, tc.want)
			}
		})
	}
}
