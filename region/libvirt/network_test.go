package libvirt

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/computeql/computeql/region"
)

func TestCandidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		prefix string
		used   []string
		moved  int
		want   string // "" for none
	}{
		{name: "the lowest past the gateway", prefix: "10.0.0.0/24", want: "10.0.0.2"},
		{name: "the lowest free", prefix: "10.0.0.0/24", used: []string{"10.0.0.2", "10.0.0.3", "10.0.0.5"}, want: "10.0.0.4"},
		{name: "never the broadcast address", prefix: "10.0.0.0/29", used: []string{"10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"}, want: "10.0.0.6"},
		{name: "a /29 all used", prefix: "10.0.0.0/29", used: []string{"10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"}},
		{name: "a /30's one address", prefix: "10.0.0.4/30", want: "10.0.0.6"},
		{name: "a /30's one address used", prefix: "10.0.0.4/30", used: []string{"10.0.0.6"}},
		{name: "moved, the last one free is found from wherever it starts", prefix: "10.0.0.0/29", moved: 3, used: []string{"10.0.0.2", "10.0.0.3", "10.0.0.5", "10.0.0.6"}, want: "10.0.0.4"},
		{name: "moved, a /30's one address", prefix: "10.0.0.4/30", moved: 1, want: "10.0.0.6"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			used := map[string]bool{}
			for _, ip := range tc.used {
				used[ip] = true
			}
			got, ok := candidate(netip.MustParsePrefix(tc.prefix), used, "52:54:00:00:00:01", tc.moved)
			if tc.want == "" {
				if ok {
					t.Fatalf("candidate %s, want none", got)
				}
				return
			}
			if !ok || got.String() != tc.want {
				t.Fatalf("candidate %s (%v), want %s", got, ok, tc.want)
			}
		})
	}
}

// Two hosts reserving at once try the same lowest address and both give it back when each sees
// the other's: from then on they must part, not go on in step through the prefix. Every pair of
// MACs here parts within the conflicts a reservation may meet.
func TestCandidatesOfHostsInStepPart(t *testing.T) {
	prefix := netip.MustParsePrefix("10.0.0.0/24")
	// MACs as randomMAC makes them, from a fixed seed: pairs that differ in more than a byte.
	rnd := rand.New(rand.NewPCG(1, 2))
	mac := func() string {
		return fmt.Sprintf("52:54:00:%02x:%02x:%02x", rnd.IntN(256), rnd.IntN(256), rnd.IntN(256))
	}
	for pair := range 2000 {
		a, b := mac(), mac()
		// What both hosts saw used, plus what each tried itself.
		seen := map[string]bool{"10.0.0.2": true, "10.0.0.7": true}
		usedA, usedB := maps.Clone(seen), maps.Clone(seen)
		moved := 0
		for {
			ipA, okA := candidate(prefix, usedA, a, moved)
			ipB, okB := candidate(prefix, usedB, b, moved)
			if !okA || !okB {
				t.Fatalf("pair %d (%s, %s): the prefix ran out after %d moves", pair, a, b, moved)
			}
			if ipA != ipB {
				break
			}
			usedA[ipA.String()], usedB[ipB.String()] = true, true
			if moved++; moved == maxConflicts {
				t.Fatalf("pair %s and %s: still in step after %d moves, at %s", a, b, moved, ipA)
			}
		}
	}
}

// However often a reservation moves, it tries every free address once before it finds none.
func TestCandidatesCoverThePrefix(t *testing.T) {
	prefix := netip.MustParsePrefix("10.0.0.16/28") // .18 to .30
	used := map[string]bool{"10.0.0.20": true, "10.0.0.25": true}
	tried := map[string]bool{}
	for moved := 0; ; moved++ {
		ip, ok := candidate(prefix, used, "52:54:00:aa:bb:cc", moved)
		if !ok {
			break
		}
		if !prefix.Contains(ip) || tried[ip.String()] {
			t.Fatalf("move %d: %s, outside the prefix or tried before", moved, ip)
		}
		tried[ip.String()], used[ip.String()] = true, true
	}
	if len(tried) != 11 { // 13 between the gateway and the broadcast address, 2 used
		t.Errorf("tried %d addresses (%v), want the 11 free", len(tried), tried)
	}
}

// An address another host of the region reserved at the same moment as this one makes this
// one give its reservation back and try another; a reservation every try of which another
// host takes ends ErrUnavailable, holding nothing.
func TestLibvirtReserveMovesOffAnotherHostsAddress(t *testing.T) {
	d, conn, _ := collectingDriver(t)
	network, _ := d.opts.Catalog.Network("labnet")
	net, err := d.ensureNetwork(conn, network)
	if err != nil {
		t.Fatal(err)
	}
	held := func(mac string) []string {
		hosts, err := reservations(conn, net)
		if err != nil {
			t.Fatal(err)
		}
		var ips []string
		for _, h := range hosts {
			if strings.EqualFold(h.MAC, mac) {
				ips = append(ips, h.IP)
			}
		}
		return ips
	}
	for _, tc := range []struct {
		name  string
		takes int // how many of this host's tries the other host takes
	}{
		{"two taken", 2},
		{"every one taken", maxConflicts},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mac := randomMAC()
			// The other host holds what it took, each time with a MAC of its own; the driver
			// asks before it tries and after each reservation it makes.
			other := map[string]string{}
			d.elsewhere = func(string) map[string]string {
				for _, ip := range held(mac) {
					if _, taken := other[ip]; !taken && len(other) < tc.takes {
						other[ip] = randomMAC()
					}
				}
				return maps.Clone(other)
			}
			t.Cleanup(func() { d.elsewhere = nil })
			ip, err := d.reserve(conn, net, network, mac)
			mine := held(mac)
			if tc.takes == maxConflicts {
				if !errors.Is(err, region.ErrUnavailable) || len(mine) > 0 {
					t.Fatalf("reserve got %q, %v, holding %v; want ErrUnavailable, holding nothing", ip, err, mine)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, taken := other[ip]; taken || !slices.Equal(mine, []string{ip}) || len(other) != tc.takes {
				t.Errorf("reserved %s, holding %v, the other host holding %v; want one address of its own, the %d taken given back", ip, mine, other, tc.takes)
			}
		})
	}
}
