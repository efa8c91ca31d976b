package graph

import (
	"context"
	"net/url"
)

// ConsolePath is where the API serves a console session, its token appended.
const ConsolePath = "/console/"

type publicURLKey struct{}

// WithPublicURL records in ctx where the caller reached the API (its scheme and host), from
// which links to the API's other paths are made.
func WithPublicURL(ctx context.Context, u url.URL) context.Context {
	return context.WithValue(ctx, publicURLKey{}, u)
}

// PublicURL returns where the caller reached the API, as WithPublicURL recorded it.
func PublicURL(ctx context.Context) (url.URL, bool) {
	u, ok := ctx.Value(publicURLKey{}).(url.URL)
	return u, ok
}

// ConsoleURL is the WebSocket URL of a console session: on the API as its caller reached it
// (wss:// where that was https://), or a path alone when that is not known.
func ConsoleURL(ctx context.Context, token string) string {
	u, _ := PublicURL(ctx)
	switch u.Scheme {
	case "https", "wss":
		u.Scheme = "wss"
	case "":
	default:
		u.Scheme = "ws"
	}
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: ConsolePath + token}).String()
}
