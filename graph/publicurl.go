package graph

import (
	"context"
	"net/url"
)

// ConsolePath is where the API serves a console session, its token appended.
const ConsolePath = "/console/"

type publicURLKey struct{}

// publicURL is what a context keeps of the URL: a WebSocket's context keeps it as long as the
// socket lives, and a whole url.URL is four times its size.
type publicURL struct{ scheme, host string }

// WithPublicURL records in ctx where the caller reached the API (its scheme and host), from
// which links to the API's other paths are made.
func WithPublicURL(ctx context.Context, u url.URL) context.Context {
	return context.WithValue(ctx, publicURLKey{}, publicURL{u.Scheme, u.Host})
}

// PublicURL returns where the caller reached the API (its scheme and host), as WithPublicURL
// recorded it.
func PublicURL(ctx context.Context) (url.URL, bool) {
	u, ok := ctx.Value(publicURLKey{}).(publicURL)
	return url.URL{Scheme: u.scheme, Host: u.host}, ok
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
