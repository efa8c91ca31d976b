package server

import (
	"mime"
	"regexp"
	"strconv"
	"strings"
)

// The media types of answers, as the GraphQL-over-HTTP specification names them, and of event
// streams.
const (
	mediaJSON            = "application/json"
	mediaGraphQLResponse = "application/graphql-response+json"
	mediaEventStream     = "text/event-stream"
)

// qValue is RFC 9110's weight: 0 to 1 with at most three decimals.
var qValue = regexp.MustCompile(`^(0(\.[0-9]{0,3})?|1(\.0{0,3})?)$`)

// preferred returns which of the offered media types an Accept header ranks highest, as RFC
// 9110 §12.5.1 says: each type takes the q of the most specific range that matches it (the type
// itself, then type/*, then */*; parameters other than q are ignored, as clients send
// application/json;charset=utf-8); the highest q wins, then the range listed first, then the
// earlier offered; a range with a malformed q is ignored. exact says its range named it rather
// than a wildcard. It returns "" when the header accepts none (every match has q=0, or none
// matches).
func preferred(accept string, offered ...string) (best string, exact bool) {
	type rng struct {
		typ string
		q   float64
	}
	var ranges []rng
	for part := range strings.SplitSeq(accept, ",") {
		mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		q := 1.0
		if v, ok := params["q"]; ok {
			if !qValue.MatchString(v) {
				continue // a range whose weight cannot be read weighs nothing
			}
			q, _ = strconv.ParseFloat(v, 64)
		}
		ranges = append(ranges, rng{mt, q})
	}
	bestQ, bestPos := 0.0, len(ranges)
	for _, mt := range offered {
		family, _, _ := strings.Cut(mt, "/")
		q, pos, specificity := 0.0, -1, 0
		for i, r := range ranges {
			s := 0
			switch r.typ {
			case mt:
				s = 3
			case family + "/*":
				s = 2
			case "*/*":
				s = 1
			}
			if s > specificity {
				q, pos, specificity = r.q, i, s
			}
		}
		if q > bestQ || q == bestQ && q > 0 && pos < bestPos {
			best, exact, bestQ, bestPos = mt, specificity == 3, q, pos
		}
	}
	return best, exact
}

// responseType chooses the media type of an answer to an Accept header: the one of the two
// JSON types it prefers; application/json for no Accept at all (what curl and older clients
// send) and for a wildcard; application/graphql-response+json when it accepts neither.
func responseType(accept string) string {
	if accept == "" {
		return mediaJSON
	}
	if mt, _ := preferred(accept, mediaJSON, mediaGraphQLResponse); mt != "" {
		return mt
	}
	return mediaGraphQLResponse
}

// prefersEventStream reports whether an Accept header prefers an event stream to every JSON
// answer, naming it rather than through a wildcard. A client that lists the event stream after
// JSON (urql lists every type it can read) gets JSON.
func prefersEventStream(accept string) bool {
	mt, exact := preferred(accept, mediaJSON, mediaGraphQLResponse, mediaEventStream)
	return mt == mediaEventStream && exact
}
