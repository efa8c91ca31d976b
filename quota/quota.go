// Package quota names the kinds of resource an organization's quota limits and the
// amounts an instance is charged. Both the catalogue (initial limits) and the instance rules
// (charges) speak in these terms; storing and enforcing them is the store's job.
package quota

import "fmt"

// Kind is a kind of resource with a per-organization limit.
type Kind string

// The kinds of quota. The values are the public names used in the API and catalogue file.
const (
	Servers   Kind = "servers"
	GPUs      Kind = "gpus"
	PublicIPs Kind = "publicIPs"
	CPUs      Kind = "cpus"
	MemoryGiB Kind = "memoryGiB"
)

// Kinds lists every kind in the order the API reports them.
var Kinds = []Kind{Servers, GPUs, PublicIPs, CPUs, MemoryGiB}

// ParseKind returns the kind with the given public name.
func ParseKind(s string) (Kind, error) {
	for _, k := range Kinds {
		if string(k) == s {
			return k, nil
		}
	}
	return "", fmt.Errorf("unknown quota kind %q (want one of servers, gpus, publicIPs, cpus, memoryGiB)", s)
}

// DefaultLimits are the limits of an organization whose catalogue entry does not set them.
// They are deliberately small: a tenant gets more by an admin's setQuota, not by accident.
func DefaultLimits() Amounts {
	return Amounts{Servers: 10, GPUs: 0, PublicIPs: 2, CPUs: 64, MemoryGiB: 256}
}

// Amounts maps kinds to quantities: limits, usage or a charge. A missing kind is zero.
type Amounts map[Kind]int64

// Sub returns a - b for every kind in either.
func (a Amounts) Sub(b Amounts) Amounts {
	out := Amounts{}
	for _, k := range Kinds {
		if d := a[k] - b[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}
