// Helpers shared by the client scripts that e2e/clients_test.go runs against the whole system.
//
// Every script reads its configuration from the COMPUTEQL_CLIENTS environment variable (JSON
// written by the Go test: the URLs, tokens and the catalogue's create input), observes what
// the real client library does, and prints one JSON line: the observations, which the Go test
// asserts on. A script that cannot finish (a step timed out, the library threw) prints
// {"error": "..."} and exits 1. Scripts never sleep to synchronise: every step awaits the
// event it needs, bounded by a timeout.

export const config = JSON.parse(process.env.COMPUTEQL_CLIENTS ?? 'null') ?? fail('COMPUTEQL_CLIENTS is not set');

function fail(msg) {
  throw new Error(msg);
}

// stepTimeout bounds every awaited step: the server runs under the race detector on two shared
// cores, but nothing here should take long.
export const stepTimeout = 15_000;

// within resolves as promise does, or rejects once ms have passed without it settling.
export function within(promise, what, ms = stepTimeout) {
  let timer;
  return Promise.race([
    promise,
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

// Waiter collects values and resolves the promises of until() once one matches.
export class Waiter {
  constructor() {
    this.values = [];
    this.waits = [];
  }
  push(v) {
    this.values.push(v);
    for (const w of this.waits.slice()) {
      if (w.match(v)) {
        this.waits.splice(this.waits.indexOf(w), 1);
        w.resolve(v);
      }
    }
  }
  // until resolves with the first value (already pushed or to come) that match accepts.
  until(what, match) {
    const found = this.values.find(match);
    if (found !== undefined) return Promise.resolve(found);
    return within(new Promise((resolve) => this.waits.push({ match, resolve })), what);
  }
}

// The operations every suite runs.
export const meQuery = '{ me { subject } }';
export const createMutation = `mutation($in: CreateInstanceInput!) {
  createInstance(input: $in) { instance { id name } userErrors { field code message } }
}`;
export const updateMutation = `mutation($in: UpdateInstanceInput!) {
  updateInstance(input: $in) { instance { id description } userErrors { field code message } }
}`;
export const eventsSubscription = `subscription($org: ID!, $project: ID) {
  instanceEvents(organizationId: $org, projectId: $project) { kind cursor instance { id name } }
}`;

// createVariables is the input of createInstance for an instance named name.
export function createVariables(name) {
  return { in: { ...config.createInput, name } };
}

// eventsVariables subscribes to the project's instances, or to an organization that does not
// exist.
export function eventsVariables(org = config.organization) {
  return { org, project: config.project };
}

// isKind matches events of the kind (and, given an id, of that instance).
export const isKind = (kind, id) => (e) => e.kind === kind && (id === undefined || e.instance?.id === id);

// streamSummary is what the Go test checks of a subscription's events: those before SYNCED,
// SYNCED, and the live one awaited.
export function streamSummary(events, live) {
  const synced = events.findIndex(isKind('SYNCED'));
  return { beforeSynced: events.slice(0, synced).map(summary), synced: summary(events[synced]), live: summary(live) };
}

// summary reduces an instanceEvents event to what the Go test checks.
export function summary(event) {
  return { kind: event.kind, cursor: event.cursor, id: event.instance?.id ?? null, name: event.instance?.name ?? null };
}

// errorSummary keeps what the Go test checks of a GraphQL error, or of anything else thrown.
export function errorSummary(e) {
  if (e && typeof e === 'object' && 'message' in e) {
    return { message: String(e.message), code: e.extensions?.code ?? null };
  }
  return { message: String(e), code: null };
}

// closeSummary keeps the code and reason of a WebSocket close event.
export function closeSummary(ev) {
  return ev && typeof ev === 'object' && 'code' in ev ? { code: ev.code, reason: String(ev.reason ?? '') } : null;
}

// run prints what main resolves with as one JSON line and exits 0, or prints the error and
// exits 1. It exits explicitly: a client library that keeps a socket or timer must not hang
// the test.
export async function run(main) {
  try {
    const result = await main();
    process.stdout.write(JSON.stringify(result) + '\n');
    process.exit(0);
  } catch (e) {
    process.stdout.write(JSON.stringify({ error: e?.stack ?? String(e) }) + '\n');
    process.exit(1);
  }
}
