package region

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"
)

// InstanceTag is the reserved tag that links a server to the instance it realises. The instance
// stores no server id: the server is found by this tag within the instance's scope.
const InstanceTag = "compute/instance-id"

// ServerState is what the region says a server is doing.
type ServerState string

// Server states. PENDING and BUILDING are provisioning; DELETING is on its way out.
const (
	ServerPending   ServerState = "PENDING"
	ServerBuilding  ServerState = "BUILDING"
	ServerRunning   ServerState = "RUNNING"
	ServerStopping  ServerState = "STOPPING"
	ServerStopped   ServerState = "STOPPED"
	ServerStarting  ServerState = "STARTING"
	ServerRebooting ServerState = "REBOOTING"
	ServerDeleting  ServerState = "DELETING"
	ServerError     ServerState = "ERROR"
)

// Provisioning reports whether the region is still bringing the server up.
func (s ServerState) Provisioning() bool { return s == ServerPending || s == ServerBuilding }

// Live returns, as a new slice, the servers that are not being deleted: a server on its way
// out (a rebuilt or duplicate one) realises nothing any more.
func Live(servers []Server) []Server {
	out := make([]Server, 0, len(servers))
	for _, s := range servers {
		if s.State != ServerDeleting {
			out = append(out, s)
		}
	}
	return out
}

// ServerHealth is the region's view of a server's health.
type ServerHealth string

// Server health.
const (
	HealthUnknown  ServerHealth = "UNKNOWN"
	HealthHealthy  ServerHealth = "HEALTHY"
	HealthDegraded ServerHealth = "DEGRADED"
	HealthError    ServerHealth = "ERROR"
)

// ServerNetworking is how a server is reachable; the region applies changes to it in place.
type ServerNetworking struct {
	SecurityGroupIDs       []string `json:"securityGroupIds,omitempty"`
	PublicIP               bool     `json:"publicIP,omitempty"`
	AllowedSourceAddresses []string `json:"allowedSourceAddresses,omitempty"`
}

// Scope narrows server lookups: every field must match.
type Scope struct {
	OrganizationID string `json:"organizationId"`
	ProjectID      string `json:"projectId"`
	RegionID       string `json:"region"`
	NetworkID      string `json:"networkId"`
}

// ServerSpec is what a server is created with. Changing anything but Networking needs a new
// server.
type ServerSpec struct {
	Scope
	Name                      string `json:"name"`
	FlavorID                  string `json:"flavorId"`
	ImageID                   string `json:"imageId"`
	SSHCertificateAuthorityID string `json:"sshCertificateAuthorityId,omitempty"`
	UserData                  []byte `json:"userData,omitempty"`
	// SSHPublicKeys are OpenSSH authorized_keys lines the guest accepts, beside the project
	// key pair or the certificate authority.
	SSHPublicKeys []string          `json:"sshPublicKeys,omitempty"`
	Networking    ServerNetworking  `json:"networking"`
	Tags          map[string]string `json:"tags"`
}

// Server is a virtual machine in a region: the hidden execution primitive behind an instance.
type Server struct {
	ID string `json:"id"`
	ServerSpec
	State  ServerState  `json:"state"`
	Health ServerHealth `json:"health"`
	// Message is the region's own, user-safe word on the state (e.g. why a build failed).
	Message   string    `json:"message,omitempty"`
	PrivateIP string    `json:"privateIP,omitempty"`
	PublicIP  string    `json:"publicIP,omitempty"`
	MAC       string    `json:"mac,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
}

// EventKind says what happened to a server.
type EventKind string

// Server event kinds.
const (
	ServerCreated EventKind = "created"
	ServerUpdated EventKind = "updated"
	ServerDeleted EventKind = "deleted"
)

// Event is a change of a server, as a region's watch reports it.
type Event struct {
	// Cursor is the position of the event; watching after it resumes with the next one.
	Cursor   string
	Kind     EventKind
	ServerID string
	// Scope and Tags are the server's, so its owner can be found without a lookup.
	Scope Scope
	Tags  map[string]string
}

// Errors a region reports; callers tell them apart with errors.Is.
var (
	// ErrServerNotFound: no server with that id.
	ErrServerNotFound = errors.New("server not found")
	// ErrImageNotFound: no image the region made with that id in the project asked about.
	ErrImageNotFound = errors.New("image not found")
	// ErrUnavailable: the region failed to answer; retrying may help.
	ErrUnavailable = errors.New("region unavailable")
	// ErrUnreachable: the region's host cannot be reached at all (no connection), as opposed
	// to one call failing. It is also ErrUnavailable. Nothing about its servers is known
	// until it is back, and nothing is decided from its silence: callers wait and retry.
	ErrUnreachable = fmt.Errorf("region host cannot be reached: %w", ErrUnavailable)
	// ErrRefused: the region will not do this to the server in its state (e.g. stop a stopped
	// server); the wrapping error says why, in words fit for users.
	ErrRefused = errors.New("refused by the region")
	// ErrNoCapacity: the region has no room for the server now (memory, CPUs, disk or
	// addresses); the wrapping error says what is short, in words fit for users. Retrying
	// later may succeed, as capacity frees.
	ErrNoCapacity = errors.New("no capacity in the region")
)

// HostUnreachable is ErrUnreachable for one host of a region of several: what that host holds
// is unknown until it is back, while the other hosts answer.
type HostUnreachable struct{ Region, Host string }

func (e HostUnreachable) Error() string {
	return "host " + e.Host + " of region " + e.Region + " cannot be reached"
}

// Unwrap makes the error ErrUnreachable.
func (e HostUnreachable) Unwrap() error { return ErrUnreachable }

// Reason is the region's own words in err, fit for users: its text without the sentinel
// (ErrRefused, ErrNoCapacity, …) it wraps.
func Reason(err, sentinel error) string {
	return strings.TrimSuffix(strings.TrimSuffix(err.Error(), sentinel.Error()), ": ")
}

// ConsoleOutputMax is the most of a server's serial console output one call returns.
const ConsoleOutputMax = 64 << 10

// ConsoleOutput is the end of a server's serial console output.
type ConsoleOutput struct {
	// Text is valid UTF-8: bytes that are not are replaced, and a character cut by the start
	// of the tail is dropped.
	Text string `json:"text"`
	// Truncated: the console wrote more than Text holds.
	Truncated  bool      `json:"truncated"`
	CapturedAt time.Time `json:"capturedAt"`
}

// TailText returns the last tailBytes of out as ConsoleOutput text: cut at a character
// boundary, invalid UTF-8 replaced, and whether anything was left out before it.
func TailText(out []byte, tailBytes int, capturedAt time.Time) ConsoleOutput {
	truncated := len(out) > tailBytes
	if truncated {
		out = out[len(out)-tailBytes:]
		// A character whose first bytes fell before the tail is dropped, not garbled.
		for i := 0; i < utf8.UTFMax && len(out) > 0 && !utf8.RuneStart(out[0]); i++ {
			out = out[1:]
		}
	}
	return ConsoleOutput{Text: strings.ToValidUTF8(string(out), "\uFFFD"), Truncated: truncated, CapturedAt: capturedAt.UTC()}
}

// SSHKey is the private key of the project key pair a server without an SSH certificate
// authority accepts.
type SSHKey struct {
	PrivateKey string `json:"privateKey"`
}

// ImageRequest asks for a snapshot of a server as a new image.
type ImageRequest struct {
	Name string            `json:"name"`
	Tags map[string]string `json:"tags"`
}

// Client is a cloud region as workers see it. Every call acts at once and returns the state
// the region accepted; the state then evolves on its own and every change is reported by Watch.
type Client interface {
	// FindServers returns the servers in scope carrying the tag with the value. The lookup is
	// direct (an index by tag), never a listing of everything.
	FindServers(ctx context.Context, scope Scope, tag, value string) ([]Server, error)
	// CreateServer starts building a server.
	CreateServer(ctx context.Context, spec ServerSpec) (Server, error)
	// UpdateNetworking changes a server's networking in place.
	UpdateNetworking(ctx context.Context, id string, n ServerNetworking) (Server, error)
	// GetServer returns a server, or ErrServerNotFound.
	GetServer(ctx context.Context, id string) (Server, error)
	// DeleteServer starts deleting a server; it is gone once Watch reports it deleted.
	// Deleting a server that is gone already is not an error.
	DeleteServer(ctx context.Context, id string) error
	// StartServer powers a stopped server on; StopServer powers a running one off;
	// RebootServer restarts a running one (hard: power-cycles it). Each returns at once with
	// the server in its transitional state; other states are refused (ErrRefused).
	StartServer(ctx context.Context, id string) (Server, error)
	StopServer(ctx context.Context, id string) (Server, error)
	RebootServer(ctx context.Context, id string, hard bool) (Server, error)
	// ResizeServer gives a stopped server another flavor: its CPUs and memory, and its disk
	// grown to the flavor's. The server keeps its disk's content, addresses and MAC, and stays
	// stopped. A server that is not STOPPED, or a flavor with a smaller disk, is refused
	// (ErrRefused); a host without room for the new flavor is ErrNoCapacity.
	ResizeServer(ctx context.Context, id, flavorID string) (Server, error)
	// ConsoleOutput returns the last tailBytes (at most ConsoleOutputMax) of the server's
	// serial console output, since it was created.
	ConsoleOutput(ctx context.Context, id string, tailBytes int) (ConsoleOutput, error)
	// OpenConsole attaches to the serial console of a running server (any other state is
	// ErrRefused): reads return what the guest writes from then on (ConsoleOutput has what
	// came before), writes are typed into it, and Close detaches. Reads end with io.EOF when
	// the guest's console goes away (it stopped, or another attachment took the console),
	// and with ErrConsoleOverrun when the reader fell ConsoleBacklog behind.
	OpenConsole(ctx context.Context, id string) (io.ReadWriteCloser, error)
	// SSHKey returns the project key pair's private key of a server that uses it; a server
	// with an SSH certificate authority is refused (ErrRefused).
	SSHKey(ctx context.Context, id string) (SSHKey, error)
	// Snapshot starts making an image of a RUNNING or STOPPED server, which keeps running or
	// stays stopped; the image is CREATING, then READY (or FAILED, the server unharmed).
	// Other states are refused (ErrRefused). The image belongs to the server's project, is
	// offered in its region, has the shape of the server's image and the size of its disk,
	// and a server of the project can be created from it once it is READY.
	Snapshot(ctx context.Context, id string, req ImageRequest) (Image, error)
	// Images returns the images the region made for an organization's project (snapshots).
	Images(ctx context.Context, org, project string) ([]Image, error)
	// DeleteImage deletes an image the region made for the project: ErrImageNotFound when
	// the project has none with the id, ErrRefused while it is CREATING or a server's disk
	// still rests on it.
	DeleteImage(ctx context.Context, org, project, id string) error
	// Watch calls fn for every server event after the cursor ("" for events from now on), in
	// order, until ctx ends or fn returns an error.
	Watch(ctx context.Context, after string, fn func(Event) error) error
}

// Lister is a region that can list every one of its servers. Listing walks the whole region,
// so it is for audits and the collection of orphans, never for the request path.
type Lister interface {
	Servers(ctx context.Context) ([]Server, error)
}
