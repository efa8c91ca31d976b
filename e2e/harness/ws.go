package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// Subscription follows one GraphQL subscription over the graphql-transport-ws protocol (the
// graphql-ws npm client's), recording the data of every event. Its reader never blocks on the
// test, so a test that looks at events late never slows the server down.
type Subscription struct {
	conn *websocket.Conn
	wmu  sync.Mutex // gorilla allows one writer at a time: the reader's pongs, Close

	mu      sync.Mutex
	events  []json.RawMessage
	ended   bool
	err     error // why it ended: nil after complete
	closing bool
	notify  chan struct{} // one pending wake-up for Wait after each change
	done    chan struct{} // closed when the reader has returned
}

// handshakeTimeout bounds the WebSocket handshake and connection_init.
const handshakeTimeout = 10 * time.Second

// Subscribe connects to the WebSocket endpoint (ws://host:port/graphql), authenticates with
// the token in connection_init, and starts the subscription; it is closed when the test ends.
// A refused connection or operation fails the test.
func Subscribe(tb testing.TB, url, token, query string, vars map[string]any) *Subscription {
	tb.Helper()
	dialer := websocket.Dialer{Subprotocols: []string{"graphql-transport-ws"}, HandshakeTimeout: handshakeTimeout}
	conn, resp, err := dialer.Dial(url, http.Header{})
	if err != nil {
		status := "no response"
		if resp != nil {
			status = resp.Status
		}
		tb.Fatalf("harness: subscribe at %s: %v (%s)", url, err, status)
	}
	s := &Subscription{conn: conn, notify: make(chan struct{}, 1), done: make(chan struct{})}
	if err := s.init(token); err != nil {
		conn.Close()
		tb.Fatalf("harness: subscribe at %s: %v", url, err)
	}
	if err := s.write(map[string]any{"id": "1", "type": "subscribe", "payload": map[string]any{"query": query, "variables": vars}}); err != nil {
		conn.Close()
		tb.Fatalf("harness: subscribe at %s: %v", url, err)
	}
	go s.read()
	tb.Cleanup(s.Close)
	return s
}

type wsMessage struct {
	ID      string          `json:"id,omitempty"`
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// init sends connection_init and waits for connection_ack.
func (s *Subscription) init(token string) error {
	if err := s.write(map[string]any{"type": "connection_init", "payload": map[string]any{"Authorization": "Bearer " + token}}); err != nil {
		return err
	}
	s.conn.SetReadDeadline(time.Now().Add(handshakeTimeout))
	defer s.conn.SetReadDeadline(time.Time{})
	for {
		var m wsMessage
		if err := s.conn.ReadJSON(&m); err != nil {
			return fmt.Errorf("connection_init: %w", err)
		}
		switch m.Type {
		case "connection_ack":
			return nil
		case "ping":
			if err := s.write(map[string]any{"type": "pong"}); err != nil {
				return err
			}
		default:
			return fmt.Errorf("connection_init: unexpected %s message %s", m.Type, m.Payload)
		}
	}
}

func (s *Subscription) write(v any) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.conn.SetWriteDeadline(time.Now().Add(handshakeTimeout))
	return s.conn.WriteJSON(v)
}

// read records messages until the subscription or the connection ends.
func (s *Subscription) read() {
	defer close(s.done)
	for {
		var m wsMessage
		if err := s.conn.ReadJSON(&m); err != nil {
			s.end(fmt.Errorf("connection lost: %w", err))
			return
		}
		switch m.Type {
		case "next":
			var p struct {
				Data   json.RawMessage `json:"data"`
				Errors Errors          `json:"errors"`
			}
			if err := json.Unmarshal(m.Payload, &p); err != nil {
				s.end(fmt.Errorf("malformed next message %s: %w", m.Payload, err))
				return
			}
			if len(p.Errors) > 0 {
				// The server's last word before it completes: why it ended the subscription.
				s.end(p.Errors)
				continue
			}
			s.mu.Lock()
			s.events = append(s.events, p.Data)
			s.mu.Unlock()
			s.wake()
		case "error":
			var es Errors
			_ = json.Unmarshal(m.Payload, &es)
			s.end(es)
		case "complete":
			s.end(nil)
		case "ping":
			if err := s.write(map[string]any{"type": "pong"}); err != nil {
				s.end(fmt.Errorf("pong: %w", err))
				return
			}
		}
	}
}

// end records the first reason the subscription ended, unless the test closed it.
func (s *Subscription) end(err error) {
	s.mu.Lock()
	if !s.ended && !s.closing {
		s.ended, s.err = true, err
	}
	s.mu.Unlock()
	s.wake()
}

func (s *Subscription) wake() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// Events returns a copy of the data of every event received so far, in order.
func (s *Subscription) Events() []json.RawMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]json.RawMessage(nil), s.events...)
}

// Ended reports whether the subscription ended, and why: a nil error means the server
// completed it; Errors, that the server ended it with a reason; another error, that the
// connection was lost.
func (s *Subscription) Ended() (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended, s.err
}

// ErrEnded is returned by Wait when the subscription ends before the condition holds.
var ErrEnded = errors.New("the subscription ended")

// Wait calls cond with the events received since its previous call, in order, each time more
// arrive, until it returns true. It fails when the subscription ends first (ErrEnded, wrapping
// the reason) or ctx ends.
func (s *Subscription) Wait(ctx context.Context, cond func(batch []json.RawMessage) bool) error {
	seen := 0
	for {
		s.mu.Lock()
		batch := s.events[seen:len(s.events):len(s.events)]
		seen = len(s.events)
		ended, err := s.ended, s.err
		s.mu.Unlock()
		if cond(batch) {
			return nil
		}
		if ended {
			return fmt.Errorf("%w: %v", ErrEnded, err)
		}
		select {
		case <-s.notify:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Close ends the connection with a normal closure and waits for the reader to return.
func (s *Subscription) Close() {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.wmu.Lock()
	_ = s.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	s.wmu.Unlock()
	s.conn.Close()
	<-s.done
}

// ReadConsoleUntil reads a console session's messages until what they showed holds want,
// failing the test with what it saw when the socket ends first or limit passes.
func ReadConsoleUntil(tb testing.TB, conn *websocket.Conn, want string, limit time.Duration) {
	tb.Helper()
	conn.SetReadDeadline(time.Now().Add(limit))
	var seen []byte
	for !strings.Contains(string(seen), want) {
		_, msg, err := conn.ReadMessage()
		if err != nil {
			tb.Fatalf("console: %v, having shown %q, want %q", err, seen, want)
		}
		seen = append(seen, msg...)
	}
}
