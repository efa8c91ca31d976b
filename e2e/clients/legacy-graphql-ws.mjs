// The legacy graphql-ws protocol with its own client, subscriptions-transport-ws's
// SubscriptionClient (what Apollo Client 2 and many older apps speak): a query, a mutation, a
// subscription that sees the snapshot, SYNCED and the live event of the mutation, a stop, an
// operation error, and a missing token. The client gets the ws package's WebSocket, wrapped to
// record every message and the close, which the library itself does not expose.
import WebSocket from 'ws';
import pkg from 'subscriptions-transport-ws';

import { config, run, within, Waiter, meQuery, createMutation, eventsSubscription, createVariables, eventsVariables, errorSummary, isKind, streamSummary } from './lib.mjs';

const { SubscriptionClient } = pkg;

// recordingWebSocket returns a WebSocket class whose sockets report their messages and close.
function recordingWebSocket(messages, closes) {
  return class extends WebSocket {
    constructor(...args) {
      super(...args);
      this.addEventListener('message', (ev) => {
        const m = JSON.parse(ev.data);
        messages.push({ type: m.type, id: m.id ?? null, kind: m.payload?.data?.instanceEvents?.kind ?? null });
      });
      this.addEventListener('close', (ev) => closes.push({ code: ev.code, reason: String(ev.reason), protocol: this.protocol }));
    }
  };
}

// connect starts a SubscriptionClient and resolves once it is acknowledged or refused.
async function connect(connectionParams) {
  const messages = new Waiter();
  const closes = new Waiter();
  let answered;
  const connection = new Promise((resolve) => { answered = resolve; });
  const client = new SubscriptionClient(config.ws, {
    connectionParams, reconnect: false,
    connectionCallback: (err) => answered(err ? { refused: errorSummary(err) } : { acknowledged: true }),
  }, recordingWebSocket(messages, closes));
  const answer = await within(connection, 'connection_ack or connection_error');
  return { client, messages, closes, answer };
}

// once runs an operation and resolves when the client completes or errors it.
function once(client, request, what) {
  return within(new Promise((resolve) => {
    const out = { results: [], completed: false, error: null };
    client.request(request).subscribe({
      next: (r) => out.results.push(r),
      error: (e) => { out.error = Array.isArray(e) ? e.map(errorSummary) : [errorSummary(e)]; resolve(out); },
      complete: () => { out.completed = true; resolve(out); },
    });
  }), what);
}


run(async () => {
  const out = {};
  const { client, messages, answer } = await connect({ Authorization: `Bearer ${config.token}` });
  out.connection = answer;

  const q = await once(client, { query: meQuery }, 'the query');
  out.query = { subject: q.results[0]?.data?.me?.subject ?? null, results: q.results.length, completed: q.completed, error: q.error };

  const events = new Waiter();
  let subError = null;
  const sub = client.request({ query: eventsSubscription, variables: eventsVariables() }).subscribe({
    next: (r) => events.push(r.data?.instanceEvents ?? { kind: 'NO_DATA', errors: r.errors }),
    error: (e) => { subError = e; },
  });
  await events.until('SYNCED', isKind('SYNCED'));
  // The client numbers its operations: this subscription is the last one started.
  const subID = String(client.nextOperationId);

  const m = await once(client, { query: createMutation, variables: createVariables(`${config.prefix}-legacy`) }, 'createInstance');
  const created = m.results[0]?.data?.createInstance;
  out.mutation = {
    id: created?.instance?.id ?? null, name: created?.instance?.name ?? null,
    userErrors: created?.userErrors ?? null, completed: m.completed, error: m.error,
  };
  const live = await events.until('CREATED', isKind('CREATED', out.mutation.id));

  // stop: the reference server answers it with complete.
  const mark = messages.values.length;
  sub.unsubscribe();
  await messages.until('complete after stop', (msg) => msg.type === 'complete' && msg.id === subID);
  out.subscription = {
    ...streamSummary(events.values, live),
    error: subError,
    afterStop: messages.values.slice(mark).filter((msg) => msg.id === subID).map((msg) => msg.type),
  };

  // An operation refused before it ran: on this protocol, data with the errors, then complete.
  const nf = await once(client, { query: eventsSubscription, variables: eventsVariables('no-such-organization') }, 'the subscription to an unknown organization');
  out.notFound = { errors: nf.results.flatMap((r) => (r.errors ?? []).map(errorSummary)), data: nf.results.map((r) => r.data ?? null), completed: nf.completed, error: nf.error };
  out.keepAlive = messages.values.some((msg) => msg.type === 'ka');
  client.close();

  // Without a token: connection_error, then the close.
  const refused = await connect({});
  const close = await refused.closes.until('the close without a token', () => true);
  out.noToken = { answer: refused.answer, messages: refused.messages.values.map((msg) => msg.type), close };
  refused.client.close();
  return out;
});
