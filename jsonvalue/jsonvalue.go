// Package jsonvalue decodes a JSON document into the Go values encoding/json decodes into an
// any with UseNumber (map[string]any, []any, string, json.Number, bool and nil), and appends
// strings and times as encoding/json encodes them. It does so in one pass and without
// reflection, where encoding/json scans a document once to validate it and again to decode
// it, and scans again what a type's MarshalJSON returned. GraphQL requests arrive as such
// documents, one per request, and gqlgen takes their variables in exactly these types; every
// instance written is encoded.
package jsonvalue

import (
	"encoding/json"
	"fmt"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxDepth is how deeply arrays and objects may nest. No GraphQL input is nested nearly this
// deep, and each level of a hostile document costs a level of the decoder's recursion.
const MaxDepth = 512

// ErrTooDeep is returned for a document nested deeper than MaxDepth.
var ErrTooDeep = fmt.Errorf("jsonvalue: nested deeper than %d", MaxDepth)

// SyntaxError is a document that is not JSON, at byte Offset.
type SyntaxError struct {
	Offset int
	msg    string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("jsonvalue: %s at offset %d", e.msg, e.Offset)
}

// Parse decodes data, one JSON value with optional whitespace around it, as encoding/json
// decodes into an any with UseNumber: the same values, and an error for every document
// json.Valid refuses. Invalid UTF-8 in a string becomes U+FFFD, as there; of keys repeated in
// an object, the last wins.
func Parse(data []byte) (any, error) {
	d := decoder{data: data}
	d.skipSpace()
	v, err := d.value(0)
	if err != nil {
		return nil, err
	}
	d.skipSpace()
	if d.pos < len(d.data) {
		return nil, d.fail("data after the value")
	}
	return v, nil
}

type decoder struct {
	data []byte
	pos  int
}

func (d *decoder) fail(msg string) error { return &SyntaxError{Offset: d.pos, msg: msg} }

func (d *decoder) skipSpace() {
	for d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

// value decodes the value at d.pos, which is not whitespace, nested depth levels deep.
func (d *decoder) value(depth int) (any, error) {
	if d.pos >= len(d.data) {
		return nil, d.fail("unexpected end")
	}
	switch c := d.data[d.pos]; {
	case c == '{':
		return d.object(depth + 1)
	case c == '[':
		return d.array(depth + 1)
	case c == '"':
		return d.str()
	case c == '-' || c >= '0' && c <= '9':
		return d.number()
	case c == 't':
		return true, d.literal("true")
	case c == 'f':
		return false, d.literal("false")
	case c == 'n':
		return nil, d.literal("null")
	default:
		return nil, d.fail("unexpected character")
	}
}

func (d *decoder) literal(word string) error {
	if len(d.data)-d.pos < len(word) || string(d.data[d.pos:d.pos+len(word)]) != word {
		return d.fail("invalid literal")
	}
	d.pos += len(word)
	return nil
}

func (d *decoder) object(depth int) (any, error) {
	m := map[string]any{}
	if empty, err := d.open(depth, '}'); empty || err != nil {
		return m, err
	}
	for more := true; more; {
		if d.pos >= len(d.data) || d.data[d.pos] != '"' {
			return nil, d.fail("expected a key")
		}
		key, err := d.str()
		if err != nil {
			return nil, err
		}
		d.skipSpace()
		if d.pos >= len(d.data) || d.data[d.pos] != ':' {
			return nil, d.fail("expected ':'")
		}
		d.pos++
		d.skipSpace()
		v, err := d.value(depth)
		if err != nil {
			return nil, err
		}
		m[key] = v
		if more, err = d.afterMember('}'); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (d *decoder) array(depth int) (any, error) {
	a := []any{}
	if empty, err := d.open(depth, ']'); empty || err != nil {
		return a, err
	}
	for more := true; more; {
		v, err := d.value(depth)
		if err != nil {
			return nil, err
		}
		a = append(a, v)
		if more, err = d.afterMember(']'); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// open enters the array or object at d.pos, depth levels deep, and reports whether it is
// empty: then its closing bracket is read too.
func (d *decoder) open(depth int, closing byte) (empty bool, err error) {
	if depth > MaxDepth {
		return false, ErrTooDeep
	}
	d.pos++
	d.skipSpace()
	if d.pos < len(d.data) && d.data[d.pos] == closing {
		d.pos++
		return true, nil
	}
	return false, nil
}

// afterMember reads what follows a member of an array or object: a comma, when more follow,
// or its closing bracket.
func (d *decoder) afterMember(closing byte) (more bool, err error) {
	d.skipSpace()
	if d.pos >= len(d.data) {
		return false, d.fail("unexpected end")
	}
	switch d.data[d.pos] {
	case ',':
		d.pos++
		d.skipSpace()
		return true, nil
	case closing:
		d.pos++
		return false, nil
	}
	return false, d.fail("expected ',' or '" + string(closing) + "'")
}

// str decodes the string at d.pos (its opening quote). A string without escapes or bytes
// outside ASCII, nearly every one, is one copy of its bytes.
func (d *decoder) str() (string, error) {
	d.pos++ // "
	start := d.pos
	for d.pos < len(d.data) {
		c := d.data[d.pos]
		switch {
		case c == '"':
			s := string(d.data[start:d.pos])
			d.pos++
			return s, nil
		case c == '\\' || c >= utf8.RuneSelf:
			return d.slowStr(start)
		case c < ' ':
			return "", d.fail("control character in a string")
		}
		d.pos++
	}
	return "", d.fail("unterminated string")
}

// slowStr decodes the rest of a string from d.pos, after the plain bytes from start.
func (d *decoder) slowStr(start int) (string, error) {
	buf := make([]byte, 0, d.pos-start+16)
	buf = append(buf, d.data[start:d.pos]...)
	for d.pos < len(d.data) {
		c := d.data[d.pos]
		switch {
		case c == '"':
			d.pos++
			return string(buf), nil
		case c < ' ':
			return "", d.fail("control character in a string")
		case c == '\\':
			var err error
			if buf, err = d.escape(buf); err != nil {
				return "", err
			}
		case c < utf8.RuneSelf:
			buf = append(buf, c)
			d.pos++
		default:
			r, size := utf8.DecodeRune(d.data[d.pos:])
			// One U+FFFD for each byte that is not UTF-8, as encoding/json writes.
			buf = utf8.AppendRune(buf, r)
			d.pos += size
		}
	}
	return "", d.fail("unterminated string")
}

// escape appends the character of the escape at d.pos (its backslash) to buf.
func (d *decoder) escape(buf []byte) ([]byte, error) {
	if d.pos+1 >= len(d.data) {
		return nil, d.fail("unterminated string")
	}
	c := d.data[d.pos+1]
	d.pos += 2
	switch c {
	case '"', '\\', '/':
		return append(buf, c), nil
	case 'b':
		return append(buf, '\b'), nil
	case 'f':
		return append(buf, '\f'), nil
	case 'n':
		return append(buf, '\n'), nil
	case 'r':
		return append(buf, '\r'), nil
	case 't':
		return append(buf, '\t'), nil
	case 'u':
		r, ok := d.hex4()
		if !ok {
			return nil, d.fail("invalid \\u escape")
		}
		if utf16.IsSurrogate(r) {
			// A pair is one character; a lone half is U+FFFD, and what follows it stands.
			if d.pos+1 < len(d.data) && d.data[d.pos] == '\\' && d.data[d.pos+1] == 'u' {
				save := d.pos
				d.pos += 2
				r2, ok := d.hex4()
				if !ok {
					return nil, d.fail("invalid \\u escape")
				}
				if pair := utf16.DecodeRune(r, r2); pair != utf8.RuneError {
					return utf8.AppendRune(buf, pair), nil
				}
				d.pos = save
			}
			r = utf8.RuneError
		}
		return utf8.AppendRune(buf, r), nil
	default:
		d.pos -= 2
		return nil, d.fail("invalid escape")
	}
}

// hex4 reads the four hexadecimal digits of a \u escape at d.pos.
func (d *decoder) hex4() (rune, bool) {
	if len(d.data)-d.pos < 4 {
		return 0, false
	}
	var r rune
	for _, c := range d.data[d.pos : d.pos+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	d.pos += 4
	return r, true
}

// number decodes the number at d.pos as JSON's grammar has it: -?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?
func (d *decoder) number() (any, error) {
	start := d.pos
	if d.data[d.pos] == '-' {
		d.pos++
	}
	switch {
	case d.pos < len(d.data) && d.data[d.pos] == '0':
		d.pos++
	case d.digits() == 0:
		return nil, d.fail("invalid number")
	}
	if d.pos < len(d.data) && d.data[d.pos] == '.' {
		d.pos++
		if d.digits() == 0 {
			return nil, d.fail("invalid number")
		}
	}
	if d.pos < len(d.data) && (d.data[d.pos] == 'e' || d.data[d.pos] == 'E') {
		d.pos++
		if d.pos < len(d.data) && (d.data[d.pos] == '+' || d.data[d.pos] == '-') {
			d.pos++
		}
		if d.digits() == 0 {
			return nil, d.fail("invalid number")
		}
	}
	return json.Number(d.data[start:d.pos]), nil
}

func (d *decoder) digits() int {
	n := 0
	for d.pos < len(d.data) && d.data[d.pos] >= '0' && d.data[d.pos] <= '9' {
		d.pos++
		n++
	}
	return n
}
