package nocloud

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

func TestPrimaryIdentifier(t *testing.T) {
	tests := []struct{ name, want string }{
		{"meta-data", "META_DAT.;1"},
		{"user-data", "USER_DAT.;1"},
		{"vendor-data", "VENDOR_D.;1"},
		{"network-config", "NETWORK_.;1"},
		{"readme.txt", "README.TXT;1"},
		{"archive.tar.gz", "ARCHIVE_.GZ;1"},
		{"x.json", "X.JSO;1"},
		{".hidden", ".HID;1"},
		{"ünï", "_N_.;1"},
	}
	for _, tt := range tests {
		got, err := primaryIdentifier(tt.name)
		if err != nil || string(got) != tt.want {
			t.Errorf("primaryIdentifier(%q) = %q, %v; want %q", tt.name, got, err, tt.want)
		}
	}
	for _, bad := range []string{"", "."} {
		if got, err := primaryIdentifier(bad); err == nil {
			t.Errorf("primaryIdentifier(%q) = %q, want an error", bad, got)
		}
	}
}

func TestJolietIdentifier(t *testing.T) {
	got, err := jolietIdentifier("meta-data")
	if err != nil || !bytes.Equal(got, []byte("\x00m\x00e\x00t\x00a\x00-\x00d\x00a\x00t\x00a")) {
		t.Errorf("jolietIdentifier(meta-data) = % x, %v", got, err)
	}
	for _, bad := range []string{"", "a;1", "a/b", "a*", "a\x01", "😀", strings.Repeat("a", 65)} {
		if got, err := jolietIdentifier(bad); err == nil {
			t.Errorf("jolietIdentifier(%q) = % x, want an error", bad, got)
		}
	}
}

func TestBuildISOLayout(t *testing.T) {
	sized := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i*7 + n)
		}
		return b
	}
	var many []isoFile
	for i := range 40 {
		// Long names make long Rock Ridge records: 40 of them need three directory sectors.
		many = append(many, isoFile{name: fmt.Sprintf("f%02d-with-a-rather-long-name-for-rock-ridge", 39-i), data: sized(i * 100)})
	}
	tests := []struct {
		name      string
		files     []isoFile
		dirSector int // sectors of the primary root directory
	}{
		{"no files", nil, 1},
		{"empty file", []isoFile{{"empty", nil}}, 1},
		{"sector boundaries", []isoFile{{"a", sized(1)}, {"b", sized(2047)}, {"c", sized(2048)}, {"d", sized(2049)}, {"e", sized(32 << 10)}}, 1},
		{"multi-sector directory, unsorted input", many, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			img, err := buildISO("cidata", tt.files)
			if err != nil {
				t.Fatal(err)
			}
			p, err := readISO(img)
			if err != nil {
				t.Fatal(err)
			}
			if len(p.rockRidge.files) != len(tt.files) || len(p.joliet.files) != len(tt.files) || len(p.primary.files) != len(tt.files) {
				t.Fatalf("read %d/%d/%d files, wrote %d", len(p.primary.files), len(p.rockRidge.files), len(p.joliet.files), len(tt.files))
			}
			for _, f := range tt.files {
				if !bytes.Equal(p.rockRidge.files[f.name], f.data) || !bytes.Equal(p.joliet.files[f.name], f.data) {
					t.Errorf("%s: contents differ", f.name)
				}
			}
			// Directory sectors: the Joliet root follows the primary one directly.
			dirs := len(packDirectory(primaryRecords(nil, 0, 0, 0)))
			if tt.files != nil {
				placed := make([]placedFile, len(tt.files))
				for i, f := range tt.files {
					pid, _ := primaryIdentifier(f.name)
					placed[i] = placedFile{isoFile: f, primaryID: pid}
				}
				dirs = len(packDirectory(primaryRecords(placed, 0, 0, 0)))
			}
			if dirs != tt.dirSector {
				t.Errorf("primary root directory takes %d sectors, want %d", dirs, tt.dirSector)
			}
		})
	}
}

func TestBuildISORefuses(t *testing.T) {
	tests := []struct {
		name   string
		volume string
		files  []isoFile
		want   string
	}{
		{"same primary name", "cidata", []isoFile{{"meta-data", nil}, {"meta-database", nil}},
			`iso9660: "meta-data" and "meta-database" have the same ISO9660 name META_DAT.;1`},
		{"names that map alike", "cidata", []isoFile{{"a.b.c", nil}, {"a_b.c", nil}},
			`iso9660: "a.b.c" and "a_b.c" have the same ISO9660 name A_B.C;1`},
		{"bad Joliet name", "cidata", []isoFile{{"a:b", nil}}, `iso9660: file name "a:b" is not a valid Joliet name`},
		{"empty volume id", "", nil, `iso9660: volume identifier "" must be 1 to 16 characters without surrounding spaces`},
		{"long volume id", strings.Repeat("v", 17), nil, `iso9660: volume identifier "vvvvvvvvvvvvvvvvv" must be 1 to 16 characters without surrounding spaces`},
		{"non-ASCII volume id", "cïdata", nil, `iso9660: volume identifier "cïdata" must be printable ASCII`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := buildISO(tt.volume, tt.files)
			if err == nil || err.Error() != tt.want {
				t.Fatalf("error %v, want %s", err, tt.want)
			}
		})
	}
}

// TestBuildISOOrderIndependent: the caller's file order must not leak into the image.
func TestBuildISOOrderIndependent(t *testing.T) {
	a := []isoFile{{"meta-data", []byte("m")}, {"user-data", []byte("u")}, {"vendor-data", []byte("v")}}
	b := []isoFile{a[2], a[0], a[1]}
	ia, err := buildISO("cidata", a)
	if err != nil {
		t.Fatal(err)
	}
	ib, err := buildISO("cidata", b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ia, ib) {
		t.Fatal("the same files in another order gave another image")
	}
}
