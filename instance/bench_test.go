package instance_test

import (
	"fmt"
	"testing"

	"github.com/computeql/computeql/instance"
)

// BenchmarkCreate measures the domain create path (validation, quota, name claim, store
// transaction and enqueue) against the real Redis.
func BenchmarkCreate(b *testing.B) {
	e := newEnv(b)
	e.unlimited(b, "acme") // quota must never refuse, however many iterations run
	req := validCreate()
	req.Tags = []instance.Tag{{Name: "env", Value: "bench"}}
	req.Networking = &instance.NetworkingRequest{
		SecurityGroupIDs: []string{"sg-acme-web-eu-ssh"}, AllowedSourceAddresses: []string{"10.0.0.0/8"},
	}
	req.UserData = b64("#cloud-config\n")
	i := 0
	for b.Loop() {
		req.Name = fmt.Sprintf("bench-%d", i)
		i++
		if _, err := e.svc.Create(acmeMember, req); err != nil {
			b.Fatal(err)
		}
	}
}
