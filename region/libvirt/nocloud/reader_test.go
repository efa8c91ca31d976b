package nocloud

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"unicode/utf16"
)

// This file is a strict reader of the images buildISO writes, for tests that must run where
// no ISO tool is installed (and for the fuzz target). It checks what the external tools are
// lenient about: both halves of every both-endian number, path tables, record placement and
// order, and the SUSP entries Linux relies on to prefer Rock Ridge.

// isoView is the root directory as one reader sees it: file name to contents, in
// directory order.
type isoView struct {
	names []string
	files map[string][]byte
}

type parsedISO struct {
	volumeID       string
	jolietVolumeID string
	primary        isoView // plain ISO9660 names
	rockRidge      isoView // Rock Ridge NM names from the primary tree
	joliet         isoView
	hasER          bool
}

func readISO(img []byte) (*parsedISO, error) {
	if len(img)%sectorSize != 0 || len(img) < (sectorFirstDir+1)*sectorSize {
		return nil, fmt.Errorf("image is %d bytes, not a whole number of sectors past the descriptors", len(img))
	}
	sector := func(n uint32) ([]byte, error) {
		if int64(n+1)*sectorSize > int64(len(img)) {
			return nil, fmt.Errorf("sector %d is past the end", n)
		}
		return img[int(n)*sectorSize : int(n+1)*sectorSize], nil
	}
	p := &parsedISO{}
	pvd, _ := sector(16)
	svd, _ := sector(17)
	term, _ := sector(18)
	for i, d := range [][]byte{pvd, svd, term} {
		if want := []byte{1, 2, 255}[i]; d[0] != want || string(d[1:6]) != "CD001" || d[6] != 1 {
			return nil, fmt.Errorf("volume descriptor %d: type %d id %q version %d", 16+i, d[0], d[1:6], d[6])
		}
	}
	if string(svd[88:91]) != "%/E" {
		return nil, fmt.Errorf("supplementary descriptor escape %q, want %%/E", svd[88:91])
	}
	p.volumeID = string(bytes.TrimRight(pvd[40:72], " "))
	p.jolietVolumeID = decodeUCS2(svd[40:72])
	for _, d := range [][]byte{pvd, svd} {
		size, err := readBoth32(d[80:])
		if err != nil {
			return nil, fmt.Errorf("volume space size: %w", err)
		}
		if int(size)*sectorSize != len(img) {
			return nil, fmt.Errorf("volume space size %d sectors, image has %d", size, len(img)/sectorSize)
		}
		if bs, err := readBoth16(d[128:]); err != nil || bs != sectorSize {
			return nil, fmt.Errorf("logical block size %d, %v", bs, err)
		}
		for _, off := range []int{120, 124} {
			if v, err := readBoth16(d[off:]); err != nil || v != 1 {
				return nil, fmt.Errorf("volume set field at %d: %d, %v", off, v, err)
			}
		}
	}

	var err error
	if p.primary, p.rockRidge, err = readTree(img, pvd, sector, p); err != nil {
		return nil, fmt.Errorf("primary tree: %w", err)
	}
	if p.joliet, _, err = readTree(img, svd, sector, nil); err != nil {
		return nil, fmt.Errorf("joliet tree: %w", err)
	}
	return p, nil
}

// readTree reads the root directory a volume descriptor points to. rr is nil for the Joliet
// tree, whose names are UCS-2 and which has no Rock Ridge.
func readTree(img, vd []byte, sector func(uint32) ([]byte, error), rr *parsedISO) (plain, rock isoView, err error) {
	rootRec := vd[156:190]
	if rootRec[0] != 34 || rootRec[32] != 1 || rootRec[33] != 0 {
		return plain, rock, fmt.Errorf("root record in descriptor malformed: % x", rootRec)
	}
	rootExtent, err := readBoth32(rootRec[2:])
	if err != nil {
		return plain, rock, err
	}
	rootSize, err := readBoth32(rootRec[10:])
	if err != nil {
		return plain, rock, err
	}

	// Path tables: one root entry, mirrored between L and M, pointing at the root.
	ptSize, err := readBoth32(vd[132:])
	if err != nil || ptSize != pathTableLen {
		return plain, rock, fmt.Errorf("path table size %d, %v", ptSize, err)
	}
	lt, err := sector(binary.LittleEndian.Uint32(vd[140:]))
	if err != nil {
		return plain, rock, err
	}
	mt, err := sector(binary.BigEndian.Uint32(vd[148:]))
	if err != nil {
		return plain, rock, err
	}
	if lt[0] != 1 || lt[8] != 0 || binary.LittleEndian.Uint32(lt[2:]) != rootExtent || binary.LittleEndian.Uint16(lt[6:]) != 1 {
		return plain, rock, fmt.Errorf("L path table % x, root at %d", lt[:10], rootExtent)
	}
	if mt[0] != 1 || mt[8] != 0 || binary.BigEndian.Uint32(mt[2:]) != rootExtent || binary.BigEndian.Uint16(mt[6:]) != 1 {
		return plain, rock, fmt.Errorf("M path table % x, root at %d", mt[:10], rootExtent)
	}

	plain.files, rock.files = map[string][]byte{}, map[string][]byte{}
	if rootSize%sectorSize != 0 || rootSize == 0 {
		return plain, rock, fmt.Errorf("root directory size %d", rootSize)
	}
	var prevID []byte
	n := 0
	for s := uint32(0); s < rootSize/sectorSize; s++ {
		sec, err := sector(rootExtent + s)
		if err != nil {
			return plain, rock, err
		}
		for off := 0; off < sectorSize && sec[off] != 0; {
			l := int(sec[off])
			if l%2 != 0 || l < 34 || off+l > sectorSize {
				return plain, rock, fmt.Errorf("record at sector %d offset %d has length %d", rootExtent+s, off, l)
			}
			r := sec[off : off+l]
			off += l
			extent, err := readBoth32(r[2:])
			if err != nil {
				return plain, rock, err
			}
			size, err := readBoth32(r[10:])
			if err != nil {
				return plain, rock, err
			}
			if _, err := readBoth16(r[28:]); err != nil {
				return plain, rock, err
			}
			idLen := int(r[32])
			if 33+idLen > l {
				return plain, rock, fmt.Errorf("identifier overruns record")
			}
			id := r[33 : 33+idLen]
			suOff := 33 + idLen + (1-idLen%2)%2
			su := r[min(suOff, l):]
			isDir := r[25]&flagDirectory != 0
			switch n {
			case 0, 1:
				if idLen != 1 || id[0] != byte(n) || !isDir || extent != rootExtent || size != rootSize {
					return plain, rock, fmt.Errorf("record %d is not the root's . or ..", n)
				}
				if n == 0 && rr != nil {
					if err := checkRootSUSP(su, sector, rr); err != nil {
						return plain, rock, err
					}
				}
			default:
				if isDir {
					return plain, rock, fmt.Errorf("unexpected subdirectory")
				}
				if prevID != nil && bytes.Compare(prevID, id) >= 0 {
					return plain, rock, fmt.Errorf("records not sorted: % x then % x", prevID, id)
				}
				prevID = id
				end := int64(extent)*sectorSize + int64(size)
				if extent < sectorFirstDir || int64(extent) >= int64(len(img)/sectorSize) || end > int64(len(img)) {
					return plain, rock, fmt.Errorf("file extent %d size %d outside the image", extent, size)
				}
				data := img[int64(extent)*sectorSize : end]
				name := string(id)
				if rr == nil {
					name = decodeUCS2(id)
				}
				plain.names = append(plain.names, name)
				plain.files[name] = data
				if rr != nil {
					nm, err := rockName(su)
					if err != nil {
						return plain, rock, fmt.Errorf("%s: %w", name, err)
					}
					rock.names = append(rock.names, nm)
					rock.files[nm] = data
				}
			}
			n++
		}
	}
	return plain, rock, nil
}

// checkRootSUSP checks the root "." record's system use area: SP first, and a CE leading to
// an ER entry for RRIP.
func checkRootSUSP(su []byte, sector func(uint32) ([]byte, error), p *parsedISO) error {
	entries, err := suspEntries(su)
	if err != nil {
		return err
	}
	if len(entries) == 0 || string(entries[0][:2]) != "SP" || !bytes.Equal(entries[0][4:7], []byte{0xbe, 0xef, 0}) {
		return fmt.Errorf("root . record does not start with SP: % x", su)
	}
	for _, e := range entries {
		if string(e[:2]) != "CE" || len(e) != 28 {
			continue
		}
		ext, err1 := readBoth32(e[4:])
		off, err2 := readBoth32(e[12:])
		n, err3 := readBoth32(e[20:])
		if err1 != nil || err2 != nil || err3 != nil {
			return fmt.Errorf("CE: %v %v %v", err1, err2, err3)
		}
		sec, err := sector(ext)
		if err != nil || off+n > sectorSize {
			return fmt.Errorf("CE points outside: extent %d offset %d length %d", ext, off, n)
		}
		cont, err := suspEntries(sec[off : off+n])
		if err != nil {
			return err
		}
		for _, c := range cont {
			if string(c[:2]) == "ER" && len(c) >= 8 && int(8+c[4]) <= len(c) && string(c[8:8+c[4]]) == rripID {
				p.hasER = true
			}
		}
	}
	if !p.hasER {
		return fmt.Errorf("no ER entry for %s", rripID)
	}
	return nil
}

func suspEntries(su []byte) ([][]byte, error) {
	var out [][]byte
	for len(su) >= 4 {
		l := int(su[2])
		if l < 4 || l > len(su) || su[3] != 1 {
			return nil, fmt.Errorf("bad SUSP entry % x", su)
		}
		out = append(out, su[:l])
		su = su[l:]
	}
	if len(su) > 1 || (len(su) == 1 && su[0] != 0) {
		return nil, fmt.Errorf("trailing SUSP bytes % x", su)
	}
	return out, nil
}

// rockName is a file's Rock Ridge name; RR must announce NM, as Linux requires.
func rockName(su []byte) (string, error) {
	entries, err := suspEntries(su)
	if err != nil {
		return "", err
	}
	var name string
	var rrFlags byte
	var px bool
	for _, e := range entries {
		switch string(e[:2]) {
		case "RR":
			rrFlags = e[4]
		case "NM":
			name += string(e[5:])
		case "PX":
			mode, err := readBoth32(e[4:])
			if err != nil || mode != modeFile {
				return "", fmt.Errorf("PX mode %o, %v", mode, err)
			}
			px = true
		}
	}
	if name == "" || rrFlags&rrNM == 0 || !px {
		return "", fmt.Errorf("no Rock Ridge name (RR flags %#x, PX %v)", rrFlags, px)
	}
	return name, nil
}

func readBoth16(b []byte) (uint16, error) {
	le, be := binary.LittleEndian.Uint16(b), binary.BigEndian.Uint16(b[2:])
	if le != be {
		return 0, fmt.Errorf("both-endian 16-bit field: %d little, %d big", le, be)
	}
	return le, nil
}

func readBoth32(b []byte) (uint32, error) {
	le, be := binary.LittleEndian.Uint32(b), binary.BigEndian.Uint32(b[4:])
	if le != be {
		return 0, fmt.Errorf("both-endian 32-bit field: %d little, %d big", le, be)
	}
	return le, nil
}

func decodeUCS2(b []byte) string {
	u := make([]uint16, len(b)/2)
	for i := range u {
		u[i] = binary.BigEndian.Uint16(b[2*i:])
	}
	return string(bytes.TrimRight([]byte(string(utf16.Decode(u))), " "))
}
