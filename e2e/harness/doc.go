// Package harness runs computeql as it runs in production, for end-to-end and chaos tests:
// the built binary as separate api, worker and region processes, sharing nothing but a real
// redis-server or a local Redis Cluster, all on loopback ports.
//
// Ownership: everything the harness starts belongs to the test that asked for it and is
// stopped by that test's cleanup, even when the test fails — processes with SIGTERM and then
// SIGKILL, Redis servers, WebSocket readers. The binary is built once per test binary (Binary)
// and removed by Main. A process that exits without being asked to fails its test, with the
// tail of its log.
//
// The pieces:
//
//   - Binary builds the computeql command (or takes COMPUTEQL_E2E_BINARY).
//   - StartRedis and StartCluster give a Redis and the --redis URL that reaches it.
//   - Deployment starts, signals and restarts processes of the binary.
//   - Client speaks GraphQL over HTTP; Subscribe follows a subscription over
//     graphql-transport-ws, recording every message.
//   - Checker asserts the invariants a settled deployment keeps, whatever happened before:
//     every instance settled, quota usage equal to the live instances' charges, one backing
//     server per instance and no orphan, nothing left in the work queue.
//
// Environment: COMPUTEQL_E2E_BINARY runs a prebuilt binary; COMPUTEQL_E2E_RACE=1 builds it
// with the race detector; COMPUTEQL_E2E_LOGS=DIR keeps every process's log under DIR. The
// processes never see the test's other COMPUTEQL_ variables (see Options.Env).
package harness
