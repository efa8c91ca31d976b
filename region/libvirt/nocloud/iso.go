package nocloud

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf16"
)

// This file is a minimal ISO9660 (ECMA-119) writer for one flat root directory of a few small
// files, with Joliet and Rock Ridge so that every reader sees the files' real, lower-case,
// hyphenated names. Image layout, in 2048-byte sectors:
//
//	0-15   system area (zeros)
//	16     primary volume descriptor
//	17     Joliet supplementary volume descriptor
//	18     volume descriptor set terminator
//	19-20  primary path tables, L (little-endian) then M (big-endian)
//	21-22  Joliet path tables, L then M
//	23     SUSP continuation area holding the Rock Ridge ER entry
//	24...  primary root directory, then the Joliet root directory, then file data
//
// Both directory trees point at the same file extents.

const (
	sectorSize = 2048

	sectorPVD        = 16
	sectorSVD        = 17
	sectorTerminator = 18
	sectorPathL      = 19
	sectorPathM      = 20
	sectorJolietL    = 21
	sectorJolietM    = 22
	sectorContinue   = 23
	sectorFirstDir   = 24

	// A directory record's length is one byte, and a record may not cross a sector.
	maxRecordLen = 255
	// ECMA-119 9.1: the fixed part of a directory record, before the file identifier.
	recordFixedLen = 33

	flagDirectory = 0x02

	// POSIX modes for Rock Ridge PX: the medium is read-only, so nothing is writable.
	modeFile = 0o100444
	modeDir  = 0o040555
)

// isoDate is the one timestamp the image carries. A fixed date keeps the output a pure function
// of the input, so tests can compare images and a host can cache them.
var isoDate = struct{ year, month, day int }{2000, 1, 1}

// rrip* is the Rock Ridge ER entry's text, as the RRIP 1.10 specification (and Linux, which
// only prefers Rock Ridge over Joliet once it has seen an ER entry) expects it.
const (
	rripID         = "RRIP_1991A"
	rripDescriptor = "THE ROCK RIDGE INTERCHANGE PROTOCOL PROVIDES SUPPORT FOR POSIX FILE SYSTEM SEMANTICS"
	rripSource     = "PLEASE CONTACT DISC PUBLISHER FOR SPECIFICATION SOURCE.  SEE PUBLISHER IDENTIFIER IN PRIMARY VOLUME DESCRIPTOR FOR CONTACT INFORMATION."
)

// isoFile is one regular file of the image's root directory.
type isoFile struct {
	name string // the real name, as Rock Ridge and Joliet carry it
	data []byte
}

// placedFile is an isoFile with its names for each directory tree and its extent.
type placedFile struct {
	isoFile
	primaryID []byte // "META_DAT.;1"
	jolietID  []byte // UCS-2 big-endian "meta-data"
	extent    uint32
}

// buildISO returns an image whose volume identifier is volumeID, holding files in its root
// directory, in any order.
func buildISO(volumeID string, files []isoFile) ([]byte, error) {
	if err := checkVolumeID(volumeID); err != nil {
		return nil, err
	}
	// Data is laid out in name order, so that the caller's order does not change the image.
	files = slices.SortedFunc(slices.Values(files), func(a, b isoFile) int { return strings.Compare(a.name, b.name) })
	placed := make([]placedFile, len(files))
	seenPrimary := map[string]string{}
	seenJoliet := map[string]bool{}
	for i, f := range files {
		pid, err := primaryIdentifier(f.name)
		if err != nil {
			return nil, err
		}
		if other, dup := seenPrimary[string(pid)]; dup {
			return nil, fmt.Errorf("iso9660: %q and %q have the same ISO9660 name %s", other, f.name, pid)
		}
		seenPrimary[string(pid)] = f.name
		jid, err := jolietIdentifier(f.name)
		if err != nil {
			return nil, err
		}
		if seenJoliet[string(jid)] {
			return nil, fmt.Errorf("iso9660: file %q appears twice", f.name)
		}
		seenJoliet[string(jid)] = true
		if uint64(len(f.data)) > 1<<32-1 {
			return nil, fmt.Errorf("iso9660: file %q is too large", f.name)
		}
		placed[i] = placedFile{isoFile: f, primaryID: pid, jolietID: jid}
	}

	// Record lengths do not depend on extents, so a first layout with zero extents tells how
	// many sectors each directory takes; the second, with the real extents, is the one written.
	primarySectors := len(packDirectory(primaryRecords(placed, 0, 0, 0)))
	jolietSectors := len(packDirectory(jolietRecords(placed, 0, 0)))
	primaryRoot := uint32(sectorFirstDir)
	jolietRoot := primaryRoot + uint32(primarySectors)
	next := jolietRoot + uint32(jolietSectors)
	for i := range placed {
		placed[i].extent = next
		// An empty file gets a sector of zeros too, as xorriso does, so that every extent in
		// the image points into it.
		next += max(sectorsFor(len(placed[i].data)), 1)
	}
	total := next

	erEntry := suspER()
	primaryDir := packDirectory(primaryRecords(placed, primaryRoot, uint32(primarySectors), uint32(len(erEntry))))
	jolietDir := packDirectory(jolietRecords(placed, jolietRoot, uint32(jolietSectors)))

	img := make([]byte, int(total)*sectorSize)
	sector := func(n uint32) []byte { return img[int(n)*sectorSize : int(n+1)*sectorSize] }

	writeVolumeDescriptor(sector(sectorPVD), false, volumeID, total,
		rootRecord(primaryRoot, uint32(primarySectors)), sectorPathL, sectorPathM)
	writeVolumeDescriptor(sector(sectorSVD), true, volumeID, total,
		rootRecord(jolietRoot, uint32(jolietSectors)), sectorJolietL, sectorJolietM)
	terminator := sector(sectorTerminator)
	terminator[0] = 255
	copy(terminator[1:6], "CD001")
	terminator[6] = 1

	writePathTable(sector(sectorPathL), binary.LittleEndian, primaryRoot)
	writePathTable(sector(sectorPathM), binary.BigEndian, primaryRoot)
	writePathTable(sector(sectorJolietL), binary.LittleEndian, jolietRoot)
	writePathTable(sector(sectorJolietM), binary.BigEndian, jolietRoot)

	copy(sector(sectorContinue), erEntry)

	for i, s := range primaryDir {
		copy(sector(primaryRoot+uint32(i)), s)
	}
	for i, s := range jolietDir {
		copy(sector(jolietRoot+uint32(i)), s)
	}
	for _, f := range placed {
		if len(f.data) > 0 {
			copy(img[int(f.extent)*sectorSize:], f.data)
		}
	}
	return img, nil
}

func sectorsFor(n int) uint32 { return uint32((n + sectorSize - 1) / sectorSize) }

// checkVolumeID accepts what fits the 32-byte primary field and the 16-character Joliet field
// and reads back unchanged from both: printable ASCII without spaces at the ends.
func checkVolumeID(id string) error {
	if id == "" || len(id) > 16 || strings.TrimSpace(id) != id {
		return fmt.Errorf("iso9660: volume identifier %q must be 1 to 16 characters without surrounding spaces", id)
	}
	for _, r := range id {
		if r < 0x20 || r > 0x7e {
			return fmt.Errorf("iso9660: volume identifier %q must be printable ASCII", id)
		}
	}
	return nil
}

// primaryIdentifier maps a name to an ISO9660 level 1 file identifier: at most eight
// d-characters, a dot, at most three, and version 1. Readers without Rock Ridge or Joliet
// see this name, so it only needs to be valid and unique, not pretty.
func primaryIdentifier(name string) ([]byte, error) {
	if name == "" {
		return nil, errors.New("iso9660: empty file name")
	}
	base, ext := name, ""
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		base, ext = name[:i], name[i+1:]
	}
	dchars := func(s string, max int) string {
		var b strings.Builder
		for _, r := range strings.ToUpper(s) {
			if b.Len() == max {
				break
			}
			if (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') || r == '_' {
				b.WriteRune(r)
			} else {
				b.WriteByte('_')
			}
		}
		return b.String()
	}
	base, ext = dchars(base, 8), dchars(ext, 3)
	if base == "" && ext == "" {
		return nil, fmt.Errorf("iso9660: file name %q has no usable characters", name)
	}
	return []byte(base + "." + ext + ";1"), nil
}

// jolietIdentifier is name in UCS-2 big-endian. It has no version suffix: genisoimage writes
// none either, and tools that look a Joliet name up (isoinfo -J -x) match it exactly.
func jolietIdentifier(name string) ([]byte, error) {
	if name == "" {
		return nil, errors.New("iso9660: empty file name")
	}
	var units []uint16
	for _, r := range name {
		// Joliet forbids these, and names outside the Basic Multilingual Plane do not fit UCS-2.
		if r < 0x20 || strings.ContainsRune(`*/:;?\`, r) || r > 0xffff || utf16.IsSurrogate(r) {
			return nil, fmt.Errorf("iso9660: file name %q is not a valid Joliet name", name)
		}
		units = append(units, uint16(r))
	}
	if len(units) > 64 {
		return nil, fmt.Errorf("iso9660: file name %q is longer than Joliet's 64 characters", name)
	}
	return ucs2(units), nil
}

func ucs2(units []uint16) []byte {
	b := make([]byte, 2*len(units))
	for i, u := range units {
		binary.BigEndian.PutUint16(b[2*i:], u)
	}
	return b
}

// record is one directory record with the key ECMA-119 9.3 sorts it by.
type record struct {
	sortKey []byte
	bytes   []byte
}

// primaryRecords are the primary root directory's records, Rock Ridge included. ceLen is the
// length of the ER entry in the continuation area the root's "." record points to.
func primaryRecords(files []placedFile, root, rootSectors, ceLen uint32) []record {
	rootSize := rootSectors * sectorSize
	dot := slices.Concat(suspSP(), rripRR(rrPX), rripPX(modeDir, 2), suspCE(sectorContinue, 0, ceLen))
	dotdot := slices.Concat(rripRR(rrPX), rripPX(modeDir, 2))
	recs := []record{
		{nil, directoryRecord(root, rootSize, flagDirectory, []byte{0}, dot)},
		{nil, directoryRecord(root, rootSize, flagDirectory, []byte{1}, dotdot)},
	}
	var sorted []record
	for _, f := range files {
		su := slices.Concat(rripRR(rrPX|rrNM), rripNM(f.name), rripPX(modeFile, 1))
		sorted = append(sorted, record{f.primaryID, directoryRecord(f.extent, uint32(len(f.data)), 0, f.primaryID, su)})
	}
	return append(recs, sortRecords(sorted)...)
}

// jolietRecords are the Joliet root directory's records; Joliet trees carry no Rock Ridge.
func jolietRecords(files []placedFile, root, rootSectors uint32) []record {
	rootSize := rootSectors * sectorSize
	recs := []record{
		{nil, directoryRecord(root, rootSize, flagDirectory, []byte{0}, nil)},
		{nil, directoryRecord(root, rootSize, flagDirectory, []byte{1}, nil)},
	}
	var sorted []record
	for _, f := range files {
		sorted = append(sorted, record{f.jolietID, directoryRecord(f.extent, uint32(len(f.data)), 0, f.jolietID, nil)})
	}
	return append(recs, sortRecords(sorted)...)
}

// sortRecords orders records by identifier. Comparing bytes is ECMA-119's order for our
// identifiers: they are unique, so the padding rules for unequal lengths only matter for
// prefixes, where the shorter one sorts first either way.
func sortRecords(recs []record) []record {
	slices.SortFunc(recs, func(a, b record) int { return strings.Compare(string(a.sortKey), string(b.sortKey)) })
	return recs
}

// packDirectory lays records into sectors; a record that does not fit in what is left of a
// sector starts the next one, as ECMA-119 6.8.1.1 requires.
func packDirectory(recs []record) [][]byte {
	sectors := [][]byte{make([]byte, 0, sectorSize)}
	for _, r := range recs {
		cur := sectors[len(sectors)-1]
		if len(cur)+len(r.bytes) > sectorSize {
			sectors = append(sectors, make([]byte, 0, sectorSize))
			cur = sectors[len(sectors)-1]
		}
		sectors[len(sectors)-1] = append(cur, r.bytes...)
	}
	return sectors
}

// directoryRecord is an ECMA-119 9.1 directory record with system use area su.
func directoryRecord(extent, size uint32, flags byte, ident, su []byte) []byte {
	suOff := recordFixedLen + len(ident)
	if suOff%2 == 1 {
		suOff++ // padding field: the system use area starts at an even offset
	}
	n := suOff + len(su)
	if n%2 == 1 {
		n++ // a record's length is even
	}
	if n > maxRecordLen {
		// Callers build records from bounded names; a longer one is a bug here, not bad input.
		panic(fmt.Sprintf("iso9660: directory record of %d bytes", n))
	}
	r := make([]byte, n)
	r[0] = byte(n)
	both32(r[2:], extent)
	both32(r[10:], size)
	recordDate(r[18:25])
	r[25] = flags
	both16(r[28:], 1) // volume sequence number
	r[32] = byte(len(ident))
	copy(r[33:], ident)
	copy(r[suOff:], su)
	return r
}

// rootRecord is the 34-byte root directory record a volume descriptor embeds.
func rootRecord(extent, sectors uint32) []byte {
	return directoryRecord(extent, sectors*sectorSize, flagDirectory, []byte{0}, nil)
}

func recordDate(b []byte) {
	b[0] = byte(isoDate.year - 1900)
	b[1] = byte(isoDate.month)
	b[2] = byte(isoDate.day)
	// hour, minute, second and offset from GMT stay 0
}

// volumeDate is the 17-byte ECMA-119 8.4.26.1 form of isoDate, in UTC.
func volumeDate() []byte {
	return append([]byte(fmt.Sprintf("%04d%02d%02d00000000", isoDate.year, isoDate.month, isoDate.day)), 0)
}

// unsetVolumeDate is how ECMA-119 says "not specified".
func unsetVolumeDate() []byte { return append([]byte("0000000000000000"), 0) }

// writeVolumeDescriptor fills a primary (ECMA-119 8.4) or Joliet supplementary (8.5) volume
// descriptor; they share a layout, and Joliet's text fields are UCS-2 big-endian.
func writeVolumeDescriptor(d []byte, joliet bool, volumeID string, totalSectors uint32, root []byte, pathL, pathM uint32) {
	text := func(field []byte, s string) {
		if !joliet {
			for i := range field {
				field[i] = ' '
			}
			copy(field, s)
			return
		}
		// Space-padded UCS-2; a field of odd length ends with one zero byte.
		for i := 0; i+1 < len(field); i += 2 {
			field[i], field[i+1] = 0, ' '
		}
		if len(field)%2 == 1 {
			field[len(field)-1] = 0
		}
		for i, r := range s {
			if 2*i+1 >= len(field) {
				break
			}
			binary.BigEndian.PutUint16(field[2*i:], uint16(r))
		}
	}
	if joliet {
		d[0] = 2
	} else {
		d[0] = 1
	}
	copy(d[1:6], "CD001")
	d[6] = 1
	text(d[8:40], "")        // system identifier
	text(d[40:72], volumeID) // volume identifier
	both32(d[80:], totalSectors)
	if joliet {
		copy(d[88:], "%/E") // escape sequence: UCS-2 level 3
	}
	both16(d[120:], 1)          // volume set size
	both16(d[124:], 1)          // volume sequence number
	both16(d[128:], sectorSize) // logical block size
	both32(d[132:], pathTableLen)
	binary.LittleEndian.PutUint32(d[140:], pathL)
	binary.BigEndian.PutUint32(d[148:], pathM)
	copy(d[156:190], root)
	text(d[190:318], "")                  // volume set identifier
	text(d[318:446], "")                  // publisher identifier
	text(d[446:574], "")                  // data preparer identifier
	text(d[574:702], "COMPUTEQL NOCLOUD") // application identifier
	text(d[702:739], "")                  // copyright file identifier
	text(d[739:776], "")                  // abstract file identifier
	text(d[776:813], "")                  // bibliographic file identifier
	copy(d[813:830], volumeDate())        // creation
	copy(d[830:847], volumeDate())        // modification
	copy(d[847:864], unsetVolumeDate())   // expiration
	copy(d[864:881], unsetVolumeDate())   // effective
	d[881] = 1                            // file structure version
}

// pathTableLen is the size of a path table holding only the root: an 8-byte header, the
// one-byte identifier and a padding byte.
const pathTableLen = 10

// writePathTable writes an ECMA-119 9.4 path table whose only directory is the root.
func writePathTable(s []byte, order binary.ByteOrder, root uint32) {
	s[0] = 1 // identifier length
	order.PutUint32(s[2:], root)
	order.PutUint16(s[6:], 1) // parent directory number: the root is its own parent
	s[8] = 0                  // identifier of the root
}

// both16 and both32 write ECMA-119's both-byte-order numbers (7.2.3, 7.3.3).
func both16(b []byte, v uint16) {
	binary.LittleEndian.PutUint16(b, v)
	binary.BigEndian.PutUint16(b[2:], v)
}

func both32(b []byte, v uint32) {
	binary.LittleEndian.PutUint32(b, v)
	binary.BigEndian.PutUint32(b[4:], v)
}

// SUSP (IEEE P1281) and RRIP (IEEE P1282) entries: a two-letter signature, a length, a
// version, then the entry's data.

func suspEntry(sig string, data ...[]byte) []byte {
	body := slices.Concat(data...)
	e := make([]byte, 4, 4+len(body))
	copy(e, sig)
	e[2] = byte(4 + len(body))
	e[3] = 1
	return append(e, body...)
}

// suspSP marks the use of SUSP; it must open the system use area of the root's "." record.
func suspSP() []byte { return suspEntry("SP", []byte{0xbe, 0xef, 0}) }

// suspCE points at a continuation area, where entries that do not fit a record go.
func suspCE(extent, offset, length uint32) []byte {
	b := make([]byte, 24)
	both32(b[0:], extent)
	both32(b[8:], offset)
	both32(b[16:], length)
	return suspEntry("CE", b)
}

// suspER announces Rock Ridge. At 237 bytes it does not fit the root's "." record, hence the
// continuation area.
func suspER() []byte {
	return suspEntry("ER",
		[]byte{byte(len(rripID)), byte(len(rripDescriptor)), byte(len(rripSource)), 1},
		[]byte(rripID), []byte(rripDescriptor), []byte(rripSource))
}

// RRIP 1.10 RR flags: which Rock Ridge entries a record carries. Linux stops reading a
// record's name unless NM is flagged.
const (
	rrPX = 0x01
	rrNM = 0x08
)

func rripRR(flags byte) []byte { return suspEntry("RR", []byte{flags}) }

func rripNM(name string) []byte { return suspEntry("NM", []byte{0}, []byte(name)) }

// rripPX gives POSIX mode and link count, owned by root. This is the RRIP 1.10 form,
// without the file serial number that 1.12 added, to match the RRIP_1991A identifier.
func rripPX(mode, links uint32) []byte {
	b := make([]byte, 32)
	both32(b[0:], mode)
	both32(b[8:], links)
	return suspEntry("PX", b)
}
