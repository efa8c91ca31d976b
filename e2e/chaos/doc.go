// Package chaos is computeql's reliability suite: the built binary as separate api and worker
// processes on a real redis-server (through the e2e/harness package), under load, while the
// test breaks things — workers killed, Redis killed and restarted, an API restarted under
// hundreds of subscribers, a misbehaving region, the network to Redis cut — and then an
// invariant checker that must find nothing wrong.
//
// The load (Load) sends creates, updates (half of them rebuilds, some changing the public IP)
// and deletes at a steady rate from concurrent actors and records every answer in a Ledger:
// acknowledged, refused, not found, or unknown (no answer, UNAVAILABLE, INTERNAL: it may or
// may not have happened). Watchers subscribe to organizations and projects after a known
// cursor and resume after the last cursor they received whenever their subscription ends.
//
// The Checker reads a State from the API and from Redis and checks, all at one moment:
// every instance settled (PROVISIONED and RUNNING with its newest generation realised, or
// ERROR with a reason where the region fails to build it; nothing being deleted), quota
// usage equal to the live instances' charges for every kind, exactly one backing server per
// instance and none without one, an empty work queue with every dead letter accounted for,
// and the ledger's acknowledged mutations all in the store (and no instance it did not
// create). Each watcher must then have received exactly its scope's part of the event log,
// as read from Redis: every event, in order, once. Every check has a unit test that feeds it
// a violating state.
//
// Each scenario is a TestChaos… test; COMPUTEQL_CHAOS chooses their size: small (the
// default, run by make test) or full (make chaos). Each logs a REPORT line: the row of the
// reliability table of docs/reliability.md.
package chaos
