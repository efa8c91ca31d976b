// The graphql-sse client in distinct connections mode (one POST with Accept:
// text/event-stream per operation), with the token in the Authorization header: a query (its
// next and complete events), a mutation, a subscription that sees the snapshot, SYNCED and the
// live event of the mutation and is completed by the client, an operation error, and a missing
// token.
import { createClient, NetworkError } from 'graphql-sse';

import { config, run, within, Waiter, meQuery, createMutation, eventsSubscription, createVariables, eventsVariables, errorSummary, isKind, streamSummary } from './lib.mjs';

function sseClient(headers) {
  return createClient({ url: config.http, headers, singleConnection: false, retryAttempts: 0 });
}

// outcome describes what a sink's error received.
async function outcome(err) {
  if (err instanceof NetworkError && err.response) {
    let body = null;
    try {
      body = await err.response.json();
    } catch {
      // not JSON: body stays null
    }
    return { status: err.response.status, errors: (body?.errors ?? []).map(errorSummary) };
  }
  return { thrown: String(err?.message ?? err) };
}

// once runs an operation and resolves when the client completes or errors it.
function once(client, payload, what) {
  return within(new Promise((resolve) => {
    const out = { results: [], completed: false, error: null };
    client.subscribe(payload, {
      next: (r) => out.results.push(r),
      error: async (e) => { out.error = await outcome(e); resolve(out); },
      complete: () => { out.completed = true; resolve(out); },
    });
  }), what);
}


run(async () => {
  const out = {};
  const client = sseClient({ Authorization: `Bearer ${config.token}` });

  const q = await once(client, { query: meQuery }, 'the query');
  out.query = { subject: q.results[0]?.data?.me?.subject ?? null, results: q.results.length, completed: q.completed, error: q.error };

  const events = new Waiter();
  let completed;
  const done = new Promise((resolve) => { completed = resolve; });
  let subError = null;
  const dispose = client.subscribe({ query: eventsSubscription, variables: eventsVariables() }, {
    next: (r) => events.push(r.data?.instanceEvents ?? { kind: 'NO_DATA', errors: r.errors }),
    error: async (e) => { subError = await outcome(e); completed(false); },
    complete: () => completed(true),
  });
  await events.until('SYNCED', isKind('SYNCED'));

  const m = await once(client, { query: createMutation, variables: createVariables(`${config.prefix}-sse`) }, 'createInstance');
  const created = m.results[0]?.data?.createInstance;
  out.mutation = {
    id: created?.instance?.id ?? null, name: created?.instance?.name ?? null,
    userErrors: created?.userErrors ?? null, results: m.results.length, completed: m.completed, error: m.error,
  };
  const live = await events.until('CREATED', isKind('CREATED', out.mutation.id));
  dispose();
  const clientCompleted = await within(done, 'sink.complete after dispose');
  out.subscription = {
    ...streamSummary(events.values, live),
    clientCompleted,
    error: subError,
  };

  // An operation refused before its first event: over SSE, a next with the errors, then complete.
  const nf = await once(client, { query: eventsSubscription, variables: eventsVariables('no-such-organization') }, 'the subscription to an unknown organization');
  out.notFound = {
    errors: nf.results.flatMap((r) => (r.errors ?? []).map(errorSummary)),
    data: nf.results.map((r) => r.data ?? null), completed: nf.completed, error: nf.error,
  };
  client.dispose();

  const anonymous = sseClient({});
  const nt = await once(anonymous, { query: meQuery }, 'the query without a token');
  out.noToken = { results: nt.results.length, completed: nt.completed, error: nt.error };
  anonymous.dispose();
  return out;
});
