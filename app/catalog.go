package app

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/computeql/computeql/region/openstack"
)

const catalogUsage = `Usage: computeql catalog import --cloud NAME [flags]

Prints the catalogue entries of an OpenStack cloud's flavors, images, networks and security
groups, as JSON, for an operator to complete: computeql catalog import -h lists its flags.
`

// catalogCommand runs computeql catalog SUBCOMMAND; import is its one subcommand.
func catalogCommand(ctx context.Context, args []string, out io.Writer) error {
	switch {
	case len(args) > 0 && args[0] == "import":
		return importCatalog(ctx, args[1:], out, os.Stderr)
	case len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help"):
		_, err := io.WriteString(out, catalogUsage)
		return err
	}
	return errors.New("catalog needs a subcommand: import (computeql catalog import -h)")
}

// importCatalog prints the catalogue entries of an OpenStack cloud's flavors, images, networks
// and security groups (openstack.Describe) as JSON that region.Parse reads once completed,
// and on notes what the operator must complete and what was left out.
func importCatalog(ctx context.Context, args []string, out, notes io.Writer) error {
	fs := flag.NewFlagSet("computeql catalog import", flag.ContinueOnError)
	fs.SetOutput(out)
	var opts openstack.DescribeOptions
	fs.StringVar(&opts.Cloud, "cloud", "", "the cloud's name in clouds.yaml (required)")
	fs.StringVar(&opts.CloudsFile, "clouds-file", "", "the clouds.yaml to read (none: where OpenStack's tools look: $OS_CLIENT_CONFIG_FILE, ./clouds.yaml, ~/.config/openstack/clouds.yaml, /etc/openstack/clouds.yaml)")
	fs.StringVar(&opts.RegionID, "region-id", "", "the catalogue id of the region (none: the cloud's name, as an id)")
	fs.DurationVar(&opts.RequestTimeout, "request-timeout", 30*time.Second, "bound on each call to the cloud")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if opts.Cloud == "" {
		return errors.New("catalog import needs --cloud, the cloud's name in clouds.yaml")
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("catalog import: unexpected arguments %q", fs.Args())
	}
	cat, skipped, err := openstack.Describe(ctx, opts)
	if err != nil {
		return err
	}
	doc, err := json.MarshalIndent(cat, "", "  ")
	if err != nil {
		return fmt.Errorf("catalog import: %w", err)
	}
	if _, err := fmt.Fprintf(out, "%s\n", doc); err != nil {
		return err
	}
	fmt.Fprintf(notes, "catalog import: add your organizations with their projects, and give each network its "+
		"organizationId and projectId in place of %q and %q; drop what your users should not have.\n",
		openstack.PlaceholderOrganization, openstack.PlaceholderProject)
	for _, n := range skipped {
		fmt.Fprintf(notes, "catalog import: %s\n", n)
	}
	return nil
}
