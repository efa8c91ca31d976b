package instance

import (
	"errors"
	"reflect"
	"slices"
	"time"
)

// EventKind says what an event of an instance's history records.
type EventKind string

// Event kinds. Every committed change appends one, in the store step that commits it.
const (
	// EventSnapshot is the current state sent first to a new subscriber; it is never stored.
	EventSnapshot       EventKind = "SNAPSHOT"
	EventCreated        EventKind = "CREATED"
	EventUpdated        EventKind = "UPDATED"
	EventStatusChanged  EventKind = "STATUS_CHANGED"
	EventRebuildStarted EventKind = "REBUILD_STARTED"
	EventDeleted        EventKind = "DELETED"
	// EventWarning records something the user should know that changed nothing, e.g. that
	// duplicate servers were found and deleted.
	EventWarning EventKind = "WARNING"
	// EventAction records an operational verb: who called it, which, and its outcome.
	EventAction EventKind = "ACTION"
	// EventSynced ends a subscription's snapshot: the subscriber's picture is complete. It
	// carries only a cursor and is never stored.
	EventSynced EventKind = "SYNCED"
	// EventBookmark tells a subscriber that asked for bookmarks how far the log has gone:
	// nothing it was to receive lies before the cursor. It is never stored.
	EventBookmark EventKind = "BOOKMARK"
)

// Action is an operational verb, as an instance's history records it.
type Action string

// Actions.
const (
	ActionStart      Action = "START"
	ActionStop       Action = "STOP"
	ActionReboot     Action = "REBOOT"
	ActionHardReboot Action = "HARD_REBOOT"
	ActionConsole    Action = "CONSOLE"
	ActionSSHKey     Action = "SSH_KEY"
	ActionSnapshot   Action = "SNAPSHOT"
	ActionResize     Action = "RESIZE"
	// ActionExpire is the end of a lease, carried out by the workers (actor "system").
	ActionExpire Action = "EXPIRE"
)

// Record is one event of an instance's history, as stored.
type Record struct {
	// Cursor is the event's position in its organization's log.
	Cursor   string
	Kind     EventKind
	Instance *Instance
	Changed  []string
	At       time.Time
	Message  string
	// Actor, Action and Outcome are set on ACTION events: who called the verb, which verb,
	// and the code of its error ("" when it succeeded).
	Actor   string
	Action  Action
	Outcome Code
}

// Caller returns who caused the event: the actor of an ACTION, the principal whose change a
// CREATED or UPDATED event records (the spec keeps who changed it last), or "" for the
// system's own changes.
func (r *Record) Caller() string {
	switch r.Kind {
	case EventAction:
		return r.Actor
	case EventCreated, EventUpdated:
		return r.Instance.UpdatedBy
	}
	return ""
}

// MaxMessageBytes bounds the messages of conditions and events, which may quote a region's
// errors, so that the bytes an event costs the log are bounded.
const MaxMessageBytes = 1024

// BoundMessage returns the message cut to MaxMessageBytes.
func BoundMessage(s string) string { return truncate(s, MaxMessageBytes) }

// ErrCursorExpired is returned by stores for a position older than the log keeps.
var ErrCursorExpired = errors.New("cursor expired")

// ActionEvent is what the history records of an operational verb: who called which verb,
// when, and the code of its error ("" when it succeeded), with a message in words. Warnings
// are recorded in the same shape with only At and Message.
type ActionEvent struct {
	Actor   string
	Action  Action
	Outcome Code
	Message string
	At      time.Time
	// Idem is the idempotency key the verb records with its ACTION (or, with Forget, lets go
	// of, when the region refused what the key recorded).
	Idem Idempotency
}

// Event describes a status change for the history.
type Event struct {
	Kind    EventKind
	Changed []string
	At      time.Time
	Message string
}

// SpecChanges lists the fields (by their API names) in which two specs differ.
func SpecChanges(a, b Spec) []string {
	var out []string
	add := func(name string, differ bool) {
		if differ {
			out = append(out, name)
		}
	}
	add("description", a.Description != b.Description)
	add("tags", !slices.Equal(a.Tags, b.Tags))
	add("flavorId", a.FlavorID != b.FlavorID)
	add("imageId", a.ImageID != b.ImageID)
	add("sshCertificateAuthorityId", a.SSHCertificateAuthorityID != b.SSHCertificateAuthorityID)
	add("networking", !reflect.DeepEqual(a.Networking, b.Networking))
	add("userData", string(a.UserData) != string(b.UserData))
	add("sshPublicKeys", !slices.Equal(a.SSHPublicKeys, b.SSHPublicKeys))
	add("deletionProtection", a.DeletionProtection != b.DeletionProtection)
	add("expiresAt", !equalTimes(a.ExpiresAt, b.ExpiresAt))
	add("expiryAction", a.ExpiryAction != b.ExpiryAction)
	add("deletedAt", (a.DeletedAt == nil) != (b.DeletedAt == nil))
	return out
}

// StatusChanges lists the status fields (by their API names, under "status.") in which two
// statuses differ; none means there is nothing to write.
func StatusChanges(a, b Status) []string {
	var out []string
	add := func(name string, differ bool) {
		if differ {
			out = append(out, "status."+name)
		}
	}
	add("provisioningStatus", a.ProvisioningStatus != b.ProvisioningStatus)
	add("healthStatus", a.HealthStatus != b.HealthStatus)
	add("powerState", a.PowerState != b.PowerState)
	add("privateIP", a.PrivateIP != b.PrivateIP)
	add("publicIP", a.PublicIP != b.PublicIP)
	add("macAddress", a.MACAddress != b.MACAddress)
	add("conditions", !slices.EqualFunc(a.Conditions, b.Conditions, func(x, y Condition) bool {
		return x.Type == y.Type && x.Status == y.Status && x.Reason == y.Reason && x.Message == y.Message &&
			x.LastTransitionTime.Equal(y.LastTransitionTime)
	}))
	if a.ObservedGeneration != b.ObservedGeneration {
		out = append(out, "observedGeneration")
	}
	return out
}

// equalTimes reports whether two optional instants are both absent or equal.
func equalTimes(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(*b)
}
