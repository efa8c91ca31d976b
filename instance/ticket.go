package instance

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"time"

	"github.com/computeql/computeql/auth"
)

// TicketTTL is how long a stream ticket may be redeemed: long enough to open a stream right
// after asking for one, short enough that one found in a log or a browser's history is stale.
const TicketTTL = time.Minute

// ErrNoTicket is a ticket that was never issued, was redeemed already, or expired.
var ErrNoTicket = errors.New("no such stream ticket")

// StreamTicket opens one event stream with a GET whose URL carries it, for clients that cannot
// set headers (a browser's EventSource): never the bearer token itself in a URL, where logs and
// histories keep it. It stands for the principal that asked for it, once, within TicketTTL.
type StreamTicket struct {
	Ticket    string
	ExpiresAt time.Time
}

// ticketBytes is how many random bytes a ticket holds.
const ticketBytes = 32

// IssueTicket issues a stream ticket for the caller.
func (s *Service) IssueTicket(ctx context.Context) (*StreamTicket, error) {
	pr, err := Principal(ctx)
	if err != nil {
		return nil, err
	}
	b := make([]byte, ticketBytes)
	rand.Read(b)
	t := &StreamTicket{Ticket: base64.RawURLEncoding.EncodeToString(b), ExpiresAt: s.now().Add(TicketTTL).UTC()}
	if err := s.store.PutTicket(ctx, t.Ticket, pr, TicketTTL); err != nil {
		return nil, internal("issue a stream ticket", err)
	}
	return t, nil
}

// RedeemTicket returns the principal a ticket stands for, once: ErrNoTicket for one that was
// never issued, was redeemed already or expired, or whose principal's token has expired since.
func (s *Service) RedeemTicket(ctx context.Context, ticket string) (auth.Principal, error) {
	// One that IssueTicket cannot have made costs no store call: anyone may send tickets.
	if b, err := base64.RawURLEncoding.DecodeString(ticket); err != nil || len(b) != ticketBytes {
		return auth.Principal{}, ErrNoTicket
	}
	pr, err := s.store.TakeTicket(ctx, ticket)
	if err != nil {
		return auth.Principal{}, err
	}
	if !pr.ValidAt(s.now()) {
		return auth.Principal{}, ErrNoTicket
	}
	return pr, nil
}
