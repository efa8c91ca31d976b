package server

import (
	"context"
	"encoding/base64"
	"net/http"
	"reflect"
	"testing"

	"github.com/computeql/computeql/auth"
)

const historyQuery = `query($id: ID!, $first: Int, $after: String) {
  instanceEvents(id: $id, first: $first, after: $after) {
    edges { cursor node { cursor kind changedFields occurredAt message instance { id generation description status { provisioningStatus } } } }
    pageInfo { hasNextPage endCursor }
  }
}`

// TestInstanceHistory: the history query serves an instance's events from the event log,
// oldest first, paged by cursor, to readers of the instance only.
func TestInstanceHistory(t *testing.T) {
	a := newAPI(t)
	tok := a.admin(t)
	id := a.mustCreate(t, tok, createInput("hist")).ID
	a.mustPost(t, tok, `mutation($id: ID!) { updateInstance(input: {id: $id, description: "one"}) { userErrors { code } } }`, map[string]any{"id": id})
	a.mustPost(t, tok, `mutation($id: ID!) { deleteInstance(input: {id: $id}) { userErrors { code } } }`, map[string]any{"id": id})

	type node struct {
		Kind          string   `json:"kind"`
		ChangedFields []string `json:"changedFields"`
		Instance      struct {
			Generation  int    `json:"generation"`
			Description string `json:"description"`
		} `json:"instance"`
	}
	var kinds []string
	var nodes []node
	after := ""
	for pages := 0; ; pages++ {
		vars := map[string]any{"id": id, "first": 1}
		if after != "" {
			vars["after"] = after
		}
		res := a.mustPost(t, tok, historyQuery, vars)
		var conn struct {
			Edges []struct {
				Cursor string `json:"cursor"`
				Node   node   `json:"node"`
			} `json:"edges"`
			PageInfo struct {
				HasNextPage bool   `json:"hasNextPage"`
				EndCursor   string `json:"endCursor"`
			} `json:"pageInfo"`
		}
		decode(t, res.Data["instanceEvents"], &conn)
		for _, e := range conn.Edges {
			kinds = append(kinds, e.Node.Kind)
			nodes = append(nodes, e.Node)
		}
		if !conn.PageInfo.HasNextPage {
			break
		}
		after = conn.PageInfo.EndCursor
		if pages > 10 {
			t.Fatal("paging does not end")
		}
	}
	if !reflect.DeepEqual(kinds, []string{"CREATED", "UPDATED", "UPDATED"}) {
		t.Fatalf("history kinds %v", kinds)
	}
	if !reflect.DeepEqual(nodes[1].ChangedFields, []string{"description"}) || nodes[1].Instance.Description != "one" || nodes[1].Instance.Generation != 2 {
		t.Errorf("update event %+v", nodes[1])
	}
	// The log keeps no copy of large fields: every event shows the instance's current ones.
	if nodes[0].Instance.Description != "one" || nodes[0].Instance.Generation != 1 {
		t.Errorf("created event's instance %+v, want generation 1 with the current description", nodes[0].Instance)
	}
	if nodes[0].ChangedFields == nil || len(nodes[0].ChangedFields) != 0 {
		t.Errorf("created event changedFields %v, want []", nodes[0].ChangedFields)
	}
	if !reflect.DeepEqual(nodes[2].ChangedFields, []string{"deletedAt", "status.provisioningStatus", "status.conditions"}) {
		t.Errorf("delete event changedFields %v", nodes[2].ChangedFields)
	}

	// Only readers of the instance see its history; bad cursors are the caller's.
	other := a.token(t, "o", auth.Grant{OrganizationID: "globex", Role: auth.RoleAdmin})
	wantError(t, a.post(t, other, historyQuery, map[string]any{"id": id}), http.StatusOK, "NOT_FOUND")
	wantError(t, a.post(t, tok, historyQuery, map[string]any{"id": id, "after": "garbage"}), http.StatusOK, "BAD_USER_INPUT")
	wantError(t, a.post(t, tok, historyQuery, map[string]any{"id": id, "first": 0}), http.StatusOK, "BAD_USER_INPUT")

	// A cursor the log was trimmed past is expired, and says so.
	a.rdb.XTrimMaxLen(context.Background(), "cq:{o:acme}:events", 1)
	old := base64.RawURLEncoding.EncodeToString([]byte("e1:1-0"))
	wantError(t, a.post(t, tok, historyQuery, map[string]any{"id": id, "after": old}), http.StatusOK, "CURSOR_EXPIRED")
}
