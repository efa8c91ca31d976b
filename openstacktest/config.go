package openstacktest

import (
	"fmt"
	"os"
	"path/filepath"
	"text/template"
)

// params is what the configuration templates are filled with.
type params struct {
	Dir      string
	DBPort   int
	DBUser   string
	DBPass   string
	AMQPPort int
	Ports    portSet
	Password string // the admin user's, used by every service to talk to the others
	Region   string
	Host     string // nova-compute's host name
	// ForCompute is set when rendering nova-compute's configuration, which must have no
	// database: the compute reaches the databases only through the conductor.
	ForCompute bool
	// LibvirtURI, when set, makes the compute a libvirt one on that daemon.
	LibvirtURI string
	// SerialPorts is the range of ports a libvirt compute's guests' serial consoles listen on
	// ("first:last"), for nova-serialproxy.
	SerialPorts string
}

type portSet struct {
	Keystone, Glance, Placement, Nova, Neutron, SerialProxy int
}

// DB returns the SQLAlchemy URL of one of the control plane's databases.
func (p params) DB(name string) string {
	return fmt.Sprintf("mysql+pymysql://%s:%s@127.0.0.1:%d/%s?charset=utf8", p.DBUser, p.DBPass, p.DBPort, name)
}

// Transport is oslo.messaging's URL of the control plane's RabbitMQ.
func (p params) Transport() string {
	return fmt.Sprintf("rabbit://guest:guest@127.0.0.1:%d/", p.AMQPPort)
}

// AuthURL is Keystone's public endpoint.
func (p params) AuthURL() string {
	return fmt.Sprintf("http://127.0.0.1:%d/v3", p.Ports.Keystone)
}

// The sections every service uses to authenticate itself to the others, all as the admin
// user: a test control plane has no need of one user per service.
const authSection = `auth_type = password
auth_url = {{.AuthURL}}
username = admin
password = {{.Password}}
user_domain_name = Default
project_name = admin
project_domain_name = Default
region_name = {{.Region}}
`

const commonDefault = `use_stderr = true
debug = false
graceful_shutdown_timeout = 5
`

var templates = map[string]string{
	"nova/nova-compute.conf": novaConf,
	"nova/nova.conf":         novaConf,

	"keystone/keystone.conf": `[DEFAULT]
` + commonDefault + `
[database]
connection = {{.DB "keystone"}}

[token]
provider = fernet

[fernet_tokens]
key_repository = {{.Dir}}/keystone/fernet-keys

[fernet_receipts]
key_repository = {{.Dir}}/keystone/fernet-keys

[credential]
key_repository = {{.Dir}}/keystone/credential-keys
`,

	"glance/glance-api.conf": `[DEFAULT]
` + commonDefault + `bind_host = 127.0.0.1
bind_port = {{.Ports.Glance}}
# No forked worker: one that outlives a killed test binary would be left running.
workers = 0
image_cache_dir = {{.Dir}}/glance/image-cache
enabled_backends = file:file

[database]
connection = {{.DB "glance"}}

[glance_store]
default_backend = file

[file]
filesystem_store_datadir = {{.Dir}}/glance/images

[os_glance_staging_store]
filesystem_store_datadir = {{.Dir}}/glance/staging

[os_glance_tasks_store]
filesystem_store_datadir = {{.Dir}}/glance/tasks

[paste_deploy]
flavor = keystone
config_file = {{.Dir}}/glance/glance-api-paste.ini

[oslo_concurrency]
lock_path = {{.Dir}}/glance/lock

[keystone_authtoken]
www_authenticate_uri = {{.AuthURL}}
` + authSection,

	"placement/placement.conf": `[DEFAULT]
` + commonDefault + `
[placement_database]
connection = {{.DB "placement"}}

[api]
auth_strategy = keystone

[keystone_authtoken]
www_authenticate_uri = {{.AuthURL}}
` + authSection,

	"neutron/neutron.conf": `[DEFAULT]
` + commonDefault + `transport_url = {{.Transport}}
bind_host = 127.0.0.1
bind_port = {{.Ports.Neutron}}
api_workers = 1
rpc_workers = 0
rpc_state_report_workers = 0
core_plugin = ml2
# The L3 plugin gives routers and floating IPs at the API level; with no L3 agent nothing
# carries their traffic, which tests of what the API records do not need.
service_plugins = router
auth_strategy = keystone
api_paste_config = {{.Dir}}/neutron/api-paste.ini
state_path = {{.Dir}}/neutron
notify_nova_on_port_status_changes = true
notify_nova_on_port_data_changes = true

[database]
connection = {{.DB "neutron"}}

[oslo_concurrency]
lock_path = {{.Dir}}/neutron/lock

[keystone_authtoken]
www_authenticate_uri = {{.AuthURL}}
` + authSection + `
[nova]
` + authSection + `
[placement]
` + authSection + `
[ml2]
type_drivers = flat,vxlan
tenant_network_types = vxlan
mechanism_drivers = computeql_fake
extension_drivers = port_security

[ml2_type_flat]
flat_networks = *

[ml2_type_vxlan]
vni_ranges = 1:1000
`,

	// The mechanism driver binds every port to any segment, ACTIVE, as if an agent had
	// plugged it, so no agent has to run. Its ports are taps, which is what a libvirt compute
	// can plug alone (an OVS port needs Open vSwitch); the fake compute plugs nothing.
	"py/computeql_fake_mech.py": `from neutron_lib.api.definitions import portbindings
from neutron_lib import constants
from neutron_lib.plugins.ml2 import api


class FakeMechanismDriver(api.MechanismDriver):
    def initialize(self):
        pass

    def bind_port(self, context):
        for segment in context.segments_to_bind:
            context.set_binding(segment[api.ID], portbindings.VIF_TYPE_TAP,
                                {portbindings.CAP_PORT_FILTER: False},
                                status=constants.PORT_STATUS_ACTIVE)
            return
`,
	// Nova's fake virt driver leaves a snapshot's image queued for ever; a hypervisor uploads
	// the server's disk, after which Glance makes the image active. This one uploads a few
	// bytes in its place.
	"py/computeql_fake_virt.py": `import io

from nova.image import glance
from nova.virt import fake


class FakeDriver(fake.FakeDriver):
    def snapshot(self, context, instance, image_id, update_task_state):
        super().snapshot(context, instance, image_id, update_task_state)
        glance.API().update(context, image_id,
                            {'disk_format': 'raw', 'container_format': 'bare'},
                            data=io.BytesIO(b'computeql fake snapshot'),
                            purge_props=False)
`,
	// nova-compute starts through this: Nova loads a virt driver from nova.virt only, so the
	// fake one above is registered there; the compute runs as root, so its privileged calls
	// (a libvirt compute's) run in its own process rather than in privsep daemons started
	// through sudo and nova-rootwrap, which a test machine need not have; and a libvirt
	// compute leaves a port's tap to libvirt, which makes the tap it is told of and refuses
	// one that exists (Nova's libvirt driver would make it first, for a tap port).
	"py/computeql_nova_compute.py": `import sys

import nova.monkey_patch  # noqa: F401 (first, as nova.cmd does: eventlet patches the library)
from oslo_privsep import priv_context

_init = priv_context.PrivContext.__init__


def _in_process(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    self.client_mode = False


priv_context.PrivContext.__init__ = _in_process

from nova.cmd.compute import main  # noqa: E402
from nova.virt.libvirt import vif as libvirt_vif  # noqa: E402
import computeql_fake_virt  # noqa: E402

sys.modules['nova.virt.computeql_fake_virt'] = computeql_fake_virt


def _plug_tap(self, instance, vif):
    pass


libvirt_vif.LibvirtGenericVIFDriver.plug_tap = _plug_tap
sys.exit(main())
`,
	"py/computeql_fake_mech-1.0.dist-info/METADATA": `Metadata-Version: 2.1
Name: computeql-fake-mech
Version: 1.0
`,
	"py/computeql_fake_mech-1.0.dist-info/entry_points.txt": `[neutron.ml2.mechanism_drivers]
computeql_fake = computeql_fake_mech:FakeMechanismDriver
`,

	"rabbitmq/rabbitmq.conf": `listeners.tcp.default = 127.0.0.1:{{.AMQPPort}}
loopback_users.guest = true
disk_free_limit.absolute = 50MB
`,
	"rabbitmq/enabled_plugins":   "[].\n",
	"rabbitmq/rabbitmq-env.conf": "",
}

// novaConf is nova.conf for every Nova service.
const novaConf = `[DEFAULT]
` + commonDefault + `transport_url = {{.Transport}}
host = {{.Host}}
state_path = {{.Dir}}/nova
instances_path = {{.Dir}}/nova/instances
{{if .LibvirtURI}}compute_driver = libvirt.LibvirtDriver
# How long a clean stop waits for the guest before powering it off (default 60 s).
shutdown_timeout = 10
{{else}}compute_driver = computeql_fake_virt.FakeDriver
{{end}}enabled_apis = osapi_compute
osapi_compute_listen = 127.0.0.1
osapi_compute_listen_port = {{.Ports.Nova}}
osapi_compute_workers = 1
vif_plugging_timeout = 0
vif_plugging_is_fatal = false
# One fake compute: a resize has nowhere to go but the host the server is on.
allow_resize_to_same_host = true

[api]
auth_strategy = keystone

[wsgi]
api_paste_config = {{.Dir}}/nova/api-paste.ini

{{if .LibvirtURI}}[libvirt]
# QEMU's software emulation: the machine's /dev/kvm may be unusable, and nothing here needs
# more than a busybox guest's speed.
virt_type = qemu
cpu_mode = none
connection_uri = {{.LibvirtURI}}
# How long a soft reboot waits for the guest to stop before a hard one (default 120 s).
wait_soft_reboot_seconds = 30

[vnc]
enabled = false

# Serial consoles, which nova-serialproxy serves as WebSockets: each guest's serial port is a
# TCP port of QEMU's, also logged to the console log.
[serial_console]
enabled = true
base_url = ws://127.0.0.1:{{.Ports.SerialProxy}}/
proxyclient_address = 127.0.0.1
port_range = {{.SerialPorts}}
serialproxy_host = 127.0.0.1
serialproxy_port = {{.Ports.SerialProxy}}

{{end}}{{if not .ForCompute}}[api_database]
connection = {{.DB "nova_api"}}

[database]
connection = {{.DB "nova"}}
{{end}}
[conductor]
workers = 1

[scheduler]
workers = 1
discover_hosts_in_cells_interval = -1

[notifications]
notification_format = versioned
notify_on_state_change = vm_and_task_state

[oslo_messaging_notifications]
driver = messagingv2

[oslo_concurrency]
lock_path = {{.Dir}}/nova/lock

[glance]
region_name = {{.Region}}

[keystone_authtoken]
www_authenticate_uri = {{.AuthURL}}
` + authSection + `
[placement]
` + authSection + `
[neutron]
` + authSection + `
[service_user]
send_service_user_token = false
`

// writeConfigs renders every template into the control plane's directory.
func writeConfigs(p params) error {
	for name, text := range templates {
		t, err := template.New(name).Option("missingkey=error").Parse(text)
		if err != nil {
			return fmt.Errorf("template %s: %w", name, err)
		}
		p.ForCompute = name == "nova/nova-compute.conf"
		path := filepath.Join(p.Dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		err = t.Execute(f, p)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("render %s: %w", name, err)
		}
	}
	return nil
}

// packagedFiles are files the packages ship that the services need next to their
// configuration (paste pipelines); the first existing candidate is copied.
var packagedFiles = map[string][]string{
	"glance/glance-api-paste.ini": {"/etc/glance/glance-api-paste.ini", "/usr/share/glance-common/glance-api-paste.ini"},
	"nova/api-paste.ini":          {"/etc/nova/api-paste.ini", "/usr/share/nova-common/api-paste.ini"},
	"neutron/api-paste.ini":       {"/etc/neutron/api-paste.ini", "/usr/share/neutron-common/api-paste.ini"},
}

func copyPackagedFiles(dir string) error {
	for dst, candidates := range packagedFiles {
		var data []byte
		var err error
		for _, src := range candidates {
			if data, err = os.ReadFile(src); err == nil {
				break
			}
		}
		if err != nil {
			return fmt.Errorf("%s: none of %v is readable: %w", dst, candidates, err)
		}
		if err := os.WriteFile(filepath.Join(dir, dst), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}
