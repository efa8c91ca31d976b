// The graphql-ws client (graphql-transport-ws protocol) with the ws package's WebSocket: a
// query, two subscriptions that see the snapshot, SYNCED and the live events of mutations sent
// on the same socket, a client-side complete, an operation error, and the close codes of a
// missing and a bad token.
import WebSocket from 'ws';
import { createClient } from 'graphql-ws';

import { config, run, within, Waiter, meQuery, createMutation, updateMutation, eventsSubscription, createVariables, eventsVariables, summary, errorSummary, closeSummary, isKind, streamSummary } from './lib.mjs';

// outcome describes what a sink's error received: the operation's GraphQL errors (an array),
// or the close event that ended the socket.
function outcome(err) {
  if (err == null) return null;
  if (Array.isArray(err)) return { errors: err.map(errorSummary) };
  if (closeSummary(err)) return { close: closeSummary(err) };
  return { thrown: String(err?.message ?? err) };
}

// once runs an operation through the sink API and resolves once the client completes or
// errors it, with everything the sink received.
function once(client, payload, what) {
  return within(new Promise((resolve) => {
    const out = { results: [], completed: false, error: null };
    client.subscribe(payload, {
      next: (r) => out.results.push(r),
      error: (e) => { out.error = outcome(e); resolve(out); },
      complete: () => { out.completed = true; resolve(out); },
    });
  }), what);
}

// follow starts a subscription, returning its events as they come, its id on the socket and
// promises of its sink's complete and error.
function follow(client, ids) {
  const events = new Waiter();
  let completed, errored;
  const done = new Promise((resolve) => { completed = resolve; });
  const error = new Promise((resolve) => { errored = resolve; });
  const dispose = client.subscribe({ query: eventsSubscription, variables: eventsVariables() }, {
    next: (r) => events.push(r.data?.instanceEvents ?? { kind: 'NO_DATA', errors: r.errors }),
    error: (e) => errored(outcome(e)),
    complete: () => completed(true),
  });
  return { events, dispose, done, error, id: ids.at(-1) };
}


run(async () => {
  const ids = [];
  const messages = []; // every message the server sent on the authenticated client's sockets
  const client = createClient({
    url: config.ws,
    webSocketImpl: WebSocket,
    connectionParams: { Authorization: `Bearer ${config.token}` },
    retryAttempts: 0,
    generateID: () => { ids.push(`op-${ids.length + 1}`); return ids.at(-1); },
    on: {
      message: (m) => {
        const event = m.payload?.data?.instanceEvents;
        messages.push({ type: m.type, id: m.id ?? null, kind: event?.kind ?? null, instance: event?.instance?.id ?? null });
      },
    },
  });
  const out = {};

  const q = await once(client, { query: meQuery }, 'the query');
  out.query = { subject: q.results[0]?.data?.me?.subject ?? null, results: q.results.length, completed: q.completed, error: q.error };

  // Two subscriptions on one socket: a, completed by the client once it has seen the live
  // event, and b, which stays to show the events a no longer gets.
  const a = follow(client, ids);
  const b = follow(client, ids);
  await a.events.until('SYNCED on the first subscription', isKind('SYNCED'));
  await b.events.until('SYNCED on the second subscription', isKind('SYNCED'));

  const m = await once(client, { query: createMutation, variables: createVariables(`${config.prefix}-ws`) }, 'createInstance');
  const created = m.results[0]?.data?.createInstance;
  out.mutation = {
    id: created?.instance?.id ?? null, name: created?.instance?.name ?? null,
    userErrors: created?.userErrors ?? null, completed: m.completed, error: m.error,
  };
  const id = out.mutation.id;
  const liveA = await a.events.until('CREATED on the first subscription', isKind('CREATED', id));
  const liveB = await b.events.until('CREATED on the second subscription', isKind('CREATED', id));

  // The client completes a: from here on the server must send nothing for its id.
  const mark = messages.length;
  a.dispose();
  const aCompleted = await within(a.done, "the first subscription's sink.complete after dispose");
  const u = await once(client, { query: updateMutation, variables: { in: { id, description: 'changed over graphql-ws' } } }, 'updateInstance');
  const updatedB = await b.events.until('UPDATED on the second subscription', isKind('UPDATED', id));
  // A query on the same socket after b's event: had a not ended, its UPDATED would be here.
  const barrier = await once(client, { query: meQuery }, 'the query after the update');
  const afterDispose = messages.slice(mark).filter((msg) => msg.id === a.id);
  b.dispose();
  const bCompleted = await within(b.done, "the second subscription's sink.complete after dispose");

  out.subscription = {
    idsDistinct: a.id !== b.id,
    ...streamSummary(a.events.values, liveA),
    liveOnSecond: summary(liveB),
    clientCompleted: aCompleted,
    afterDispose,
    update: { description: u.results[0]?.data?.updateInstance?.instance?.description ?? null, userErrors: u.results[0]?.data?.updateInstance?.userErrors ?? null },
    updatedOnSecond: summary(updatedB),
    barrierSubject: barrier.results[0]?.data?.me?.subject ?? null,
    secondCompleted: bCompleted,
  };

  // An operation refused before its first event: an error message, through the sink's error.
  const nf = await once(client, { query: eventsSubscription, variables: eventsVariables('no-such-organization') }, 'the subscription to an unknown organization');
  out.notFound = { results: nf.results.length, completed: nf.completed, error: nf.error };
  await client.dispose();

  // No token, and a token signed with another key: the socket closes, fatally for the client.
  const refused = async (connectionParams, what) => {
    let closed = null;
    const c = createClient({
      url: config.ws, webSocketImpl: WebSocket, connectionParams, retryAttempts: 0, lazy: true,
      on: { closed: (ev) => { closed = closeSummary(ev); } },
    });
    const r = await once(c, { query: meQuery }, what);
    await c.dispose();
    return { results: r.results.length, completed: r.completed, error: r.error, closed };
  };
  out.noToken = await refused(undefined, 'the query without a token');
  out.badToken = await refused({ Authorization: `Bearer ${config.badToken}` }, 'the query with a bad token');
  return out;
});
