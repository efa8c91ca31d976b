package store

import (
	"crypto/sha256"
	"encoding/hex"
)

// Every key of an organization carries the hash tag {o:<org>}, so all the keys one script
// touches live in one Redis Cluster slot. Organization ids come from the validated catalogue
// (no braces), so a tag can never be forged by input.

const prefix = "cq:"

func orgTag(org string) string { return "{o:" + org + "}" }

// instanceKey is a hash: spec (JSON), status (JSON), gen, sv (status version), proj.
func instanceKey(org, id string) string { return prefix + orgTag(org) + ":i:" + id }

// claimKey holds the id of the instance that owns a name on a network.
func claimKey(org, claim string) string { return prefix + orgTag(org) + ":claim:" + claim }

// orgIndexKey is a sorted set of the organization's instance ids, all with score 0, so that
// the lexical order of the time-ordered (UUID v7) ids is creation order.
func orgIndexKey(org string) string { return prefix + orgTag(org) + ":idx" }

// projectIndexKey is orgIndexKey for one project.
func projectIndexKey(org, project string) string {
	return prefix + orgTag(org) + ":idx:p:" + project
}

// eventsKey is the organization's event stream: one entry per committed change of any of its
// instances, appended by the script that commits the change.
func eventsKey(org string) string { return prefix + orgTag(org) + ":events" }

// eventBytesKey sums the sizes of the entries of the organization's event stream, so that
// the stream is trimmed by bytes as well as by count.
func eventBytesKey(org string) string { return prefix + orgTag(org) + ":events:bytes" }

// historyKey is a sorted set indexing one instance's events in its organization's event
// stream: each member is the id of an event it stands for, written so that members sort as
// the ids do (historyMember in historyLua), all with score 0, so that a page of one instance's
// history reads that page, however long the organization's log is.
//
// It was a stream (legacyHistoryKey) until a stream's first node was found to take 4 KiB
// however few entries it holds: two thirds of the memory of an instance with a short history.
// Reads take the old index's entries too, and an instance's next event moves them when it
// finds no sorted set (eventLua), so that instances of a version before the change lose
// nothing.
func historyKey(org, id string) string { return instanceKey(org, id) + ":hi" }

// legacyHistoryKey is the stream an instance's history index was before historyKey: the same
// name without its last byte, so that scripts find one from the other.
func legacyHistoryKey(org, id string) string { return instanceKey(org, id) + ":h" }

// deletedKey is a hash of the organization's deleted instances whose history is kept: id →
// project; deletedOrderKey orders them by deletion time (Unix ms), oldest first.
func deletedKey(org string) string      { return prefix + orgTag(org) + ":deleted" }
func deletedOrderKey(org string) string { return prefix + orgTag(org) + ":deleted:t" }

// ticketKey holds a stream ticket's principal, named by the ticket's SHA-256 so that the
// store never holds a redeemable ticket. It belongs to no organization: its slot is any.
func ticketKey(ticket string) string {
	sum := sha256.Sum256([]byte(ticket))
	return prefix + "ticket:" + hex.EncodeToString(sum[:])
}

// consoleKey holds a console session's grant, named like a ticket by the token's SHA-256.
func consoleKey(token string) string {
	sum := sha256.Sum256([]byte(token))
	return prefix + "console:" + hex.EncodeToString(sum[:])
}

// quotaKey is a hash of limit:<kind> (only kinds set with setQuota) and used:<kind>.
func quotaKey(org string) string { return prefix + orgTag(org) + ":quota" }

// idemKey holds what a mutation's idempotency key (hashed with its caller's subject) records
// for a day; "-" names the key a write without one passes, never written.
func idemKey(org, key string) string {
	if key == "" {
		key = "-"
	}
	return prefix + orgTag(org) + ":idem:" + key
}

// schemaKey holds the schema version every instance record of the organization has reached;
// absent before the first upgrade.
func schemaKey(org string) string { return prefix + orgTag(org) + ":schema" }
