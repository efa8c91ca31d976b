package openstack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/config"
	"github.com/gophercloud/gophercloud/v2/openstack/config/clouds"
	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/region"
)

// computeMicroversion is the Nova API version the driver speaks: 2.52 is the first that takes
// tags when a server is created, so that no server ever exists without its instance tag.
const computeMicroversion = "2.52"

// Options configure a driver.
type Options struct {
	// Region is the catalogue region the driver serves, with its OpenStack settings. Required.
	Region region.Region
	// Catalog resolves flavors, images, networks and security groups to the cloud's. Required.
	Catalog *region.Catalog
	// Redis keeps each project's SSH key pair, which every process must hand out alike.
	// Required.
	Redis redis.UniversalClient
	// CloudsFile is the clouds.yaml to read; "" looks where OpenStack's tools look.
	CloudsFile string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Driver is an OpenStack region. Its methods are safe for concurrent use; it authenticates on
// first use and again whenever that failed, so a cloud that is down at the start is no error
// until it is called.
type Driver struct {
	opts           Options
	auth           gophercloud.AuthOptions
	endpoint       gophercloud.EndpointOpts
	requestTimeout time.Duration
	pollInterval   time.Duration
	log            *slog.Logger

	mu      sync.Mutex
	clients *clients // nil until authenticated
	// keyPairs are the project key pairs known to be in Nova, by name.
	keyPairs sync.Map

	extMu sync.Mutex
	extID string // the external network's id, "" until looked up

	// refs are the cloud's ids of the catalogue entries that name their object by name, as
	// looked up.
	refsMu sync.Mutex
	refs   map[refKey]string

	// touched are the servers this process created, or left in the middle of a verb, in the
	// last touchMemory, each with the event that reports it: every watch of the process reads
	// them until they settle (see watcher.unsettled).
	touchedMu sync.Mutex
	touched   map[string]touch

	// consoles are this process's attachments to serial consoles, by server.
	consoleMu sync.Mutex
	consoles  map[string]*serialConsole
}

// touch is a server this process created or acted on, and when.
type touch struct {
	at time.Time
	ev region.Event
	// made: created, rather than acted on. Sticky: a server made and then acted on before
	// a watch listed it is still to be reported created.
	made bool
}

// touchMemory is how long the servers this process touched are read by its watches until they
// settle: far longer than a poll or a verb, short enough that the set stays small.
const touchMemory = 10 * time.Minute

// remember records a server this process created (made) or acted on, forgetting those older
// than touchMemory.
func (d *Driver) remember(ev region.Event, made bool) {
	now := time.Now()
	d.touchedMu.Lock()
	defer d.touchedMu.Unlock()
	if d.touched == nil {
		d.touched = map[string]touch{}
	}
	for id, t := range d.touched {
		if now.Sub(t.at) > touchMemory {
			delete(d.touched, id)
		}
	}
	if old, ok := d.touched[ev.ServerID]; ok && old.made {
		made = true
	}
	d.touched[ev.ServerID] = touch{at: now, ev: ev, made: made}
}

// recentlyTouched returns the servers this process touched in the last touchMemory.
func (d *Driver) recentlyTouched() map[string]touch {
	d.touchedMu.Lock()
	defer d.touchedMu.Unlock()
	out := make(map[string]touch, len(d.touched))
	for id, t := range d.touched {
		if time.Since(t.at) <= touchMemory {
			out[id] = t
		}
	}
	return out
}

// clients are the service clients of one authenticated session.
type clients struct {
	compute, network, image *gophercloud.ServiceClient
}

var _ region.Client = (*Driver)(nil)

// New returns a driver of the region; it reads clouds.yaml now and connects on first use.
func New(opts Options) (*Driver, error) {
	r := opts.Region
	if r.Driver != region.DriverOpenStack || r.OpenStack == nil {
		return nil, fmt.Errorf("openstack: region %q is not an OpenStack region", r.ID)
	}
	if opts.Catalog == nil || opts.Redis == nil {
		return nil, errors.New("openstack: Catalog and Redis are required")
	}
	timeout, err := time.ParseDuration(r.OpenStack.RequestTimeout)
	if err != nil || timeout <= 0 {
		return nil, fmt.Errorf("openstack: region %q: requestTimeout %q is not a positive duration", r.ID, r.OpenStack.RequestTimeout)
	}
	poll, err := time.ParseDuration(r.OpenStack.PollInterval)
	if err != nil || poll <= 0 {
		return nil, fmt.Errorf("openstack: region %q: pollInterval %q is not a positive duration", r.ID, r.OpenStack.PollInterval)
	}
	parse := []clouds.ParseOption{clouds.WithCloudName(r.OpenStack.Cloud)}
	if opts.CloudsFile != "" {
		parse = append(parse, clouds.WithLocations(opts.CloudsFile))
	}
	auth, endpoint, _, err := clouds.Parse(parse...)
	if err != nil {
		return nil, fmt.Errorf("openstack: region %q: cloud %q: %w", r.ID, r.OpenStack.Cloud, err)
	}
	// A token that expires is renewed by the client, not reported as a refusal.
	auth.AllowReauth = true
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Driver{
		opts: opts, auth: auth, endpoint: endpoint, requestTimeout: timeout, pollInterval: poll,
		log: opts.Logger.With("region", r.ID, "cloud", r.OpenStack.Cloud),
	}, nil
}

// session returns the service clients, authenticating first when there are none.
func (d *Driver) session(ctx context.Context) (*clients, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.clients != nil {
		return d.clients, nil
	}
	ctx, cancel := context.WithTimeout(ctx, d.requestTimeout)
	defer cancel()
	pc, err := config.NewProviderClient(ctx, d.auth)
	if err != nil {
		return nil, fault("authenticate", err)
	}
	pc.RetryBackoffFunc = retryAfter
	compute, err := openstack.NewComputeV2(pc, d.endpoint)
	if err != nil {
		return nil, fmt.Errorf("openstack: compute endpoint: %w: %w", err, region.ErrUnavailable)
	}
	compute.Microversion = computeMicroversion
	network, err := openstack.NewNetworkV2(pc, d.endpoint)
	if err != nil {
		return nil, fmt.Errorf("openstack: network endpoint: %w: %w", err, region.ErrUnavailable)
	}
	image, err := openstack.NewImageV2(pc, d.endpoint)
	if err != nil {
		return nil, fmt.Errorf("openstack: image endpoint: %w: %w", err, region.ErrUnavailable)
	}
	d.clients = &clients{compute: compute, network: network, image: image}
	return d.clients, nil
}

// call runs one request of the cloud within the request timeout.
func (d *Driver) call(ctx context.Context, what string, f func(context.Context, *clients) error) error {
	c, err := d.session(ctx)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, d.requestTimeout)
	defer cancel()
	if err := f(ctx, c); err != nil {
		return fault(what, err)
	}
	return nil
}

// maxRetryAfter bounds how long one 429 is waited out, whatever the cloud asks.
const maxRetryAfter = 30 * time.Second

// retryAfter waits as long as a 429's Retry-After says (seconds or a date), one second when it
// says nothing, and gives up when the context ends first.
func retryAfter(ctx context.Context, resp *gophercloud.ErrUnexpectedResponseCode, err error, _ uint) error {
	wait := time.Second
	if h := resp.ResponseHeader.Get("Retry-After"); h != "" {
		if s, perr := strconv.Atoi(h); perr == nil {
			wait = time.Duration(s) * time.Second
		} else if at, perr := http.ParseTime(h); perr == nil {
			wait = time.Until(at)
		}
	}
	wait = min(max(wait, 0), maxRetryAfter)
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w (while waiting out a 429: %w)", err, ctx.Err())
	}
}

// statusError keeps the HTTP status of a classified error of the cloud, for the callers that
// must tell a conflict from another refusal; it reads as the error it wraps.
type statusError struct {
	status int
	err    error
}

func (e *statusError) Error() string { return e.err.Error() }
func (e *statusError) Unwrap() error { return e.err }

// isConflict reports whether the cloud answered 409: the server is busy with something else.
func isConflict(err error) bool {
	var se *statusError
	return errors.As(err, &se) && se.status == http.StatusConflict
}

// fault classifies an error of the cloud as the region's errors, keeping the cloud's message.
func fault(what string, err error) error {
	var code gophercloud.ErrUnexpectedResponseCode
	if errors.As(err, &code) {
		return &statusError{status: code.Actual, err: classify(what, code)}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("openstack: %s: %w: %w", what, err, region.ErrUnavailable)
	}
	var urlErr *url.Error
	var netErr *net.OpError
	if errors.As(err, &netErr) || errors.As(err, &urlErr) {
		return fmt.Errorf("openstack: %s: %w: %w", what, err, region.ErrUnreachable)
	}
	return fmt.Errorf("openstack: %s: %w: %w", what, err, region.ErrUnavailable)
}

// classify is the region's error of an answer of the cloud that is not a success.
func classify(what string, code gophercloud.ErrUnexpectedResponseCode) error {
	msg := cloudMessage(code.Body)
	if msg == "" {
		msg = http.StatusText(code.Actual)
	}
	switch {
	case code.Actual == http.StatusNotFound:
		return fmt.Errorf("openstack: %s: %s: %w", what, msg, errNotFound)
	case code.Actual >= 500 || code.Actual == http.StatusTooManyRequests:
		return fmt.Errorf("openstack: %s: %d %s: %w", what, code.Actual, msg, region.ErrUnavailable)
	case quota(code.Body):
		return fmt.Errorf("openstack: %s: %s: %w", what, msg, region.ErrNoCapacity)
	case code.Actual == http.StatusUnauthorized:
		return fmt.Errorf("openstack: %s: the cloud refused computeql's credentials: %s: %w", what, msg, region.ErrUnavailable)
	}
	return fmt.Errorf("openstack: %s: %s: %w", what, msg, region.ErrRefused)
}

// errNotFound is a 404 of the cloud, which each caller turns into what is missing.
var errNotFound = errors.New("not found in the cloud")

// cloudMessage finds the message in an error body of Nova ({"badRequest": {"message": …}}),
// Neutron ({"NeutronError": {"message": …}}) or Keystone ({"error": {"message": …}}).
func cloudMessage(body []byte) string {
	var doc map[string]json.RawMessage
	if json.Unmarshal(body, &doc) != nil {
		return ""
	}
	for _, raw := range doc {
		var inner struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(raw, &inner) == nil && inner.Message != "" {
			return inner.Message
		}
	}
	return ""
}

// quota reports whether an error body says a quota or a pool ran out: Nova's "Quota exceeded",
// Neutron's OverQuota and its exhausted address pools.
func quota(body []byte) bool {
	var doc struct {
		NeutronError struct {
			Type string `json:"type"`
		} `json:"NeutronError"`
	}
	if json.Unmarshal(body, &doc) == nil {
		switch doc.NeutronError.Type {
		case "OverQuota", "IpAddressGenerationFailure":
			return true
		}
	}
	var nova map[string]struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &nova) == nil {
		for _, v := range nova {
			if strings.HasPrefix(v.Message, "Quota exceeded") {
				return true
			}
		}
	}
	return false
}
