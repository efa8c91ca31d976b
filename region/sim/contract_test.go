package sim

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/computeql/computeql/region"
	"github.com/computeql/computeql/region/regiontest"
)

// contractHarness is a clocked simulator with the demo catalogue, its servers on acme's web
// network in EU West.
func contractHarness(t *testing.T) (*Sim, regiontest.Harness) {
	t.Helper()
	e := newEnv(t)
	s := e.sim(Options{})
	e.run(s)
	var n atomic.Int64
	return s, regiontest.Harness{
		Client:  s,
		Catalog: region.Demo(),
		Spec: func(name string) region.ServerSpec {
			return spec(t, "net-acme-web-eu", name, fmt.Sprintf("contract-%d", n.Add(1)))
		},
		Timeout:      waitLimit,
		ResizeFlavor: "g1.medium",
		Capabilities: regiontest.Capabilities{Snapshots: true, PublicIPs: true},
	}
}

func TestContract(t *testing.T) {
	_, h := contractHarness(t)
	regiontest.Run(t, h)
}

// TestContractThroughRouter: a router over the simulator, serving both demo regions, keeps the
// contract too, with the ids it qualifies.
func TestContractThroughRouter(t *testing.T) {
	s, h := contractHarness(t)
	var routes []region.Route
	for _, r := range region.Demo().Regions {
		routes = append(routes, region.Route{Region: r.ID, Driver: "sim", Client: s})
	}
	router, err := region.NewRouter(routes)
	if err != nil {
		t.Fatal(err)
	}
	h.Client = router
	regiontest.Run(t, h)
}
