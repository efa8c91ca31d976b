package region

import "testing"

// openStackRegion turns base's region "eu" into an OpenStack one of the cloud "prod"; edit then
// changes one thing.
func openStackRegion(edit func(c *Catalog, o *OpenStackRegion)) func(*Catalog) {
	return func(c *Catalog) {
		c.Regions[0].Driver = DriverOpenStack
		c.Regions[0].OpenStack = &OpenStackRegion{Cloud: "prod"}
		if edit != nil {
			edit(c, c.Regions[0].OpenStack)
		}
	}
}

func TestOpenStackRegionDefaults(t *testing.T) {
	for _, tc := range []struct {
		name, region string
		want         OpenStackRegion
	}{
		{"only a cloud", `{"id": "os", "name": "OS", "driver": "openstack", "openstack": {"cloud": "prod"}}`,
			OpenStackRegion{Cloud: "prod", RequestTimeout: "30s", PollInterval: "2s"}},
		{"settings given are kept", `{"id": "os", "name": "OS", "driver": "openstack",
			"openstack": {"cloud": "prod", "requestTimeout": "1m", "pollInterval": "500ms"}}`,
			OpenStackRegion{Cloud: "prod", RequestTimeout: "1m", PollInterval: "500ms"}},
		{"an external network", `{"id": "os", "name": "OS", "driver": "openstack", "openstack": {"cloud": "prod", "externalNetwork": "public"}}`,
			OpenStackRegion{Cloud: "prod", RequestTimeout: "30s", PollInterval: "2s", ExternalNetwork: "public"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(`{"regions": [` + tc.region + `]}`))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got := c.Regions[0].OpenStack; got == nil || *got != tc.want {
				t.Errorf("openstack settings %s, want %s", dump(got), dump(tc.want))
			}
			if got, want := c.Regions[0].OffersPublicIPs(), tc.want.ExternalNetwork != ""; got != want {
				t.Errorf("OffersPublicIPs = %t, want %t: an OpenStack region offers floating IPs of its external network only", got, want)
			}
		})
	}
}

func TestOpenStackParseRefuses(t *testing.T) {
	const eu = `catalog: regions[0] "eu": `
	for _, tc := range []struct {
		name   string
		modify func(*Catalog)
		want   string // the whole error: one fault, one message
	}{
		{"openstack without settings", func(c *Catalog) { c.Regions[0].Driver = DriverOpenStack },
			eu + `driver "openstack" needs "openstack": {"cloud": ...}, the cloud's name in clouds.yaml`},
		{"openstack settings of a sim region", func(c *Catalog) { c.Regions[0].OpenStack = &OpenStackRegion{Cloud: "prod"} },
			eu + `openstack settings given, but the driver is "sim"`},
		{"libvirt settings of an openstack region", openStackRegion(func(c *Catalog, _ *OpenStackRegion) {
			c.Regions[0].Libvirt = &LibvirtRegion{URI: "qemu:///system"}
		}), eu + `libvirt settings given, but the driver is "openstack"`},
		{"no cloud", openStackRegion(func(_ *Catalog, o *OpenStackRegion) { o.Cloud = "" }),
			eu + `openstack: cloud "" is not a clouds.yaml cloud name (letters, digits, '.', '_' and '-')`},
		{"cloud with a space", openStackRegion(func(_ *Catalog, o *OpenStackRegion) { o.Cloud = "my cloud" }),
			eu + `openstack: cloud "my cloud" is not a clouds.yaml cloud name (letters, digits, '.', '_' and '-')`},
		{"requestTimeout not a duration", openStackRegion(func(_ *Catalog, o *OpenStackRegion) { o.RequestTimeout = "30" }),
			eu + `openstack: requestTimeout "30" is not a positive duration such as 30s`},
		{"zero pollInterval", openStackRegion(func(_ *Catalog, o *OpenStackRegion) { o.PollInterval = "0s" }),
			eu + `openstack: pollInterval "0s" is not a positive duration such as 2s`},
		{"externalNetwork with a trailing space", openStackRegion(func(_ *Catalog, o *OpenStackRegion) { o.ExternalNetwork = "public " }),
			eu + `openstack: externalNetwork "public " is not a Neutron network id or name`},
		{"externalNetwork with a line break", openStackRegion(func(_ *Catalog, o *OpenStackRegion) { o.ExternalNetwork = "pub\nlic" }),
			eu + `openstack: externalNetwork "pub\nlic" is not a Neutron network id or name`},
		{"flavor ref without an id or a name", openStackRegion(func(c *Catalog, _ *OpenStackRegion) { c.Flavors[0].OpenStack = &OpenStackRef{} }),
			`catalog: flavors[0] "f1": openstack: give the cloud's id or name of the object, one of them`},
		{"flavor ref with an id and a name", openStackRegion(func(c *Catalog, _ *OpenStackRegion) {
			c.Flavors[0].OpenStack = &OpenStackRef{ID: "42", Name: "m1.small"}
		}), `catalog: flavors[0] "f1": openstack: give the cloud's id or name of the object, one of them`},
		{"image ref in a sim region", func(c *Catalog) { c.Images[0].OpenStack = &OpenStackRef{ID: "glance-id"} },
			`catalog: images[0] "i1": openstack settings given, but no OpenStack region offers it`},
		{"network ref in a sim region", func(c *Catalog) { c.Networks[0].OpenStack = &OpenStackRef{ID: "neutron-id"} },
			`catalog: networks[0] "net-a": openstack settings given, but no OpenStack region offers it`},
		{"security group ref on a network of a sim region", func(c *Catalog) { c.SecurityGroups[0].OpenStack = &OpenStackRef{ID: "sg"} },
			`catalog: securityGroups[0] "sg-a": openstack settings given, but no OpenStack region offers it`},
	} {
		t.Run(tc.name, func(t *testing.T) { refusedExactly(t, tc.modify, tc.want) })
	}
}

func TestOpenStackParseAccepts(t *testing.T) {
	for _, tc := range []struct {
		name   string
		modify func(*Catalog)
	}{
		{"openstack region", openStackRegion(nil)},
		{"cloud name with dots, dashes and underscores", openStackRegion(func(_ *Catalog, o *OpenStackRegion) { o.Cloud = "Prod_1.a-b" })},
		{"external network named with a space inside", openStackRegion(func(_ *Catalog, o *OpenStackRegion) { o.ExternalNetwork = "public net" })},
		{"every entry naming its cloud object", openStackRegion(func(c *Catalog, _ *OpenStackRegion) {
			c.Flavors[0].OpenStack = &OpenStackRef{ID: "m1.small"}
			c.Images[0].OpenStack = &OpenStackRef{ID: "6a0c0f5e-1b1e-4b0e-9a36-3f0c6f4a7d11"}
			c.Networks[0].OpenStack = &OpenStackRef{ID: "0b6d8a6c-7e55-4a4b-b1ab-0e2c1a9d5f00"}
			c.SecurityGroups[0].OpenStack = &OpenStackRef{ID: "2f1e3c1a-0a6b-4c5e-8a2f-9d8c7b6a5e4d"}
		})},
		{"every entry naming its cloud object by name", openStackRegion(func(c *Catalog, _ *OpenStackRegion) {
			c.Flavors[0].OpenStack = &OpenStackRef{Name: "m1.small"}
			c.Images[0].OpenStack = &OpenStackRef{Name: "debian-12"}
			c.Networks[0].OpenStack = &OpenStackRef{Name: "private"}
			c.SecurityGroups[0].OpenStack = &OpenStackRef{Name: "ssh"}
		})},
		{"image offered in a sim and an openstack region", openStackRegion(func(c *Catalog, _ *OpenStackRegion) {
			c.Images[0].Regions = []string{"us", "eu"}
			c.Images[0].OpenStack = &OpenStackRef{ID: "glance-id"}
		})},
		{"ready image with nothing to boot", openStackRegion(func(c *Catalog, _ *OpenStackRegion) { c.Images[0].File = "" })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := parseModified(t, tc.modify); err != nil {
				t.Fatalf("refused:\n%v", err)
			}
		})
	}
}
