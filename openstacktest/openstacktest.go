// Package openstacktest brings up a real OpenStack control plane (Debian 12's packages,
// OpenStack Zed) on this machine for tests: MariaDB, RabbitMQ, Keystone, Glance, Placement,
// Nova (api, conductor, scheduler and a compute with the fake virt driver, or a libvirt one
// on a libvirtd the test gives) and neutron-server (ML2 with a mechanism driver of the
// harness's own that binds every port ACTIVE, so no agent runs). Every service is a child process started on free loopback ports with its own
// temporary directory; the machine's own MariaDB, RabbitMQ and /etc are left alone.
//
// Start seeds the cloud with what a driver test needs — a project, a flavor, an image, a
// network with a subnet — and writes a clouds.yaml for it; the test's cleanup stops every
// process by its process group and removes the directory. When the packages are missing the
// test is skipped, or fails when COMPUTEQL_REQUIRE_OPENSTACK=1.
package openstacktest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// RequireEnv names the environment variable that turns a missing OpenStack into a failure.
const RequireEnv = "COMPUTEQL_REQUIRE_OPENSTACK"

// CloudName is the name of the cloud in the clouds.yaml that Start writes.
const CloudName = "computeql-test"

// Options configure Start. The zero value is ready to use.
type Options struct {
	// StartTimeout bounds the whole start, migrations included. Default: 5 minutes.
	StartTimeout time.Duration
	// StopTimeout is how long the services have after SIGTERM before SIGKILL. Default: 10s.
	StopTimeout time.Duration
	// Libvirt, when set, makes the compute nova-compute's libvirt driver (QEMU under software
	// emulation) on the daemon it names, in place of Nova's fake driver, and seeds an image
	// and a flavor such a compute boots a guest of.
	Libvirt *Libvirt
}

// Libvirt is the libvirtd of a libvirt compute, such as a virttest.Host's, and the guest it
// boots.
type Libvirt struct {
	// URI is the daemon's URI, such as qemu:///system?socket=/path. Required.
	URI string
	// Kernel and Initrd are a guest booted directly, without a disk of its own (a busybox
	// initramfs). Glance gets both, and the seeded image (an empty disk) names them as its
	// kernel_id and ramdisk_id. Required.
	Kernel, Initrd string
}

// Cloud is a running control plane.
type Cloud struct {
	// Dir is the control plane's temporary directory: configuration, data, and logs/ with one
	// file per service and per setup command.
	Dir string
	// AuthURL is Keystone's v3 endpoint.
	AuthURL string
	// Region is the region every endpoint is registered in.
	Region string
	// Username and Password are the admin user's; UserDomain is its domain's name.
	Username, Password, UserDomain string
	// ProjectName and ProjectID name the project the test works in; the admin user has the
	// admin role in it. ProjectDomain is its domain's name.
	ProjectName, ProjectID, ProjectDomain string
	// CloudsYAML is the path of a clouds.yaml with the cloud CloudName, scoped to the
	// project; Env sets OS_CLIENT_CONFIG_FILE to it.
	CloudsYAML string
	// FlavorID, ImageID, NetworkID and SubnetID are the seeded resources: a public flavor
	// (1 vCPU, 64 MiB, 1 GB disk), a public raw image of a few bytes, and a shared flat
	// network with an IPv4 subnet.
	FlavorID, ImageID, NetworkID, SubnetID string
	// KernelImageID and RamdiskImageID are, with a libvirt compute, the guest's kernel and
	// initramfs in Glance, which the image ImageID names; "" otherwise.
	KernelImageID, RamdiskImageID string
	// ExternalNetworkID is the seeded external network (router:external, flat, subnet
	// 198.51.100.0/24), whose floating IPs reach ports of the subnet SubnetID through the
	// seeded router RouterID.
	ExternalNetworkID, RouterID string
	// TransportURL is oslo.messaging's URL of the control plane's RabbitMQ, where Nova
	// publishes its versioned notifications (topic versioned_notifications).
	TransportURL string
	// Endpoints are the services' public URLs by service type (identity, image, placement,
	// compute, network).
	Endpoints map[string]string

	opts   Options
	p      params
	env    []string // the environment of every process started
	rmqEnv []string // env and what RabbitMQ's scripts need to find the node
	mu     sync.Mutex
	procs  []*proc
	infra  int // procs[:infra] are MariaDB, epmd and RabbitMQ, stopped after the rest
	stopMu sync.Once
}

// binaries are the programs the control plane runs; Available reports those missing.
var binaries = []string{
	"/usr/sbin/mariadbd", "/usr/bin/mariadb-install-db", "/usr/bin/mariadb",
	"/usr/bin/epmd", "/usr/lib/rabbitmq/bin/rabbitmq-server",
	"/usr/bin/uwsgi",
	"/usr/bin/keystone-manage", "/usr/bin/keystone-wsgi-public",
	"/usr/bin/glance-manage", "/usr/bin/glance-api",
	"/usr/bin/placement-manage", "/usr/bin/placement-api",
	"/usr/bin/nova-manage", "/usr/bin/nova-api", "/usr/bin/nova-conductor",
	"/usr/bin/nova-scheduler", "/usr/bin/nova-compute",
	"/usr/bin/neutron-db-manage", "/usr/bin/neutron-server",
}

// Available reports what is missing for Start to run, or nil.
func Available() error {
	var missing []string
	for _, b := range binaries {
		if _, err := os.Stat(b); err != nil {
			missing = append(missing, b)
		}
	}
	if _, err := uwsgiPython(); err != nil {
		missing = append(missing, err.Error())
	}
	if len(missing) > 0 {
		return fmt.Errorf("OpenStack packages are not installed (missing %s); install them with: "+
			"DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends mariadb-server rabbitmq-server "+
			"keystone glance-api placement-api nova-api nova-conductor nova-scheduler nova-compute neutron-server",
			strings.Join(missing, ", "))
	}
	return nil
}

// uwsgiPython finds uwsgi's Python 3 plugin, which Debian names after the Python version.
func uwsgiPython() (string, error) {
	m, _ := filepath.Glob("/usr/lib/uwsgi/plugins/python3*_plugin.so")
	if len(m) == 0 {
		return "", fmt.Errorf("uwsgi's python3 plugin")
	}
	sort.Strings(m)
	return m[0], nil
}

// Require skips the test when OpenStack is not installed, or fails it when the environment
// variable RequireEnv is "1".
func Require(tb testing.TB) {
	tb.Helper()
	if err := Available(); err != nil {
		if os.Getenv(RequireEnv) == "1" {
			tb.Fatalf("openstacktest: %v (%s=1, so this fails instead of skipping)", err, RequireEnv)
		}
		tb.Skipf("openstacktest: %v", err)
	}
}

// Start brings the control plane up, seeds it and returns it; the test's cleanup stops it.
// It skips (or fails, see Require) when OpenStack is not installed.
func Start(tb testing.TB, opts ...Options) *Cloud {
	tb.Helper()
	Require(tb)
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = 5 * time.Minute
	}
	if o.StopTimeout <= 0 {
		o.StopTimeout = 10 * time.Second
	}
	dir, err := os.MkdirTemp("", "computeql-openstack-")
	if err != nil {
		tb.Fatalf("openstacktest: %v", err)
	}
	c := &Cloud{Dir: dir, opts: o}
	tb.Cleanup(func() {
		if tb.Failed() {
			c.logTails(tb)
		}
		c.Stop()
	})
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), o.StartTimeout)
	defer cancel()
	if err := c.up(ctx, tb); err != nil {
		tb.Fatalf("openstacktest: %v", err)
	}
	tb.Logf("openstacktest: control plane up and seeded in %s (dir %s)", since(began), dir)
	return c
}

// Stop stops every process (OpenStack's services first, then RabbitMQ and MariaDB) and
// removes the directory. Calls after the first do nothing.
func (c *Cloud) Stop() {
	c.stopMu.Do(func() {
		c.mu.Lock()
		procs := c.procs
		c.mu.Unlock()
		infra := min(c.infra, len(procs))
		stopAll(procs[infra:], c.opts.StopTimeout)
		stopAll(procs[:infra], c.opts.StopTimeout)
		os.RemoveAll(c.Dir)
	})
}

// Env is the environment a client of the cloud needs: OS_CLIENT_CONFIG_FILE and OS_CLOUD,
// and the OS_* variables of the admin user scoped to the project.
func (c *Cloud) Env() []string {
	return []string{
		"OS_CLIENT_CONFIG_FILE=" + c.CloudsYAML,
		"OS_CLOUD=" + CloudName,
		"OS_AUTH_URL=" + c.AuthURL,
		"OS_USERNAME=" + c.Username,
		"OS_PASSWORD=" + c.Password,
		"OS_USER_DOMAIN_NAME=" + c.UserDomain,
		"OS_PROJECT_NAME=" + c.ProjectName,
		"OS_PROJECT_DOMAIN_NAME=" + c.ProjectDomain,
		"OS_DOMAIN_NAME=" + c.UserDomain,
		"OS_REGION_NAME=" + c.Region,
		"OS_IDENTITY_API_VERSION=3",
	}
}

// logTails logs the end of every log file, for a failed test.
func (c *Cloud) logTails(tb testing.TB) {
	entries, err := os.ReadDir(filepath.Join(c.Dir, "logs"))
	if err != nil {
		return
	}
	for _, e := range entries {
		tb.Logf("%s", tail(filepath.Join(c.Dir, "logs", e.Name()), 25))
	}
}

// up starts everything, in dependency order, with independent steps in parallel.
func (c *Cloud) up(ctx context.Context, tb testing.TB) error {
	began := time.Now()
	ps, err := freePorts(10)
	if err != nil {
		return err
	}
	c.p = params{
		Dir: c.Dir, DBPort: ps[0], DBUser: "openstack", DBPass: "openstack-db-secret",
		AMQPPort: ps[1],
		Ports:    portSet{Keystone: ps[4], Glance: ps[5], Placement: ps[6], Nova: ps[7], Neutron: ps[8], SerialProxy: ps[9]},
		Password: "computeql-admin-secret", Region: "RegionOne", Host: "computeql-fake-compute",
	}
	if lv := c.opts.Libvirt; lv != nil {
		c.p.Host, c.p.LibvirtURI = "computeql-libvirt-compute", lv.URI
		// Below the kernel's ephemeral ports, which the free ports above come from; Nova skips
		// a port of the range that is taken.
		first := 20000 + rand.IntN(10000)
		c.p.SerialPorts = fmt.Sprintf("%d:%d", first, first+serialPortCount-1)
	}
	epmdPort, distPort := ps[2], ps[3]
	c.AuthURL = c.p.AuthURL()
	c.TransportURL = c.p.Transport()
	c.Region = c.p.Region
	c.Username, c.Password, c.UserDomain = "admin", c.p.Password, "Default"
	c.ProjectName, c.ProjectDomain = "computeql", "Default"
	c.Endpoints = map[string]string{
		"identity":  c.AuthURL,
		"image":     fmt.Sprintf("http://127.0.0.1:%d", c.p.Ports.Glance),
		"placement": fmt.Sprintf("http://127.0.0.1:%d", c.p.Ports.Placement),
		"compute":   fmt.Sprintf("http://127.0.0.1:%d/v2.1", c.p.Ports.Nova),
		"network":   fmt.Sprintf("http://127.0.0.1:%d", c.p.Ports.Neutron),
	}
	for _, d := range []string{"logs", "home", "cache", "tmp", "mysql", "rabbitmq/mnesia", "rabbitmq/log",
		"keystone/fernet-keys", "keystone/credential-keys", "glance/images", "glance/staging", "glance/tasks",
		"glance/image-cache", "glance/lock", "nova/instances", "nova/lock", "neutron/lock"} {
		if err := os.MkdirAll(filepath.Join(c.Dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := writeConfigs(c.p); err != nil {
		return err
	}
	if err := copyPackagedFiles(c.Dir); err != nil {
		return err
	}
	// Debian's services run under /usr/bin/python3; the first python3 on the caller's PATH
	// may be another one, so the services get a PATH of the system's directories only, and
	// nothing else of the caller's environment (OS_* variables in particular).
	c.env = []string{
		"PATH=/usr/bin:/usr/sbin:/bin:/sbin",
		"HOME=" + filepath.Join(c.Dir, "home"),
		"TMPDIR=" + filepath.Join(c.Dir, "tmp"),
		"XDG_CACHE_HOME=" + filepath.Join(c.Dir, "cache"),
		"LANG=C.UTF-8",
		"PYTHONPATH=" + filepath.Join(c.Dir, "py"),
	}

	// MariaDB and RabbitMQ.
	err = parallel(
		func() error { return c.startMariaDB(ctx) },
		func() error { return c.startRabbitMQ(ctx, epmdPort, distPort) },
	)
	c.mu.Lock()
	c.infra = len(c.procs)
	c.mu.Unlock()
	if err != nil {
		return err
	}
	tb.Logf("openstacktest: %s: MariaDB on %d, RabbitMQ on %d", since(began), c.p.DBPort, c.p.AMQPPort)

	// Migrations in parallel; Keystone comes up and gets its catalog meanwhile.
	novaConf := filepath.Join(c.Dir, "nova/nova.conf")
	err = parallel(
		func() error { return c.startKeystone(ctx) },
		func() error {
			return c.run(ctx, "glance-manage", c.env, "/usr/bin/glance-manage", "--config-file", filepath.Join(c.Dir, "glance/glance-api.conf"), "db_sync")
		},
		func() error {
			return c.run(ctx, "placement-manage", c.env, "/usr/bin/placement-manage", "--config-file", filepath.Join(c.Dir, "placement/placement.conf"), "db", "sync")
		},
		func() error {
			for _, args := range [][]string{
				{"api_db", "sync"},
				{"cell_v2", "map_cell0", "--database_connection", c.p.DB("nova_cell0")},
				{"cell_v2", "create_cell", "--name", "cell1"},
				{"db", "sync"},
			} {
				if err := c.run(ctx, "nova-manage", c.env, "/usr/bin/nova-manage", append([]string{"--config-file", novaConf}, args...)...); err != nil {
					return err
				}
			}
			return nil
		},
		func() error {
			return c.run(ctx, "neutron-db-manage", c.env, "/usr/bin/neutron-db-manage", "--config-file", filepath.Join(c.Dir, "neutron/neutron.conf"), "upgrade", "heads")
		},
	)
	if err != nil {
		return err
	}
	tb.Logf("openstacktest: %s: databases migrated, Keystone up", since(began))

	// The API services and Nova's conductor and scheduler.
	plugin, _ := uwsgiPython()
	err = parallel(
		func() error {
			p, err := c.start("glance-api", c.env, "/usr/bin/glance-api", "--config-file", filepath.Join(c.Dir, "glance/glance-api.conf"))
			if err != nil {
				return err
			}
			return waitHTTP(ctx, p, c.Endpoints["image"]+"/")
		},
		func() error {
			p, err := c.start("placement-api", append(c.env, "OS_PLACEMENT_CONFIG_DIR="+filepath.Join(c.Dir, "placement")),
				"/usr/bin/uwsgi", uwsgiArgs(plugin, c.p.Ports.Placement, "/usr/bin/placement-api")...)
			if err != nil {
				return err
			}
			return waitHTTP(ctx, p, c.Endpoints["placement"]+"/")
		},
		func() error {
			p, err := c.start("neutron-server", c.env, "/usr/bin/neutron-server", "--config-file", filepath.Join(c.Dir, "neutron/neutron.conf"))
			if err != nil {
				return err
			}
			return waitHTTP(ctx, p, c.Endpoints["network"]+"/")
		},
		func() error {
			p, err := c.start("nova-api", c.env, "/usr/bin/nova-api", "--config-file", novaConf)
			if err != nil {
				return err
			}
			return waitHTTP(ctx, p, fmt.Sprintf("http://127.0.0.1:%d/", c.p.Ports.Nova))
		},
		func() error {
			_, err := c.start("nova-conductor", c.env, "/usr/bin/nova-conductor", "--config-file", novaConf)
			return err
		},
		func() error {
			_, err := c.start("nova-scheduler", c.env, "/usr/bin/nova-scheduler", "--config-file", novaConf)
			return err
		},
		func() error {
			if c.opts.Libvirt == nil {
				return nil
			}
			p, err := c.start("nova-serialproxy", c.env, "/usr/bin/python3", "-c",
				"import sys; from nova.cmd.serialproxy import main; sys.exit(main())", "--config-file", novaConf)
			if err != nil {
				return err
			}
			return waitTCP(ctx, p, fmt.Sprintf("127.0.0.1:%d", c.p.Ports.SerialProxy))
		},
	)
	if err != nil {
		return err
	}
	tb.Logf("openstacktest: %s: Glance, Placement, Neutron and Nova's API up", since(began))

	// The compute, once Placement answers (it registers its resource provider at start), then
	// its mapping into cell1 and the seed resources meanwhile.
	compute, err := c.start("nova-compute", c.env, "/usr/bin/python3", filepath.Join(c.Dir, "py", "computeql_nova_compute.py"),
		"--config-file", filepath.Join(c.Dir, "nova/nova-compute.conf"))
	if err != nil {
		return err
	}
	return parallel(
		func() error { return c.seed(ctx) },
		func() error { return c.discoverCompute(ctx, compute, novaConf) },
	)
}

// serialPortCount is how many serial consoles a libvirt compute's guests can have at once.
const serialPortCount = 16

func since(t time.Time) time.Duration { return time.Since(t).Round(100 * time.Millisecond) }

// uwsgiArgs serves a WSGI script over plain HTTP on a loopback port. Keystone's and
// Placement's clients keep connections alive, which uwsgi's HTTP socket does not handle
// well: "Connection: close" makes every client open a fresh connection.
func uwsgiArgs(plugin string, port int, script string) []string {
	return []string{
		"--plugin", plugin,
		"--http-socket", "127.0.0.1:" + strconv.Itoa(port),
		"--wsgi-file", script,
		"--add-header", "Connection: close",
		"--master", "--die-on-term", "--lazy-apps", "--enable-threads",
		"--processes", "1", "--threads", "4",
		"--buffer-size", "65535",
	}
}

// startMariaDB initialises a data directory and runs a mariadbd of the harness's own on
// its own port and socket, then creates the databases and the services' user.
func (c *Cloud) startMariaDB(ctx context.Context) error {
	data := filepath.Join(c.Dir, "mysql")
	sock := filepath.Join(c.Dir, "mysqld.sock")
	if err := c.run(ctx, "mariadb-install-db", c.env, "/usr/bin/mariadb-install-db",
		"--no-defaults", "--user=root", "--datadir="+data, "--auth-root-authentication-method=socket",
		"--skip-test-db"); err != nil {
		return err
	}
	p, err := c.start("mariadbd", c.env, "/usr/sbin/mariadbd",
		"--no-defaults", "--user=root", "--datadir="+data, "--socket="+sock,
		"--port="+strconv.Itoa(c.p.DBPort), "--bind-address=127.0.0.1",
		"--pid-file="+filepath.Join(c.Dir, "mysqld.pid"), "--skip-name-resolve",
		"--max-connections=1000", "--innodb-buffer-pool-size=128M",
		// A test database is thrown away: durability only slows the migrations.
		"--innodb-flush-log-at-trx-commit=0", "--innodb-doublewrite=0", "--skip-log-bin")
	if err != nil {
		return err
	}
	client := func(sql string) error {
		out, err := exec.CommandContext(ctx, "/usr/bin/mariadb", "--no-defaults", "--socket="+sock, "-uroot", "-e", sql).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	if err := poll(ctx, 100*time.Millisecond, "mariadbd", p, func() error { return client("SELECT 1") }); err != nil {
		return err
	}
	var sql strings.Builder
	fmt.Fprintf(&sql, "CREATE USER '%s'@'127.0.0.1' IDENTIFIED BY '%s';", c.p.DBUser, c.p.DBPass)
	for _, db := range []string{"keystone", "glance", "placement", "nova_api", "nova", "nova_cell0", "neutron"} {
		fmt.Fprintf(&sql, "CREATE DATABASE %s CHARACTER SET utf8; GRANT ALL ON %s.* TO '%s'@'127.0.0.1';", db, db, c.p.DBUser)
	}
	return client(sql.String())
}

// startRabbitMQ runs an epmd of the harness's own (so the node registers nowhere else) and a
// RabbitMQ node with every file under the directory.
func (c *Cloud) startRabbitMQ(ctx context.Context, epmdPort, distPort int) error {
	env := append(append([]string(nil), c.env...), "ERL_EPMD_PORT="+strconv.Itoa(epmdPort), "ERL_EPMD_ADDRESS=127.0.0.1")
	if _, err := c.start("epmd", env, "/usr/bin/epmd", "-port", strconv.Itoa(epmdPort), "-address", "127.0.0.1"); err != nil {
		return err
	}
	r := filepath.Join(c.Dir, "rabbitmq")
	env = append(env,
		"RABBITMQ_NODENAME=computeql@localhost",
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(c.p.AMQPPort),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(distPort),
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(r, "rabbitmq-env.conf"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(r, "rabbitmq.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(r, "advanced.config"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(r, "enabled_plugins"),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(r, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(r, "log"),
		"RABBITMQ_LOGS=-",
		"RABBITMQ_PID_FILE="+filepath.Join(r, "rabbitmq.pid"),
		// In its foreground mode rabbitmq-server keeps a shell as the Erlang VM's parent; with
		// "detached" set, the script execs the VM in its place (still without input), so the
		// VM is the harness's own child and dies with the test binary (Pdeathsig).
		"detached=1",
	)
	c.rmqEnv = env
	p, err := c.start("rabbitmq", env, "/usr/lib/rabbitmq/bin/rabbitmq-server")
	if err != nil {
		return err
	}
	// RabbitMQ opens its AMQP listener last, once the node has booted.
	return poll(ctx, 200*time.Millisecond, "rabbitmq", p, func() error { return amqpHandshake(c.p.AMQPPort) })
}

// RabbitMQCtl runs rabbitmqctl against the control plane's node (e.g. "list_queues", "name",
// "messages") and returns its standard output.
func (c *Cloud) RabbitMQCtl(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "/usr/lib/rabbitmq/bin/rabbitmqctl", append([]string{"--quiet"}, args...)...)
	cmd.Env = c.rmqEnv
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("rabbitmqctl %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}

// startKeystone bootstraps Keystone's database and keys, serves it with uwsgi and registers
// the other services' endpoints and the test's project.
func (c *Cloud) startKeystone(ctx context.Context) error {
	conf := filepath.Join(c.Dir, "keystone/keystone.conf")
	km := func(args ...string) error {
		return c.run(ctx, "keystone-manage", c.env, "/usr/bin/keystone-manage", append([]string{"--config-file", conf}, args...)...)
	}
	steps := [][]string{
		{"db_sync"},
		{"fernet_setup", "--keystone-user", "root", "--keystone-group", "root"},
		{"credential_setup", "--keystone-user", "root", "--keystone-group", "root"},
		{"bootstrap", "--bootstrap-password", c.p.Password, "--bootstrap-region-id", c.p.Region,
			"--bootstrap-public-url", c.AuthURL, "--bootstrap-internal-url", c.AuthURL, "--bootstrap-admin-url", c.AuthURL},
	}
	for _, s := range steps {
		if err := km(s...); err != nil {
			return err
		}
	}
	plugin, _ := uwsgiPython()
	p, err := c.start("keystone", append(c.env, "OS_KEYSTONE_CONFIG_FILES="+conf),
		"/usr/bin/uwsgi", uwsgiArgs(plugin, c.p.Ports.Keystone, "/usr/bin/keystone-wsgi-public")...)
	if err != nil {
		return err
	}
	if err := waitHTTP(ctx, p, c.AuthURL); err != nil {
		return err
	}
	return c.registerCatalog(ctx)
}
