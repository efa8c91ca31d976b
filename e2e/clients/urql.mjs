// urql's core client without a framework: queries and mutations over HTTP (fetchExchange),
// subscriptions over graphql-transport-ws (subscriptionExchange forwarding to a graphql-ws
// client). A query, a mutation, a subscription that sees the snapshot, SYNCED and the
// mutation's live event, and a missing token, whose UNAUTHENTICATED code the caller reads from
// the result's CombinedError.
import WebSocket from 'ws';
import { Client, fetchExchange, subscriptionExchange } from '@urql/core';
import { createClient } from 'graphql-ws';

import { config, run, within, Waiter, meQuery, createMutation, eventsSubscription, createVariables, eventsVariables, errorSummary, closeSummary, isKind, streamSummary } from './lib.mjs';

// urql is a client with the token (none when token is null) that records which transport
// carried each operation.
function urql(token, wire) {
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  const nexts = new Set();
  const ws = createClient({
    url: config.ws, webSocketImpl: WebSocket, retryAttempts: 0,
    connectionParams: token ? headers : undefined,
    on: {
      message: (m) => {
        // The first next of each operation stands for all of them.
        if (m.type === 'next' && nexts.has(m.id)) return;
        nexts.add(m.id);
        wire.push({ transport: 'ws', message: m.type });
      },
      closed: (ev) => wire.push({ transport: 'ws', closed: closeSummary(ev) }),
    },
  });
  const fetchAndRecord = async (url, init) => {
    const res = await fetch(url, init);
    // urql sends queries that fit in a URL with GET, the rest with POST.
    const method = init.method ?? 'GET';
    const query = method === 'GET' ? new URL(url).searchParams.get('query') : JSON.parse(init.body).query;
    wire.push({
      transport: 'http', method, status: res.status, contentType: res.headers.get('content-type'),
      operation: query.trimStart().startsWith('mutation') ? 'mutation' : 'query',
    });
    return res;
  };
  return new Client({
    url: config.http,
    fetch: fetchAndRecord,
    fetchOptions: { headers },
    requestPolicy: 'network-only',
    exchanges: [
      fetchExchange,
      subscriptionExchange({
        forwardSubscription(request) {
          const input = { ...request, query: request.query || '' };
          return { subscribe: (sink) => ({ unsubscribe: ws.subscribe(input, sink) }) };
        },
      }),
    ],
  });
}

// failure describes a result's CombinedError.
function failure(error) {
  if (!error) return null;
  return {
    graphQLErrors: error.graphQLErrors.map(errorSummary),
    networkError: error.networkError ? String(error.networkError.message ?? error.networkError) : null,
    status: error.response?.status ?? null,
  };
}


// Were the server to answer urql's queries and mutations with text/event-stream (which urql's
// Accept lists after the JSON types), urql would abort the stream once it has the result, and
// the abort rejects a read nobody awaits: Node ends the process on such an unhandled rejection.
// Count them instead, so that the Go test can report them.
const unhandledAborts = [];
process.on('unhandledRejection', (e) => {
  if (e?.name !== 'AbortError') throw e;
  unhandledAborts.push(String(e.message));
});

run(async () => {
  const out = {};
  const wire = new Waiter();
  const client = urql(config.token, wire);

  const q = await within(client.query(meQuery, {}).toPromise(), 'the query');
  out.query = { subject: q.data?.me?.subject ?? null, error: failure(q.error) };

  const events = new Waiter();
  const errors = [];
  const sub = client.subscription(eventsSubscription, eventsVariables()).subscribe((r) => {
    if (r.error) errors.push(failure(r.error));
    if (r.data?.instanceEvents) events.push(r.data.instanceEvents);
  });
  await events.until('SYNCED', isKind('SYNCED'));

  const m = await within(client.mutation(createMutation, createVariables(`${config.prefix}-urql`)).toPromise(), 'createInstance');
  const created = m.data?.createInstance;
  out.mutation = { id: created?.instance?.id ?? null, name: created?.instance?.name ?? null, userErrors: created?.userErrors ?? null, error: failure(m.error) };
  const live = await events.until('CREATED', isKind('CREATED', out.mutation.id));
  sub.unsubscribe();
  // The last subscription gone, the graphql-ws client closes its socket normally.
  await wire.until('the WebSocket to close after unsubscribe', (w) => w.closed);

  out.subscription = {
    ...streamSummary(events.values, live),
    errors,
  };
  out.wire = wire.values;

  // Without a token: HTTP 401, whose GraphQL errors urql puts in the result's CombinedError.
  const anonymousWire = new Waiter();
  const r = await within(urql(null, anonymousWire).query(meQuery, {}).toPromise(), 'the query without a token');
  out.noToken = { data: r.data ?? null, error: failure(r.error), wire: anonymousWire.values };
  out.unhandledAborts = unhandledAborts.length;
  return out;
});
