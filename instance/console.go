package instance

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/region"
)

// ConsoleTTL is how long a console session lasts (less when its creator's token expires
// sooner): its token can be redeemed once within it, and the console it attaches is detached
// when it ends. A console stays open for as long as
// someone works in it, so it is longer than a stream ticket's minute; it is Nova's default
// console token lifetime.
const ConsoleTTL = 10 * time.Minute

// ConsoleRecent is how much of what the console showed before it was attached is replayed
// first, so that the terminal does not open blank on a guest that printed its prompt earlier.
const ConsoleRecent = 16 << 10

// ErrNoConsoleSession is a console token that was never issued, was used already, or expired.
var ErrNoConsoleSession = errors.New("no such console session")

// ConsoleSession is a serial console the API will attach, once, for whoever presents its
// token before it expires: the token is a credential, like a password sent once.
type ConsoleSession struct {
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expiresAt"`
}

// ConsoleGrant is what a console token stands for: the principal that opened the session,
// and the instance whose console it attaches.
type ConsoleGrant struct {
	Principal      auth.Principal `json:"principal"`
	OrganizationID string         `json:"organizationId"`
	InstanceID     string         `json:"instanceId"`
	ExpiresAt      time.Time      `json:"expiresAt"`
}

// Console opens a console session on the instance's running server. A retry with the
// idempotency key is answered with the same session while it is valid (the key is kept only
// that long, since the token is a credential); after that, it opens another.
func (s *Service) Console(ctx context.Context, id string, idempotencyKey *string) (ConsoleSession, error) {
	var session ConsoleSession
	pr, inst, err := s.operable(ctx, id)
	if err != nil {
		return session, err
	}
	idem, err := newIdempotency(pr, idempotencyKey, "createConsoleSession", id)
	if err != nil {
		return session, err
	}
	prior, err := s.recorded(ctx, inst.OrganizationID, idem)
	if err != nil {
		return session, err
	}
	if prior != "" {
		_, answer, err := idem.replayWith(prior)
		if err != nil {
			return session, err
		}
		if err := json.Unmarshal([]byte(answer), &session); err != nil {
			return session, internal("replay a console session", err)
		}
		return session, nil
	}
	var rec Idempotency
	err = s.actOn(ctx, pr, inst, ActionConsole, &rec, func(_ *Instance, srv *region.Server) (string, error) {
		if srv.State != region.ServerRunning {
			return "", fmt.Errorf("the server is %s, not RUNNING: %w", srv.State, region.ErrRefused)
		}
		b := make([]byte, 32)
		rand.Read(b)
		// Never past the caller's own token: a console is as long-lived as a socket may be.
		expires := s.now().Add(ConsoleTTL)
		if !pr.Deadline.IsZero() && pr.Deadline.Before(expires) {
			expires = pr.Deadline
		}
		session = ConsoleSession{Token: base64.RawURLEncoding.EncodeToString(b), ExpiresAt: expires.UTC()}
		// Kept at least a second in Redis (the grant's own expiry is what redeeming checks).
		ttl := max(expires.Sub(s.now()), time.Second)
		grant := ConsoleGrant{Principal: pr, OrganizationID: inst.OrganizationID, InstanceID: inst.ID, ExpiresAt: session.ExpiresAt}
		if err := s.store.PutConsoleGrant(ctx, session.Token, grant, ttl); err != nil {
			return "", internal("open a console session", err)
		}
		answer, _ := json.Marshal(session) // a session always encodes
		rec = idem.recordWith(inst.ID, string(answer), ttl)
		return "A console session valid until " + session.ExpiresAt.Format("15:04:05 MST") + " was opened.", nil
	})
	return session, err
}

// AttachedConsole is a console session in use: the server's serial console, and what it
// showed before.
type AttachedConsole struct {
	// Console reads what the guest writes and takes what is typed; the caller closes it.
	Console io.ReadWriteCloser
	// Recent is the end of what the console showed before it was attached.
	Recent string
	// Subject is who opened the session; the console is detached at ExpiresAt.
	Subject   string
	ExpiresAt time.Time
}

// RedeemConsole takes a console session's grant by its token, once: a token never issued,
// used already or expired, or whose principal's token expired since, is ErrNoConsoleSession.
func (s *Service) RedeemConsole(ctx context.Context, token string) (ConsoleGrant, error) {
	g, err := s.store.TakeConsoleGrant(ctx, token)
	if errors.Is(err, ErrNoConsoleSession) {
		return g, err
	}
	if err != nil {
		return g, internal("redeem a console session", err)
	}
	if now := s.now(); !now.Before(g.ExpiresAt) || !g.Principal.ValidAt(now) {
		return ConsoleGrant{}, ErrNoConsoleSession
	}
	return g, nil
}

// ReturnConsole puts back a redeemed grant that could not be used for a reason of the moment
// (a limit on open consoles, the region not answering), so that its URL works when retried.
func (s *Service) ReturnConsole(ctx context.Context, token string, g ConsoleGrant) error {
	ttl := g.ExpiresAt.Sub(s.now())
	if ttl <= 0 {
		return nil
	}
	if err := s.store.PutConsoleGrant(ctx, token, g, ttl); err != nil {
		return internal("return a console session", err)
	}
	return nil
}

// AttachConsole attaches the serial console of a redeemed grant's instance for the
// principal that opened the session, who must still be allowed to act on the instance.
func (s *Service) AttachConsole(ctx context.Context, g ConsoleGrant) (*AttachedConsole, error) {
	_, inst, err := s.operable(auth.WithPrincipal(ctx, g.Principal), g.InstanceID)
	if err != nil {
		return nil, err
	}
	attached := &AttachedConsole{Subject: g.Principal.Subject, ExpiresAt: g.ExpiresAt}
	_, err = s.perform(ctx, inst, func(srv *region.Server) (string, error) {
		if srv == nil {
			return "", Errorf(CodeUnprocessable, "the server of instance %q is being made again", inst.ID)
		}
		// Attached first, then the past read: a line written in between shows twice rather
		// than never.
		c, err := s.region.OpenConsole(ctx, srv.ID)
		if err != nil {
			return "", err
		}
		recent, err := s.region.ConsoleOutput(ctx, srv.ID, ConsoleRecent)
		if err != nil {
			c.Close()
			return "", err
		}
		attached.Console, attached.Recent = c, recent.Text
		return "", nil
	})
	if err != nil {
		return nil, err
	}
	return attached, nil
}
