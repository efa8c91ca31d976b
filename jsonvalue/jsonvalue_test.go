package jsonvalue

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

// reference decodes data as encoding/json does into an any with UseNumber, the decoding Parse
// stands in for; ok is false for a document it refuses.
func reference(data []byte) (v any, ok bool) {
	if !json.Valid(data) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	return v, true
}

// depth is how deeply data's arrays and objects nest, counting brackets outside strings.
func depth(data []byte) int {
	deepest, d, inString, escaped := 0, 0, false, false
	for _, c := range data {
		switch {
		case escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case c == '"':
			inString = !inString
		case inString:
		case c == '[' || c == '{':
			d++
			deepest = max(deepest, d)
		case c == ']' || c == '}':
			d--
		}
	}
	return deepest
}

// checkLikeEncodingJSON fails when Parse and encoding/json disagree on data: one refuses what
// the other accepts, or they decode different values. Only nesting past MaxDepth is refused
// by Parse alone.
func checkLikeEncodingJSON(t *testing.T, data []byte) {
	t.Helper()
	want, ok := reference(data)
	got, err := Parse(data)
	switch {
	case errors.Is(err, ErrTooDeep):
		if depth(data) <= MaxDepth {
			t.Fatalf("Parse(%q): %v at depth %d", data, err, depth(data))
		}
	case !ok && err == nil:
		t.Fatalf("Parse(%q) = %#v, want an error: encoding/json refuses it", data, got)
	case ok && err != nil:
		t.Fatalf("Parse(%q): %v; encoding/json decodes %#v", data, err, want)
	case ok && !reflect.DeepEqual(got, want):
		t.Fatalf("Parse(%q) = %#v, want %#v", data, got, want)
	}
}

var samples = []string{
	// What a create sends.
	`{"query":"mutation($input: CreateInstanceInput!) {\n  createInstance(input: $input) { instance { id } userErrors { field code message } }\n}","variables":{"input":{"organizationId":"bench","projectId":"load","networkId":"bench-net","name":"r1-c-17","flavorId":"bench-small","imageId":"bench-image"}}}`,
	`{}`, `[]`, ` { } `, `[ ]`, `{"a":{}}`, `[[],[[]]]`, `{"a":[1,{"b":null}]}`,
	`null`, `true`, `false`, `0`, `-0`, `1`, `-12`, `1.5`, `1e3`, `1E+3`, `1e-3`, `-0.0e0`, `123456789012345678901234567890`,
	`""`, `"plain"`, `"\"\\\/\b\f\n\r\t"`, `"\u00e9\u4e2d"`, `"\ud83d\ude00"`, `"\ud83d"`, `"\ude00x"`, `"\ud83dx"`, `"\ud83d\u0041"`,
	`"caf` + "\xc3\xa9" + `"`, "\"\xff\"", "\"a\xc3\"", "\"\xed\xa0\x80\"", "\"\xef\xbf\xbd\"",
	`{"a":1,"a":2}`, `{"a":1,"A":2}`, " \t\r\n[1 , 2]\n",
	// Refused.
	``, ` `, `{`, `}`, `[`, `[1,]`, `{"a":1,}`, `{"a"}`, `{"a":}`, `{a:1}`, `{"a" 1}`, `[1 2]`,
	`01`, `-`, `1.`, `.5`, `1e`, `1e+`, `+1`, `0x1`, `NaN`, `tru`, `nul`, `truex`, `"abc`, `"\x"`, `"\u12"`, `"\u12g4"`,
	"\"a\x01\"", "\"\t\"", `{"a":1} x`, `1 2`, `[1]]`, "\xff", `{"query": ` + "\xff}",
	`"\ud83d\u12g4"`,
}

func TestParseDecodesAsEncodingJSON(t *testing.T) {
	for _, s := range samples {
		checkLikeEncodingJSON(t, []byte(s))
	}
}

// TestParseDepthIsBounded: nesting to MaxDepth is decoded, one level more is refused, as
// arrays and as objects.
func TestParseDepthIsBounded(t *testing.T) {
	nest := func(open, close string, n int) []byte {
		return []byte(strings.Repeat(open, n) + "1" + strings.Repeat(close, n))
	}
	for _, k := range []struct{ open, close string }{{"[", "]"}, {`{"a":`, "}"}} {
		if _, err := Parse(nest(k.open, k.close, MaxDepth)); err != nil {
			t.Errorf("%s nested %d deep: %v", k.open, MaxDepth, err)
		}
		if _, err := Parse(nest(k.open, k.close, MaxDepth+1)); !errors.Is(err, ErrTooDeep) {
			t.Errorf("%s nested %d deep: %v, want ErrTooDeep", k.open, MaxDepth+1, err)
		}
	}
}

func TestSyntaxErrorSaysWhere(t *testing.T) {
	_, err := Parse([]byte(`{"a": tru}`))
	var se *SyntaxError
	if !errors.As(err, &se) || se.Offset != 6 {
		t.Fatalf("Parse: %v, want a SyntaxError at offset 6", err)
	}
}

func FuzzParseDecodesAsEncodingJSON(f *testing.F) {
	for _, s := range samples {
		f.Add([]byte(s))
	}
	f.Fuzz(checkLikeEncodingJSON)
}

// The body of one create as the load generator sends it: Parse beside encoding/json's
// validation and decoding, which the API did before.
func BenchmarkCreateBody(b *testing.B) {
	body := []byte(samples[0])
	b.Run("jsonvalue.Parse", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Parse(body); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding/json Valid+Decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := reference(body); !ok {
				b.Fatal("refused")
			}
		}
	})
}

// AppendString writes what encoding/json writes for the same string, byte for byte.
func checkAppendString(t *testing.T, s string) {
	want, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if got := AppendString([]byte("x"), s); string(got) != "x"+string(want) {
		t.Fatalf("AppendString(%q) = %s, want x%s", s, got, want)
	}
}

func TestAppendStringIsEncodingJSONs(t *testing.T) {
	for _, s := range []string{"", "plain", "a\"b\\c/", "<a href='x'>&amp;</a>", "\x00\x01\b\f\n\r\t\x1f\x7f",
		"é中😀", "\u2028\u2029", "\xff", "a\xc3", "\xed\xa0\x80", "\xef\xbf\xbd"} {
		checkAppendString(t, s)
	}
}

func FuzzAppendStringIsEncodingJSONs(f *testing.F) {
	for _, s := range samples {
		f.Add(s)
	}
	f.Fuzz(checkAppendString)
}

// AppendTime writes what encoding/json writes for a time, and refuses what it refuses.
func TestAppendTimeIsEncodingJSONs(t *testing.T) {
	for _, at := range []time.Time{{}, time.Date(2026, 11, 27, 12, 0, 0, 1, time.UTC),
		time.Date(1999, 1, 2, 3, 4, 5, 120000000, time.FixedZone("", -(9*3600+30*60))),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("", 24*3600))} {
		want, wantErr := json.Marshal(at)
		got, err := AppendTime(nil, at)
		if (err != nil) != (wantErr != nil) || err == nil && string(got) != string(want) {
			t.Errorf("AppendTime(%v) = %s, %v; encoding/json: %s, %v", at, got, err, want, wantErr)
		}
	}
}
