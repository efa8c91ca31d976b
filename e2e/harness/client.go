package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Client runs GraphQL operations over HTTP POST with a bearer token. It is safe for concurrent
// use and keeps connections alive, as a busy script would.
type Client struct {
	Endpoint string
	Token    string
	http     *http.Client
}

// NewClient returns a client of the GraphQL endpoint (e.g. http://127.0.0.1:8080/graphql);
// its idle connections are closed when the test ends.
func NewClient(tb testing.TB, endpoint, token string) *Client {
	c := &Client{Endpoint: endpoint, Token: token, http: &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: time.Minute},
	}}
	tb.Cleanup(c.http.CloseIdleConnections)
	return c
}

// Error is one GraphQL error of a response.
type Error struct {
	Message    string         `json:"message"`
	Path       []any          `json:"path,omitempty"`
	Extensions map[string]any `json:"extensions,omitempty"`
}

// Code is the error's extensions.code.
func (e Error) Code() string { s, _ := e.Extensions["code"].(string); return s }

// Errors are the top-level errors of a response.
type Errors []Error

func (es Errors) Error() string {
	msgs := make([]string, len(es))
	for i, e := range es {
		msgs[i] = fmt.Sprintf("%s (%s)", e.Message, e.Code())
	}
	return "graphql: " + strings.Join(msgs, "; ")
}

// Do runs the operation and decodes its data into data (unless nil). Top-level errors come
// back as Errors; a payload's userErrors are data, for the caller to look at.
func (c *Client) Do(ctx context.Context, query string, vars map[string]any, data any) error {
	body, err := json.Marshal(map[string]any{"query": query, "variables": vars})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.Endpoint, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.Token)
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("%s: read response: %w", c.Endpoint, err)
	}
	var out struct {
		Data   json.RawMessage `json:"data"`
		Errors Errors          `json:"errors"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return fmt.Errorf("%s: HTTP %d: %s", c.Endpoint, resp.StatusCode, raw)
	}
	if len(out.Errors) > 0 {
		return out.Errors
	}
	if data != nil {
		if err := json.Unmarshal(out.Data, data); err != nil {
			return fmt.Errorf("decode data: %w", err)
		}
	}
	return nil
}

// ConsoleSession opens a console session of an instance through createConsoleSession and
// returns its URL; a refusal is an error carrying the userErrors.
func (c *Client) ConsoleSession(ctx context.Context, id string) (string, error) {
	var data struct {
		CreateConsoleSession struct {
			ConsoleSession *struct {
				URL string `json:"url"`
			} `json:"consoleSession"`
			UserErrors Errors `json:"userErrors"`
		} `json:"createConsoleSession"`
	}
	if err := c.Do(ctx, `mutation($id: ID!) { createConsoleSession(input: {id: $id}) { consoleSession { url } userErrors { message } } }`,
		map[string]any{"id": id}, &data); err != nil {
		return "", fmt.Errorf("createConsoleSession %s: %w", id, err)
	}
	p := data.CreateConsoleSession
	if p.ConsoleSession == nil {
		return "", fmt.Errorf("createConsoleSession %s refused: %w", id, p.UserErrors)
	}
	return p.ConsoleSession.URL, nil
}
