package server

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/computeql/computeql/auth"
	"github.com/computeql/computeql/eventually"
	"github.com/computeql/computeql/region"
)

const (
	deleteImageDoc = `mutation($id: ID!, $key: String) { deleteImage(input: {id: $id, idempotencyKey: $key}) { imageId userErrors { field code message } } }`
	createFromDoc  = `mutation($input: CreateInstanceInput!) { createInstance(input: $input) {
		instance { id imageId image { id name } } userErrors { field code message } } }`
)

// deleteImagePayload is deleteImage's payload.
type deleteImagePayload struct {
	ImageID    *string     `json:"imageId"`
	UserErrors []userError `json:"userErrors"`
}

func (a *api) deleteImage(tb testing.TB, token, id string, key *string) (*gqlResponse, deleteImagePayload) {
	tb.Helper()
	vars := map[string]any{"id": id}
	if key != nil {
		vars["key"] = *key
	}
	res := a.post(tb, token, deleteImageDoc, vars)
	var p deleteImagePayload
	if res.Data != nil && res.Data["deleteImage"] != nil {
		decode(tb, res.Data["deleteImage"], &p)
	}
	return res, p
}

// createFrom runs createInstance and returns the instance's id and image id, or the userErrors.
func (a *api) createFrom(tb testing.TB, token string, in map[string]any) (id, imageID, imageName string, problems []userError) {
	tb.Helper()
	res := a.mustPost(tb, token, createFromDoc, map[string]any{"input": in})
	var p struct {
		Instance *struct {
			ID      string `json:"id"`
			ImageID string `json:"imageId"`
			Image   *struct {
				ID   string `json:"id"`
				Name string `json:"name"`
			} `json:"image"`
		} `json:"instance"`
		UserErrors []userError `json:"userErrors"`
	}
	decode(tb, res.Data["createInstance"], &p)
	if p.Instance == nil {
		return "", "", "", p.UserErrors
	}
	if p.Instance.Image != nil {
		imageName = p.Instance.Image.Name
	}
	return p.Instance.ID, p.Instance.ImageID, imageName, p.UserErrors
}

// awaitImageState waits until the images query lists the image in the state.
func (a *api) awaitImageState(tb testing.TB, token, id, state string) {
	tb.Helper()
	var last *gqlImage
	eventually.Holds(tb, verbLimit, func() bool {
		last = findImage(a.images(tb, token), id)
		return last != nil && last.State == state
	}, "image %s %s (last seen %+v)", id, state, eventually.Lazy(func() string { return fmt.Sprintf("%+v", last) }))
}

// awaitRunning waits until the instance's power state is RUNNING.
func (a *api) awaitRunning(tb testing.TB, token, id string) {
	tb.Helper()
	eventually.Holds(tb, verbLimit, func() bool {
		res := a.mustPost(tb, token, `query($id: ID!) { instance(id: $id) { status { powerState } } }`, map[string]any{"id": id})
		var inst struct {
			Status struct {
				PowerState string `json:"powerState"`
			} `json:"status"`
		}
		decode(tb, res.Data["instance"], &inst)
		return inst.Status.PowerState == "RUNNING"
	}, "instance %s RUNNING", id)
}

// snapshotOf snapshots the instance through the API and returns the image's id.
func (a *api) snapshotOf(tb testing.TB, token, id, name string) string {
	tb.Helper()
	res := a.mustPost(tb, token, snapshotDoc, map[string]any{"id": id, "name": name})
	var p struct {
		Image      *gqlImage   `json:"image"`
		UserErrors []userError `json:"userErrors"`
	}
	decode(tb, res.Data["snapshotInstance"], &p)
	if p.Image == nil {
		tb.Fatalf("snapshotInstance: %s", res.Raw)
	}
	return p.Image.ID
}

// wantRefusal fails unless the problems are exactly one of the code on the field, with the
// message when it is not "".
func wantRefusal(tb testing.TB, what string, got []userError, field []string, code, message string) {
	tb.Helper()
	if len(got) != 1 || !reflect.DeepEqual(got[0].Field, field) || got[0].Code != code || message != "" && got[0].Message != message {
		tb.Errorf("%s: userErrors %+v, want one %s on %v %q", what, got, code, field, message)
	}
}

// TestCreateFromSnapshot: an instance is created, and another rebuilt, from a snapshot of its
// project once it is ready, and its image resolves to the snapshot. Another project's snapshot
// is refused exactly as an image that does not exist, one being made as an image not ready,
// and one of another region as an image that region does not offer; each refusal writes
// nothing.
func TestCreateFromSnapshot(t *testing.T) {
	a := newAPI(t)
	clock := a.realise(t)
	admin := a.admin(t)
	src := a.mustCreate(t, admin, createInput("snap-source")).ID
	a.awaitRunning(t, admin, src)
	ready := a.snapshotOf(t, admin, src, "golden")
	a.awaitImageState(t, admin, ready, "READY")

	in := createInput("from-snapshot")
	in["imageId"] = ready
	id, imageID, imageName, problems := a.createFrom(t, admin, in)
	if id == "" || imageID != ready || imageName != "golden" {
		t.Fatalf("create from a ready snapshot of the project: instance %q with image %q (%q), problems %+v; want it made from %s (golden)",
			id, imageID, imageName, problems, ready)
	}
	a.awaitRunning(t, admin, id)
	res := a.mustPost(t, admin, `mutation($id: ID!, $image: ID!) { updateInstance(input: {id: $id, imageId: $image, allowRebuild: true}) {
		instance { imageId } userErrors { code message } } }`, map[string]any{"id": src, "image": ready})
	var upd struct {
		Instance *struct {
			ImageID string `json:"imageId"`
		} `json:"instance"`
		UserErrors []userError `json:"userErrors"`
	}
	decode(t, res.Data["updateInstance"], &upd)
	if upd.Instance == nil || upd.Instance.ImageID != ready {
		t.Fatalf("rebuild onto the snapshot: %s", res.Raw)
	}

	// One the region is still making.
	clock.freeze()
	creating := a.snapshotOf(t, admin, id, "in-the-making")
	clock.stopWorkers()

	unknown := uuid.NewString()
	for _, tc := range []struct {
		name, network, project, image string
		code, message                 string
	}{
		{"an unknown image", "net-acme-web-eu", "web", unknown, "NOT_FOUND", fmt.Sprintf("image %q not found", unknown)},
		{"another project's snapshot", "net-acme-data-eu", "data", ready, "NOT_FOUND", fmt.Sprintf("image %q not found", ready)},
		{"a snapshot being made", "net-acme-web-eu", "web", creating, "UNPROCESSABLE", fmt.Sprintf("image %q is creating, not ready", creating)},
		{"a snapshot of another region", "net-acme-web-us", "web", ready, "UNPROCESSABLE", fmt.Sprintf("image %q is not offered in region %q", ready, "us-east")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := createInput("refused-" + strings.NewReplacer(" ", "-", "'", "").Replace(tc.name))
			in["networkId"], in["projectId"], in["imageId"] = tc.network, tc.project, tc.image
			before := a.storeState(t)
			id, _, _, problems := a.createFrom(t, admin, in)
			if id != "" {
				t.Fatalf("created instance %s from %s", id, tc.name)
			}
			wantRefusal(t, "create from "+tc.name, problems, []string{"input", "imageId"}, tc.code, tc.message)
			if after := a.storeState(t); !reflect.DeepEqual(before, after) {
				t.Errorf("the refusal changed the store: %s", authzStateDiff(before, after))
			}
		})
	}
}

// TestDeleteImage: deleteImage refuses a catalogue image, a snapshot that instances boot
// (naming them), one being made, one it cannot see (NOT_FOUND) and a viewer (FORBIDDEN), each
// writing nothing; once no instance boots it, an operator deletes it, and a retry with the
// same key is answered with its id.
func TestDeleteImage(t *testing.T) {
	a := newAPI(t)
	clock := a.realise(t)
	admin := a.admin(t)
	op := a.operator(t)
	src := a.mustCreate(t, admin, createInput("del-source")).ID
	a.awaitRunning(t, admin, src)
	img := a.snapshotOf(t, admin, src, "to-delete")
	a.awaitImageState(t, admin, img, "READY")
	var users []string
	for _, name := range []string{"user-1", "user-2"} {
		in := createInput(name)
		in["imageId"] = img
		id, _, _, problems := a.createFrom(t, admin, in)
		if id == "" {
			t.Fatalf("create %s from the snapshot: %+v", name, problems)
		}
		users = append(users, id)
	}
	clock.freeze()
	creating := a.snapshotOf(t, admin, src, "in-the-making")
	clock.stopWorkers()

	viewer := a.token(t, "vic", auth.Grant{OrganizationID: "acme", ProjectID: "web", Role: auth.RoleViewer})
	globex := a.token(t, "gus", auth.Grant{OrganizationID: "globex", Role: auth.RoleAdmin})
	unknown := uuid.NewString()
	idField := []string{"input", "id"}
	for _, tc := range []struct {
		name, token, image string
		// topLevel is the top-level error's code; else the payload's single userError.
		topLevel, code, message string
	}{
		{name: "a catalogue image", token: op, image: "ubuntu-24.04", code: "UNPROCESSABLE",
			message: `image "ubuntu-24.04" is a catalogue image, which cannot be deleted: only snapshots made with snapshotInstance can`},
		{name: "a snapshot instances boot", token: op, image: img, code: "CONFLICT",
			message: fmt.Sprintf("image %q is used by 2 instances: user-1 (%s), user-2 (%s); delete them or rebuild them on another image first", img, users[0], users[1])},
		{name: "a snapshot being made", token: op, image: creating, code: "UNPROCESSABLE"},
		{name: "an unknown image", token: op, image: unknown, topLevel: "NOT_FOUND"},
		{name: "another organization's snapshot", token: globex, image: img, topLevel: "NOT_FOUND"},
		{name: "a viewer", token: viewer, image: img, topLevel: "FORBIDDEN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := a.storeState(t)
			res, p := a.deleteImage(t, tc.token, tc.image, nil)
			if tc.topLevel != "" {
				if codes := res.codes(); !reflect.DeepEqual(codes, []string{tc.topLevel}) {
					t.Errorf("deleteImage of %s: %s, want one %s error", tc.name, res.Raw, tc.topLevel)
				}
			} else {
				if len(res.Errors) != 0 || p.ImageID != nil {
					t.Errorf("deleteImage of %s: %s, want only userErrors", tc.name, res.Raw)
				}
				wantRefusal(t, "deleteImage of "+tc.name, p.UserErrors, idField, tc.code, tc.message)
			}
			if after := a.storeState(t); !reflect.DeepEqual(before, after) {
				t.Errorf("the refusal changed the store: %s", authzStateDiff(before, after))
			}
		})
	}

	// Instances being deleted do not hold it.
	for _, id := range users {
		a.mustPost(t, admin, `mutation($id: ID!) { deleteInstance(input: {id: $id}) { instance { id } } }`, map[string]any{"id": id})
	}
	key := "delete-golden-" + uuid.NewString()[:8]
	for i := range 2 {
		res, p := a.deleteImage(t, op, img, &key)
		if len(res.Errors) != 0 || len(p.UserErrors) != 0 || p.ImageID == nil || *p.ImageID != img {
			t.Fatalf("deleteImage (call %d with key %s): %s, want image %s deleted", i+1, key, res.Raw, img)
		}
	}
	if found := findImage(a.images(t, op), img); found != nil {
		t.Errorf("images lists the deleted image: %+v", found)
	}
	if res, _ := a.deleteImage(t, op, img, nil); !reflect.DeepEqual(res.codes(), []string{"NOT_FOUND"}) {
		t.Errorf("deleteImage of a deleted image without a key: %s, want NOT_FOUND", res.Raw)
	}
}

// regionSnapshot makes a READY snapshot of acme/web in the API's simulated region directly, its
// clock running only meanwhile, and returns its id: for a test whose instances stay pending.
func regionSnapshot(tb testing.TB, a *api) string {
	tb.Helper()
	ctx, cancel := context.WithCancel(tb.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = a.region.Run(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	srv, err := a.region.CreateServer(ctx, region.ServerSpec{
		Scope: region.Scope{OrganizationID: "acme", ProjectID: "web", RegionID: "eu-west", NetworkID: "net-acme-web-eu"},
		Name:  "image-source", FlavorID: "g1.small", ImageID: "ubuntu-24.04", Tags: map[string]string{},
	})
	if err != nil {
		tb.Fatal(err)
	}
	eventually.Holds(tb, verbLimit, func() bool {
		got, err := a.region.GetServer(ctx, srv.ID)
		return err == nil && got.State == region.ServerRunning
	}, "server %s RUNNING", srv.ID)
	img, err := a.region.Snapshot(ctx, srv.ID, region.ImageRequest{Name: "cell"})
	if err != nil {
		tb.Fatal(err)
	}
	eventually.Holds(tb, verbLimit, func() bool {
		imgs, err := a.region.Images(ctx, "acme", "web")
		return err == nil && slices.ContainsFunc(imgs, func(im region.Image) bool { return im.ID == img.ID && im.State == region.ImageStateReady })
	}, "snapshot %s READY", img.ID)
	return img.ID
}
