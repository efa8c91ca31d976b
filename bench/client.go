package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// client posts GraphQL operations to one endpoint with one bearer token.
type client struct {
	url   string
	token string
	http  *http.Client
}

// newClient returns a client that keeps up to conns connections to the endpoint open, so a
// run of conns concurrent requests never waits to dial.
func newClient(url, token string, conns int) *client {
	return &client{url: url, token: token, http: &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			MaxIdleConns:        conns,
			MaxIdleConnsPerHost: conns,
			IdleConnTimeout:     time.Minute,
			DisableCompression:  true,
		},
	}}
}

func (c *client) close() { c.http.CloseIdleConnections() }

// gqlError is one entry of a response's errors.
type gqlError struct {
	Message    string `json:"message"`
	Extensions struct {
		Code string `json:"code"`
	} `json:"extensions"`
}

// requestBody is a GraphQL request's body.
type requestBody struct {
	Query     string `json:"query"`
	Variables any    `json:"variables"`
}

// post sends the operation and decodes the response's data into data. A response with
// errors, or another status than 200, is a failure.
func (c *client) post(ctx context.Context, query string, variables, data any) error {
	payload, err := json.Marshal(requestBody{Query: query, Variables: variables})
	if err != nil {
		return fmt.Errorf("encode request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(payload))
	if err != nil {
		return fmt.Errorf("request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	res, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("post: %w", err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("read response: %w", err)
	}
	// One pass: data, a pointer in an interface, is decoded into; without one, an empty struct
	// skips the data.
	if data == nil {
		data = &struct{}{}
	}
	out := struct {
		Data   any        `json:"data"`
		Errors []gqlError `json:"errors"`
	}{Data: data}
	if err := json.Unmarshal(raw, &out); err != nil {
		return fmt.Errorf("status %d, response is not GraphQL (%v): %.200s", res.StatusCode, err, raw)
	}
	if len(out.Errors) > 0 {
		msgs := make([]string, len(out.Errors))
		for i, e := range out.Errors {
			msgs[i] = fmt.Sprintf("%s (%s)", e.Message, e.Extensions.Code)
		}
		return fmt.Errorf("status %d: %s", res.StatusCode, strings.Join(msgs, "; "))
	}
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d: %.200s", res.StatusCode, raw)
	}
	return nil
}

const createMutation = `mutation($input: CreateInstanceInput!) {
  createInstance(input: $input) { instance { id } userErrors { field code message } }
}`

// where names the catalogue entries instances are created with.
type where struct {
	Org, Project, Network, Flavor, Image string
}

// create creates an instance with the name and returns its id; refusals (userErrors) are
// failures.
func (c *client) create(ctx context.Context, w where, name string) (string, error) {
	var data struct {
		CreateInstance struct {
			Instance *struct {
				ID string `json:"id"`
			} `json:"instance"`
			UserErrors []struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"userErrors"`
		} `json:"createInstance"`
	}
	// A struct, as a generated client sends: no map to sort on every create, in the process
	// that shares the cores with the system it measures.
	var vars struct {
		Input struct {
			Org     string `json:"organizationId"`
			Project string `json:"projectId"`
			Network string `json:"networkId"`
			Name    string `json:"name"`
			Flavor  string `json:"flavorId"`
			Image   string `json:"imageId"`
		} `json:"input"`
	}
	vars.Input.Org, vars.Input.Project, vars.Input.Network = w.Org, w.Project, w.Network
	vars.Input.Name, vars.Input.Flavor, vars.Input.Image = name, w.Flavor, w.Image
	if err := c.post(ctx, createMutation, vars, &data); err != nil {
		return "", fmt.Errorf("create %s: %w", name, err)
	}
	p := data.CreateInstance
	if len(p.UserErrors) > 0 {
		return "", fmt.Errorf("create %s: refused: %s (%s)", name, p.UserErrors[0].Message, p.UserErrors[0].Code)
	}
	if p.Instance == nil {
		return "", fmt.Errorf("create %s: no instance and no error", name)
	}
	return p.Instance.ID, nil
}

// unlimitedQuota sets every limit of the organization so high that quota never refuses a
// benchmark's create: the benchmark measures creating, not refusing. The limit is the
// largest round number a GraphQL Int (32 bits) holds.
func (c *client) unlimitedQuota(ctx context.Context, org string) error {
	const big = 1_000_000_000
	var limits []map[string]any
	for _, kind := range []string{"servers", "gpus", "publicIPs", "cpus", "memoryGiB"} {
		limits = append(limits, map[string]any{"kind": kind, "limit": big})
	}
	var data struct {
		SetQuota struct {
			UserErrors []struct {
				Message string `json:"message"`
			} `json:"userErrors"`
		} `json:"setQuota"`
	}
	err := c.post(ctx, `mutation($input: SetQuotaInput!) { setQuota(input: $input) { userErrors { message } } }`,
		map[string]any{"input": map[string]any{"organizationId": org, "limits": limits}}, &data)
	if err == nil && len(data.SetQuota.UserErrors) > 0 {
		err = errors.New(data.SetQuota.UserErrors[0].Message)
	}
	if err != nil {
		return fmt.Errorf("set quota of %s: %w", org, err)
	}
	return nil
}
