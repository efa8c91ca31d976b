package libvirt

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"
	"libvirt.org/go/libvirtxml"

	"github.com/computeql/computeql/region"
)

// Where computeql keeps its record in a domain's metadata.
const (
	metadataNS  = "https://computeql.dev/xmlns/server/1"
	metadataKey = "computeql"
	// namePrefix starts the name of every domain and volume the driver makes.
	namePrefix = "computeql-"
	// agentChannel is the virtio-serial port the QEMU guest agent listens on.
	agentChannel = "org.qemu.guest_agent.0"
)

// record is the server as the domain's metadata keeps it: what it was made from, and what the
// driver learnt since that every process must agree on.
type record struct {
	Spec      region.ServerSpec `json:"spec"`
	CreatedAt time.Time         `json:"createdAt"`
	MAC       string            `json:"mac"`
	// IP is the address reserved for the server in its network's DHCP.
	IP string `json:"ip,omitempty"`
	// Built is set once the guest took its address: until then the server is BUILDING.
	Built bool `json:"built,omitempty"`
	// BuildBy is when a guest not built yet has been too long at it; Stalled then says so,
	// and the server shows ERROR until the guest takes its address after all.
	BuildBy time.Time `json:"buildBy,omitzero"`
	Stalled string    `json:"stalled,omitempty"`
	// Error is why the server could not be made; such a domain has no disks and never runs.
	Error string `json:"error,omitempty"`
	// StopBy is when a graceful stop turns into a forced one.
	StopBy time.Time `json:"stopBy,omitzero"`
	// RebootBy is set while a soft reboot waits for the guest to power off, to be started
	// again: it is when the wait ends in a reset instead. The server is REBOOTING meanwhile,
	// whether the domain still runs or is shut off between the two.
	RebootBy time.Time `json:"rebootBy,omitzero"`
	// Volumes are the pool volumes the server owns, deleted with it.
	Volumes []string `json:"volumes,omitempty"`
	// Network is the libvirt network holding the server's DHCP reservation.
	Network string `json:"network,omitempty"`
}

// metadataElement is the XML element holding the record as JSON.
type metadataElement struct {
	XMLName xml.Name `xml:"server"`
	Data    string   `xml:",chardata"`
}

func (r *record) element() (string, error) {
	data, err := json.Marshal(r)
	if err != nil {
		return "", err
	}
	out, err := xml.Marshal(metadataElement{Data: string(data)})
	return string(out), err
}

// errNotOurs: a domain without computeql's metadata, which is not a server of the region.
var errNotOurs = errors.New("domain is not a computeql server")

// server is a domain read from the host.
type server struct {
	id     string
	dom    golibvirt.Domain
	rec    record
	xml    libvirtxml.Domain
	state  golibvirt.DomainState
	reason int32
}

func (s *server) indexed() indexed {
	return indexed{id: s.id, scope: s.rec.Spec.Scope, tags: maps.Clone(s.rec.Spec.Tags), mac: s.rec.MAC, network: s.rec.Network, ip: s.rec.IP}
}

// readServer reads a domain's definition, metadata and state.
func readServer(conn *golibvirt.Libvirt, dom golibvirt.Domain) (*server, error) {
	desc, err := conn.DomainGetXMLDesc(dom, 0)
	if err != nil {
		return nil, err
	}
	s := &server{id: uuidString(dom.UUID), dom: dom}
	if err := s.xml.Unmarshal(desc); err != nil {
		return nil, fmt.Errorf("domain %s: %w", dom.Name, err)
	}
	if !strings.HasPrefix(dom.Name, namePrefix) || s.xml.Metadata == nil {
		return nil, errNotOurs
	}
	rec, err := decodeRecord(s.xml.Metadata.XML)
	if err != nil {
		return nil, fmt.Errorf("domain %s: %w", dom.Name, err)
	}
	s.rec = *rec
	state, reason, err := conn.DomainGetState(dom, 0)
	if err != nil {
		return nil, err
	}
	s.state, s.reason = golibvirt.DomainState(state), reason
	return s, nil
}

// decodeRecord finds computeql's element among a domain's metadata elements and decodes the
// record it holds; errNotOurs when there is none.
func decodeRecord(metadata string) (*record, error) {
	dec := xml.NewDecoder(strings.NewReader("<m>" + metadata + "</m>"))
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil, errNotOurs
		}
		start, ok := tok.(xml.StartElement)
		if !ok || start.Name.Space != metadataNS {
			continue
		}
		var el metadataElement
		if err := dec.DecodeElement(&el, &start); err != nil {
			return nil, fmt.Errorf("metadata: %w", err)
		}
		var rec record
		if err := json.Unmarshal([]byte(el.Data), &rec); err != nil {
			return nil, fmt.Errorf("metadata: %w", err)
		}
		return &rec, nil
	}
}

// updateRecord applies change to the domain's record as the host has it now, not as s was
// read, writes it, and leaves s as written: two changes of different fields (a stop's
// deadline, the moment the guest took its address) never undo each other. This process's
// writers take turns; another process's write can still fall between the read and the write,
// a window of one call.
func (d *hostDriver) updateRecord(conn *golibvirt.Libvirt, s *server, change func(*record)) error {
	d.records.Lock()
	defer d.records.Unlock()
	fresh, err := readServer(conn, s.dom)
	if err != nil {
		return err
	}
	change(&fresh.rec)
	if err := writeRecord(conn, fresh); err != nil {
		return err
	}
	*s = *fresh
	return nil
}

// writeRecord replaces the domain's metadata, in its live and persistent definitions alike.
func writeRecord(conn *golibvirt.Libvirt, s *server) error {
	el, err := s.rec.element()
	if err != nil {
		return err
	}
	impact := golibvirt.DomainAffectConfig
	if s.state == golibvirt.DomainRunning || s.state == golibvirt.DomainPaused || s.state == golibvirt.DomainShutdown {
		impact |= golibvirt.DomainAffectLive
	}
	return conn.DomainSetMetadata(s.dom, int32(golibvirt.DomainMetadataElement), golibvirt.OptString{el},
		golibvirt.OptString{metadataKey}, golibvirt.OptString{metadataNS}, impact)
}

// regionState is what the region says of the domain's state. A soft reboot shows REBOOTING
// whatever the guest's way down and up passes through (shutting down, paused by QEMU as it
// powers off, shut off until started again), unless it ends in an error.
func (s *server) regionState() (region.ServerState, string) {
	state, msg := s.domainState()
	if state != region.ServerError && !s.rec.RebootBy.IsZero() {
		return region.ServerRebooting, ""
	}
	return state, msg
}

// domainState is what the domain's state alone says.
func (s *server) domainState() (region.ServerState, string) {
	if s.rec.Error != "" {
		return region.ServerError, s.rec.Error
	}
	switch s.state {
	case golibvirt.DomainRunning, golibvirt.DomainBlocked:
		switch {
		case !s.rec.StopBy.IsZero():
			return region.ServerStopping, ""
		case !s.rec.Built && s.rec.Stalled != "":
			return region.ServerError, s.rec.Stalled
		case !s.rec.Built:
			return region.ServerBuilding, ""
		}
		return region.ServerRunning, ""
	case golibvirt.DomainShutdown:
		return region.ServerStopping, ""
	case golibvirt.DomainCrashed:
		return region.ServerError, "The virtual machine crashed."
	case golibvirt.DomainShutoff:
		if golibvirt.DomainShutoffReason(s.reason) == golibvirt.DomainShutoffCrashed {
			return region.ServerError, "The virtual machine crashed."
		}
		if golibvirt.DomainShutoffReason(s.reason) == golibvirt.DomainShutoffFailed {
			return region.ServerError, "The virtual machine failed to start."
		}
		return region.ServerStopped, ""
	case golibvirt.DomainPaused:
		if golibvirt.DomainPausedReason(s.reason) == golibvirt.DomainPausedIoerror {
			return region.ServerError, "The virtual machine was paused by its host: its disk could not be written (the host's storage may be full)."
		}
		return region.ServerStopped, ""
	case golibvirt.DomainPmsuspended:
		return region.ServerStopped, ""
	}
	return region.ServerPending, ""
}

// agentConnected reports whether the guest agent's channel is open: the image runs an agent.
func (s *server) agentConnected() bool {
	if s.xml.Devices == nil {
		return false
	}
	for _, ch := range s.xml.Devices.Channels {
		if ch.Target != nil && ch.Target.VirtIO != nil && ch.Target.VirtIO.Name == agentChannel {
			return ch.Target.VirtIO.State == "connected"
		}
	}
	return false
}

// domainSpec is everything a domain definition is made of.
type domainSpec struct {
	name, id   string
	domainType string
	flavor     *region.Flavor
	image      *region.Image
	rec        *record
	// disk and seed are the paths of the overlay and the seed; empty for a server that could
	// not be made, whose domain only records why.
	disk, seed string
	// consoleLog is the path the serial console is written to; empty for none.
	consoleLog string
	network    string
}

// domainXML builds the domain. The guest gets a virtio disk (its overlay), the seed as a
// second, read-only virtio disk, one virtio NIC on its network with the reserved MAC, a serial
// console, and the guest agent's channel; a server that failed to be made gets none of them.
func domainXML(s domainSpec) (string, error) {
	el, err := s.rec.element()
	if err != nil {
		return "", err
	}
	memMiB := uint(s.flavor.MemoryGiB) * 1024
	dom := &libvirtxml.Domain{
		Type: s.domainType, Name: s.name, UUID: s.id,
		Metadata:   &libvirtxml.DomainMetadata{XML: namespaced(el)},
		Memory:     &libvirtxml.DomainMemory{Value: memMiB, Unit: "MiB"},
		VCPU:       &libvirtxml.DomainVCPU{Value: uint(s.flavor.CPUs)},
		OnPoweroff: "destroy", OnReboot: "restart", OnCrash: "destroy",
		OS: &libvirtxml.DomainOS{
			Type: &libvirtxml.DomainOSType{Arch: "x86_64", Type: "hvm"},
		},
		Features: &libvirtxml.DomainFeatureList{ACPI: &libvirtxml.DomainFeature{}, APIC: &libvirtxml.DomainFeatureAPIC{}},
		Devices:  &libvirtxml.DomainDeviceList{},
	}
	if s.domainType == "qemu" {
		// QEMU's default translation cache is a quarter of guest memory, allocated up front;
		// 32 MiB costs little speed and keeps many small guests affordable under TCG.
		dom.Features.TCG = &libvirtxml.DomainFeatureTCG{TBCache: &libvirtxml.DomainFeatureTCGTBCache{Unit: "MiB", Size: 32}}
	} else {
		dom.CPU = &libvirtxml.DomainCPU{Mode: "host-passthrough"}
	}
	if s.disk == "" && s.seed == "" {
		return dom.Marshal()
	}
	if s.image.Kernel != "" {
		dom.OS.Kernel, dom.OS.Initrd, dom.OS.Cmdline = s.image.Kernel, s.image.Initrd, s.image.Cmdline
	} else {
		dom.OS.BootDevices = []libvirtxml.DomainBootDevice{{Dev: "hd"}}
	}
	dev := dom.Devices
	if s.disk != "" {
		dev.Disks = append(dev.Disks, fileDisk(s.disk, "qcow2", "vda", false))
	}
	dev.Disks = append(dev.Disks, fileDisk(s.seed, "raw", "vdb", true))
	dev.Interfaces = []libvirtxml.DomainInterface{{
		MAC:    &libvirtxml.DomainInterfaceMAC{Address: s.rec.MAC},
		Source: &libvirtxml.DomainInterfaceSource{Network: &libvirtxml.DomainInterfaceSourceNetwork{Network: s.network}},
		Model:  &libvirtxml.DomainInterfaceModel{Type: "virtio"},
		// The server's own filter: its security groups and allowed source addresses.
		FilterRef: &libvirtxml.DomainInterfaceFilterRef{Filter: filterName(s.id)},
	}}
	port := uint(0)
	dev.Serials = []libvirtxml.DomainSerial{{
		Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}},
		Target: &libvirtxml.DomainSerialTarget{Port: &port},
	}}
	if s.consoleLog != "" {
		// Appended to across restarts: the console output of the server's whole life.
		dev.Serials[0].Log = &libvirtxml.DomainChardevLog{File: s.consoleLog, Append: "on"}
	}
	dev.Consoles = []libvirtxml.DomainConsole{{
		Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}},
		Target: &libvirtxml.DomainConsoleTarget{Type: "serial", Port: &port},
	}}
	dev.Channels = []libvirtxml.DomainChannel{{
		Source: &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{Mode: "bind"}},
		Target: &libvirtxml.DomainChannelTarget{VirtIO: &libvirtxml.DomainChannelTargetVirtIO{Name: agentChannel}},
	}}
	dev.RNGs = []libvirtxml.DomainRNG{{Model: "virtio", Backend: &libvirtxml.DomainRNGBackend{Random: &libvirtxml.DomainRNGBackendRandom{Device: "/dev/urandom"}}}}
	return dom.Marshal()
}

// namespaced puts the record's element in computeql's namespace, as libvirt requires of
// metadata elements.
func namespaced(el string) string {
	el = strings.Replace(el, "<server>", fmt.Sprintf(`<%s:server xmlns:%s=%q>`, metadataKey, metadataKey, metadataNS), 1)
	return strings.Replace(el, "</server>", "</"+metadataKey+":server>", 1)
}

func fileDisk(path, format, dev string, readonly bool) libvirtxml.DomainDisk {
	d := libvirtxml.DomainDisk{
		Device: "disk",
		Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: format},
		Source: &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: path}},
		Target: &libvirtxml.DomainDiskTarget{Dev: dev, Bus: "virtio"},
	}
	if readonly {
		d.ReadOnly = &libvirtxml.DomainDiskReadOnly{}
	}
	return d
}

// offersKVM reports whether the host's capabilities list a kvm domain type for x86_64.
func offersKVM(caps string) bool {
	var c libvirtxml.Caps
	if err := c.Unmarshal(caps); err != nil {
		return false
	}
	for _, g := range c.Guests {
		if g.Arch.Name != "x86_64" {
			continue
		}
		for _, d := range g.Arch.Domains {
			if d.Type == "kvm" {
				return true
			}
		}
	}
	return false
}

func uuidString(u golibvirt.UUID) string {
	return uuid.UUID(u).String()
}

func parseUUID(id string) (golibvirt.UUID, bool) {
	u, err := uuid.Parse(id)
	if err != nil {
		return golibvirt.UUID{}, false
	}
	return golibvirt.UUID(u), true
}
