package openstack

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/security/groups"

	"github.com/computeql/computeql/e2e/harness"
	"github.com/computeql/computeql/openstacktest"
	"github.com/computeql/computeql/region"
	ostack "github.com/computeql/computeql/region/openstack"
)

// checkCatalogImport runs the built binary's catalog import against the cloud, as an
// operator would with the cloud's clouds.yaml, and checks that what it prints names the
// seeded flavor, image and network and the project's security groups by their cloud ids; that
// it does not load as it is (the placeholders must be replaced); and that, completed with an
// organization, it loads.
func checkCatalogImport(t *testing.T, cloud *openstacktest.Cloud, n *nova) {
	t.Helper()
	cmd := exec.Command(harness.Binary(t), "catalog", "import", "--cloud", openstacktest.CloudName, "--region-id", "lab")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OS_") && !strings.HasPrefix(kv, "COMPUTEQL_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "OS_CLIENT_CONFIG_FILE="+cloud.CloudsYAML)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("computeql catalog import: %v\n%s", err, stderr.Bytes())
	}
	t.Logf("computeql catalog import printed:\n%s\nand said:\n%s", stdout.Bytes(), stderr.Bytes())
	for _, p := range []string{ostack.PlaceholderOrganization, ostack.PlaceholderProject} {
		if !strings.Contains(stderr.String(), p) {
			t.Errorf("catalog import did not tell the operator to replace %q: %s", p, stderr.Bytes())
		}
	}
	if _, err := region.Parse(stdout.Bytes()); err == nil || !strings.Contains(err.Error(), ostack.PlaceholderOrganization) {
		t.Errorf("the fragment as printed: region.Parse answered %v, want the placeholder organization refused", err)
	}

	var doc map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &doc); err != nil {
		t.Fatalf("catalog import printed no JSON object: %v", err)
	}
	doc["organizations"] = []any{map[string]any{"id": org, "name": "Acme", "projects": []any{map[string]any{"id": project, "name": "Web"}}}}
	nets, _ := doc["networks"].([]any)
	for _, raw := range nets {
		net := raw.(map[string]any)
		if net["organizationId"] != ostack.PlaceholderOrganization || net["projectId"] != ostack.PlaceholderProject {
			t.Errorf("network %v is owned by %v/%v, want the placeholders", net["id"], net["organizationId"], net["projectId"])
		}
		net["organizationId"], net["projectId"] = org, project
	}
	completed, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	cat, err := region.Parse(completed)
	if err != nil {
		t.Fatalf("the fragment completed with organization %s: %v", org, err)
	}

	r, ok := cat.Region("lab")
	if !ok || r.Driver != region.DriverOpenStack || r.OpenStack.Cloud != openstacktest.CloudName {
		t.Errorf("regions %+v, want lab, driver openstack, cloud %s", cat.Regions, openstacktest.CloudName)
	}
	var flavor *region.Flavor
	for i, f := range cat.Flavors {
		if f.OpenStack != nil && f.OpenStack.ID == cloud.FlavorID {
			flavor = &cat.Flavors[i]
		}
	}
	// The seeded flavor: 1 vCPU, 256 MiB, 1 GiB of disk (1.07 GB).
	if flavor == nil || flavor.ID != "computeql.tiny" || flavor.CPUs != 1 || flavor.MemoryGiB != 1 || flavor.DiskGB != 2 || !flavor.OfferedIn("lab") {
		t.Errorf("flavors %+v, want computeql.tiny for Nova's %s: 1 cpu, 1 GiB, 2 GB, in lab", cat.Flavors, cloud.FlavorID)
	}
	var image *region.Image
	for i, im := range cat.Images {
		if im.OpenStack != nil && im.OpenStack.ID == cloud.ImageID {
			image = &cat.Images[i]
		}
	}
	if image == nil || image.ID != openstacktest.GuestImageName || image.State != region.ImageStateReady || image.SizeGiB != 1 {
		t.Errorf("images %+v, want %s for Glance's %s, ready, 1 GiB", cat.Images, openstacktest.GuestImageName, cloud.ImageID)
	}
	// The guest's kernel and initramfs, which the image names, are no images of servers.
	for _, im := range cat.Images {
		if im.OpenStack != nil && (im.OpenStack.ID == cloud.KernelImageID || im.OpenStack.ID == cloud.RamdiskImageID) {
			t.Errorf("image %s (Glance's %s) imported: it is the guest's kernel or initramfs", im.ID, im.OpenStack.ID)
		}
	}
	var network *region.Network
	for i, nw := range cat.Networks {
		if nw.OpenStack != nil && nw.OpenStack.ID == cloud.NetworkID {
			network = &cat.Networks[i]
		}
	}
	if network == nil || network.ID != "computeql-net" || network.Prefix.String() != prefix || network.Region != "lab" {
		t.Fatalf("networks %+v, want computeql-net for Neutron's %s, prefix %s, in lab", cat.Networks, cloud.NetworkID, prefix)
	}
	if flavor != nil && image != nil {
		if why := r.RunsFlavor(flavor); why != "" || region.DiskGiB(flavor.DiskGB) < image.SizeGiB {
			t.Errorf("the imported flavor cannot boot the imported image: %q, disk %d GB for %d GiB", why, flavor.DiskGB, image.SizeGiB)
		}
	}

	pages, err := groups.List(n.network, groups.ListOpts{ProjectID: cloud.ProjectID}).AllPages(context.Background())
	if err != nil {
		t.Fatalf("list security groups: %v", err)
	}
	sgs, err := groups.ExtractGroups(pages)
	if err != nil || len(sgs) == 0 {
		t.Fatalf("the project's security groups: %v, %v; want at least Neutron's default", sgs, err)
	}
	for _, g := range sgs {
		found := false
		for _, sg := range cat.SecurityGroups {
			found = found || (sg.OpenStack != nil && sg.OpenStack.ID == g.ID && sg.NetworkID == network.ID && sg.Name == g.Name)
		}
		if !found {
			t.Errorf("security group %s (%s) of the project is not on network %s: %+v", g.Name, g.ID, network.ID, cat.SecurityGroups)
		}
	}
}
