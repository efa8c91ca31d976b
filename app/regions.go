package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/libvirt"
	"github.com/computeql/computeql/region/openstack"
	"github.com/computeql/computeql/region/sim"
)

// catalogueCheckTimeout bounds the check of an OpenStack region's catalogue at start.
const catalogueCheckTimeout = time.Minute

// regionDrivers is every region driver of a process, behind one router.
type regionDrivers struct {
	router *region.Router
	// runs are what the drivers do in the background until the process stops: the
	// simulator's clock, a libvirt host's connection and its events.
	runs []func(context.Context) error
}

// newRegionDrivers builds the driver of each catalogue region: one simulator serves every
// simulated region, each libvirt region has a driver of its own, connected to its host
// for as long as the process runs, and each OpenStack region one of the cloud clouds.yaml
// names. Every role but api drives
// the simulator's clock; several clocks are safe, and the region keeps moving as long as any
// process runs.
func newRegionDrivers(cat *region.Catalog, rdb redis.UniversalClient, role string, simOpts sim.Options, log *slog.Logger, reg prometheus.Registerer) (*regionDrivers, error) {
	d := &regionDrivers{}
	var routes []region.Route
	var simulator *sim.Sim
	for _, r := range cat.Regions {
		switch r.Driver {
		case region.DriverSim:
			if simulator == nil {
				var err error
				if simulator, err = sim.New(rdb, simOpts); err != nil {
					return nil, err
				}
				if role != "api" {
					d.runs = append(d.runs, simulator.Run)
				}
			}
			routes = append(routes, region.Route{Region: r.ID, Driver: region.DriverSim, Client: simulator})
		case region.DriverLibvirt:
			// Every role that calls the region keeps its own connection to the host: the API
			// for the verbs, workers to reconcile. The region role only clocks the simulator.
			if role == "region" {
				continue
			}
			drv, err := libvirt.New(libvirt.Options{Region: r, Catalog: cat, Redis: rdb, Logger: log})
			if err != nil {
				return nil, err
			}
			d.runs = append(d.runs, drv.Run)
			if err := drv.Register(reg); err != nil {
				return nil, err
			}
			routes = append(routes, region.Route{Region: r.ID, Driver: region.DriverLibvirt + ":" + r.ID, Client: drv})
		case region.DriverOpenStack:
			// Like a libvirt region's: the API and workers call the cloud, the region role does
			// not. The driver has nothing to run: it connects on first use, and each watch polls.
			if role == "region" {
				continue
			}
			drv, err := openstack.New(openstack.Options{Region: r, Catalog: cat, Redis: rdb, Logger: log})
			if err != nil {
				return nil, err
			}
			// The catalogue's flavors, images, networks and security groups are looked up in the
			// cloud now, so that one it lacks stops the process, named; a cloud that does not
			// answer is no reason not to start (names are then looked up on first use).
			ctx, cancel := context.WithTimeout(context.Background(), catalogueCheckTimeout)
			err = drv.Check(ctx)
			cancel()
			switch {
			case errors.Is(err, region.ErrUnreachable) || errors.Is(err, region.ErrUnavailable):
				log.Warn("openstack: the catalogue is not checked against the cloud, which does not answer", "region", r.ID, "err", err)
			case err != nil:
				return nil, err
			}
			routes = append(routes, region.Route{Region: r.ID, Driver: region.DriverOpenStack + ":" + r.ID, Client: drv})
		default:
			return nil, fmt.Errorf("region %q: driver %q is not built into this process", r.ID, r.Driver)
		}
	}
	router, err := region.NewRouter(routes)
	if err != nil {
		return nil, err
	}
	d.router = router
	return d, nil
}
