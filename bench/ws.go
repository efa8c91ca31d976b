package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

const subscribeQuery = `subscription($org: ID!, $id: ID) {
  instanceEvents(organizationId: $org, instanceId: $id) { kind instance { id status { healthStatus } } }
}`

// event is what a subscriber reads of one instance event.
type event struct {
	Kind     string `json:"kind"`
	Instance struct {
		ID     string `json:"id"`
		Status struct {
			HealthStatus string `json:"healthStatus"`
		} `json:"status"`
	} `json:"instance"`
}

// subscriber is one subscription to one instance's events, on its own WebSocket, as a
// dashboard would hold it (graphql-transport-ws, the protocol of the graphql-ws client).
type subscriber struct {
	conn *websocket.Conn
	// done is closed when the reader has stopped; err then says why, nil after close.
	done   chan struct{}
	err    error
	closed chan struct{}
	once   sync.Once
}

// dialSubscriber subscribes to the instance's events and returns once the SNAPSHOT arrived,
// so that the subscription is live. onEvent is called, from the subscriber's reader, with
// every later event and the moment it was read.
func dialSubscriber(ctx context.Context, wsURL, token, org, instanceID string, onEvent func(event, time.Time)) (*subscriber, error) {
	d := websocket.Dialer{Subprotocols: []string{"graphql-transport-ws"}, HandshakeTimeout: 30 * time.Second}
	conn, _, err := d.DialContext(ctx, wsURL, nil)
	if err != nil {
		return nil, fmt.Errorf("subscribe to %s: dial: %w", instanceID, err)
	}
	s := &subscriber{conn: conn, done: make(chan struct{}), closed: make(chan struct{})}
	for _, m := range []any{
		map[string]any{"type": "connection_init", "payload": map[string]any{"Authorization": "Bearer " + token}},
		map[string]any{"type": "subscribe", "id": "1", "payload": map[string]any{
			"query": subscribeQuery, "variables": map[string]any{"org": org, "id": instanceID}}},
	} {
		if err := conn.WriteJSON(m); err != nil {
			conn.Close()
			return nil, fmt.Errorf("subscribe to %s: %w", instanceID, err)
		}
	}
	live := make(chan error, 1)
	go s.read(live, onEvent)
	select {
	case err = <-live:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		s.close()
		return nil, fmt.Errorf("subscribe to %s: %w", instanceID, err)
	}
	return s, nil
}

// read reads until the connection ends: it reports on live when the snapshot arrived (or
// what failed before it), answers the server's pings, and hands every later event on.
func (s *subscriber) read(live chan<- error, onEvent func(event, time.Time)) {
	defer close(s.done)
	var msg struct {
		Type    string `json:"type"`
		Payload struct {
			Data struct {
				InstanceEvents event `json:"instanceEvents"`
			} `json:"data"`
			Errors []gqlError `json:"errors"`
		} `json:"payload"`
	}
	isLive := false
	fail := func(err error) {
		if !isLive {
			live <- err
		}
		select {
		case <-s.closed: // closing is how a subscriber ends: no failure
		default:
			s.err = err
		}
	}
	for {
		_, data, err := s.conn.ReadMessage()
		if err != nil {
			fail(err)
			return
		}
		at := time.Now()
		msg.Payload.Errors, msg.Payload.Data.InstanceEvents = nil, event{}
		if err := json.Unmarshal(data, &msg); err != nil {
			fail(fmt.Errorf("undecodable message: %w", err))
			return
		}
		switch {
		case msg.Type == "ping":
			if err := s.conn.WriteJSON(map[string]string{"type": "pong"}); err != nil {
				fail(err)
				return
			}
		case msg.Type == "connection_ack" || msg.Type == "pong":
		case msg.Type != "next" || len(msg.Payload.Errors) > 0:
			fail(fmt.Errorf("the server sent %s: %.300s", msg.Type, data))
			return
		case msg.Payload.Data.InstanceEvents.Kind == "SNAPSHOT":
			if !isLive {
				isLive = true
				live <- nil
			}
		default:
			onEvent(msg.Payload.Data.InstanceEvents, at)
		}
	}
}

// close ends the subscription and waits for its reader.
func (s *subscriber) close() {
	s.once.Do(func() {
		close(s.closed)
		s.conn.Close()
	})
	<-s.done
}

// dialAll dials n subscribers from up to conns goroutines at once, stopping at the first
// failure, after which it closes those it opened.
func dialAll(ctx context.Context, n, conns int, dial func(ctx context.Context, i int) (*subscriber, error), opened func(int)) ([]*subscriber, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	subs := make([]*subscriber, n)
	work := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	done := 0
	for range conns {
		wg.Go(func() {
			for i := range work {
				s, err := dial(ctx, i)
				if err != nil {
					cancel(err)
					continue
				}
				subs[i] = s
				mu.Lock()
				done++
				opened(done)
				mu.Unlock()
			}
		})
	}
	for i := 0; i < n && ctx.Err() == nil; i++ {
		select {
		case work <- i:
		case <-ctx.Done():
		}
	}
	close(work)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		closeAll(subs)
		return nil, err
	}
	return subs, nil
}

// closeAll closes the subscribers (nil ones are skipped) and returns the first failure any
// reader met before being closed.
func closeAll(subs []*subscriber) error {
	var errs []error
	for _, s := range subs {
		if s == nil {
			continue
		}
		s.close()
		if s.err != nil && !errors.Is(s.err, net.ErrClosed) {
			errs = append(errs, s.err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d subscriptions failed, the first: %w", len(errs), errs[0])
	}
	return nil
}
