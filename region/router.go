package region

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"sync"
)

// Router is a Client over the drivers of a deployment: each call goes to the driver that serves
// the region it concerns. Drivers see their own server ids; callers see the id qualified by its
// region, "<region>/<id>", which is how a call naming only a server finds its driver again.
// Region ids cannot contain "/", so the split is unambiguous.
type Router struct {
	byRegion map[string]Client
	// drivers are the distinct drivers, each watched and asked for images once however many
	// regions it serves, keyed by the name their watch cursor goes under.
	drivers map[string]Client
}

var (
	_ Client = (*Router)(nil)
	_ Lister = (*Router)(nil)
)

// Route is one region's driver. Regions served by the same driver value (a simulator serving
// every simulated region, say) share its watch.
type Route struct {
	Region string
	// Driver names the driver instance in watch cursors; routes with the same Client must give
	// the same name, and different Clients different names.
	Driver string
	Client Client
}

// NewRouter returns a router over the routes, one per region.
func NewRouter(routes []Route) (*Router, error) {
	r := &Router{byRegion: map[string]Client{}, drivers: map[string]Client{}}
	for _, rt := range routes {
		if rt.Region == "" || strings.Contains(rt.Region, "/") || rt.Client == nil {
			return nil, fmt.Errorf("region router: bad route %+v", rt)
		}
		if _, dup := r.byRegion[rt.Region]; dup {
			return nil, fmt.Errorf("region router: region %q routed twice", rt.Region)
		}
		if c, ok := r.drivers[rt.Driver]; ok && c != rt.Client {
			return nil, fmt.Errorf("region router: driver name %q names two drivers", rt.Driver)
		}
		for name, c := range r.drivers {
			if c == rt.Client && name != rt.Driver {
				return nil, fmt.Errorf("region router: one driver is named both %q and %q", name, rt.Driver)
			}
		}
		r.byRegion[rt.Region] = rt.Client
		r.drivers[rt.Driver] = rt.Client
	}
	return r, nil
}

// ErrUnknownRegion: no driver serves the region a call concerns.
var ErrUnknownRegion = errors.New("no driver serves the region")

func (r *Router) driver(regionID string) (Client, error) {
	c, ok := r.byRegion[regionID]
	if !ok {
		return nil, fmt.Errorf("region %q: %w", regionID, ErrUnknownRegion)
	}
	return c, nil
}

// route splits a qualified server id. An id that names no routed region is a server that
// cannot exist.
func (r *Router) route(id string) (Client, string, error) {
	regionID, inner, ok := strings.Cut(id, "/")
	c, known := r.byRegion[regionID]
	if !ok || !known || inner == "" {
		return nil, "", fmt.Errorf("server %q: %w", id, ErrServerNotFound)
	}
	return c, inner, nil
}

func qualify(s Server) Server {
	s.ID = s.RegionID + "/" + s.ID
	return s
}

func qualified(s Server, err error) (Server, error) {
	if err != nil {
		return Server{}, err
	}
	return qualify(s), nil
}

// FindServers implements Client.
func (r *Router) FindServers(ctx context.Context, scope Scope, tag, value string) ([]Server, error) {
	c, err := r.driver(scope.RegionID)
	if err != nil {
		return nil, err
	}
	servers, err := c.FindServers(ctx, scope, tag, value)
	for i := range servers {
		servers[i] = qualify(servers[i])
	}
	return servers, err
}

// CreateServer implements Client.
func (r *Router) CreateServer(ctx context.Context, spec ServerSpec) (Server, error) {
	c, err := r.driver(spec.RegionID)
	if err != nil {
		return Server{}, err
	}
	return qualified(c.CreateServer(ctx, spec))
}

// UpdateNetworking implements Client.
func (r *Router) UpdateNetworking(ctx context.Context, id string, n ServerNetworking) (Server, error) {
	c, inner, err := r.route(id)
	if err != nil {
		return Server{}, err
	}
	return qualified(c.UpdateNetworking(ctx, inner, n))
}

// GetServer implements Client.
func (r *Router) GetServer(ctx context.Context, id string) (Server, error) {
	c, inner, err := r.route(id)
	if err != nil {
		return Server{}, err
	}
	return qualified(c.GetServer(ctx, inner))
}

// DeleteServer implements Client. An id no driver could have made names a server that is gone
// already, which is not an error.
func (r *Router) DeleteServer(ctx context.Context, id string) error {
	c, inner, err := r.route(id)
	if err != nil {
		return nil
	}
	return c.DeleteServer(ctx, inner)
}

// StartServer implements Client.
func (r *Router) StartServer(ctx context.Context, id string) (Server, error) {
	c, inner, err := r.route(id)
	if err != nil {
		return Server{}, err
	}
	return qualified(c.StartServer(ctx, inner))
}

// StopServer implements Client.
func (r *Router) StopServer(ctx context.Context, id string) (Server, error) {
	c, inner, err := r.route(id)
	if err != nil {
		return Server{}, err
	}
	return qualified(c.StopServer(ctx, inner))
}

// RebootServer implements Client.
func (r *Router) RebootServer(ctx context.Context, id string, hard bool) (Server, error) {
	c, inner, err := r.route(id)
	if err != nil {
		return Server{}, err
	}
	return qualified(c.RebootServer(ctx, inner, hard))
}

// ResizeServer implements Client.
func (r *Router) ResizeServer(ctx context.Context, id, flavorID string) (Server, error) {
	c, inner, err := r.route(id)
	if err != nil {
		return Server{}, err
	}
	return qualified(c.ResizeServer(ctx, inner, flavorID))
}

// ConsoleOutput implements Client.
func (r *Router) ConsoleOutput(ctx context.Context, id string, tailBytes int) (ConsoleOutput, error) {
	c, inner, err := r.route(id)
	if err != nil {
		return ConsoleOutput{}, err
	}
	return c.ConsoleOutput(ctx, inner, tailBytes)
}

// OpenConsole implements Client.
func (r *Router) OpenConsole(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	c, inner, err := r.route(id)
	if err != nil {
		return nil, err
	}
	return c.OpenConsole(ctx, inner)
}

// SSHKey implements Client.
func (r *Router) SSHKey(ctx context.Context, id string) (SSHKey, error) {
	c, inner, err := r.route(id)
	if err != nil {
		return SSHKey{}, err
	}
	return c.SSHKey(ctx, inner)
}

// Snapshot implements Client.
func (r *Router) Snapshot(ctx context.Context, id string, req ImageRequest) (Image, error) {
	c, inner, err := r.route(id)
	if err != nil {
		return Image{}, err
	}
	return c.Snapshot(ctx, inner, req)
}

// Images implements Client: the images every driver made for the project.
func (r *Router) Images(ctx context.Context, org, project string) ([]Image, error) {
	var out []Image
	for _, c := range r.drivers {
		images, err := c.Images(ctx, org, project)
		if err != nil {
			return nil, err
		}
		out = append(out, images...)
	}
	return out, nil
}

// DeleteImage implements Client: the driver that made the image deletes it. An image id is
// not qualified by its region, so each driver is asked in turn until one has it.
func (r *Router) DeleteImage(ctx context.Context, org, project, id string) error {
	for _, c := range r.drivers {
		err := c.DeleteImage(ctx, org, project, id)
		if !errors.Is(err, ErrImageNotFound) {
			return err
		}
	}
	return fmt.Errorf("image %q: %w", id, ErrImageNotFound)
}

// Servers lists the servers of every driver that can list them (a Lister), ids qualified. A
// driver that fails is left out and its error returned with the others' servers, so that one
// unreachable host does not hide every other region.
func (r *Router) Servers(ctx context.Context) ([]Server, error) {
	var out []Server
	var errs []error
	for _, c := range r.drivers {
		l, ok := c.(Lister)
		if !ok {
			continue
		}
		servers, err := l.Servers(ctx)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, s := range servers {
			if _, routed := r.byRegion[s.RegionID]; routed {
				out = append(out, qualify(s))
			}
		}
	}
	return out, errors.Join(errs...)
}

// Watch implements Client: every driver is watched at once and fn sees their events one at a
// time. The cursor holds each driver's own cursor, so resuming resumes every driver where it
// was. The first driver's watch to fail ends the others and is the error returned; when ctx
// ends it returns nil.
func (r *Router) Watch(ctx context.Context, after string, fn func(Event) error) error {
	cursors, err := url.ParseQuery(after)
	if err != nil {
		return fmt.Errorf("watch: cursor %q: %w", after, err)
	}
	parent := ctx
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var mu sync.Mutex // serialises fn and the cursor
	var wg sync.WaitGroup
	// Every driver's starting point is read before any watch runs: once one does, its events
	// write the cursors.
	from := make(map[string]string, len(r.drivers))
	for name := range r.drivers {
		from[name] = cursors.Get(name)
	}
	for name, c := range r.drivers {
		wg.Go(func() {
			err := c.Watch(ctx, from[name], func(ev Event) error {
				mu.Lock()
				defer mu.Unlock()
				cursors.Set(name, ev.Cursor)
				ev.Cursor = cursors.Encode()
				ev.ServerID = ev.Scope.RegionID + "/" + ev.ServerID
				return fn(ev)
			})
			if err == nil {
				err = fmt.Errorf("watch of driver %q ended", name)
			}
			cancel(err)
		})
	}
	wg.Wait()
	if parent.Err() != nil {
		return nil // told to stop, like every driver's watch
	}
	return context.Cause(ctx)
}
