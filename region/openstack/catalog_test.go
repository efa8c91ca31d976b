package openstack

import (
	"strings"
	"testing"
)

func TestCatalogID(t *testing.T) {
	for name, want := range map[string]string{
		"m1.small":                     "m1.small",
		"Ubuntu 24.04 (Noble)":         "ubuntu-24.04-noble",
		"--private net--":              "private-net",
		"日本":                           "",
		strings.Repeat("a", 70):        strings.Repeat("a", 63),
		strings.Repeat("a", 62) + " b": strings.Repeat("a", 62),
	} {
		if got := catalogID(name); got != want {
			t.Errorf("catalogID(%q) = %q, want %q", name, got, want)
		}
	}
}

// TestDescriberID checks that two cloud objects of one name get two ids, and that an object
// without a usable name gets its cloud id.
func TestDescriberID(t *testing.T) {
	s := describer{ids: map[string]bool{}}
	long := strings.Repeat("x", 63)
	got := []string{s.id("web", "1"), s.id("Web", "2"), s.id("web", "3"), s.id("日本", "0A1B-c2"), s.id(long, "4"), s.id(long, "5")}
	want := []string{"web", "web-2", "web-3", "0a1b-c2", long, strings.Repeat("x", 61) + "-2"}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("ids %q, want %q", got, want)
			break
		}
	}
}
