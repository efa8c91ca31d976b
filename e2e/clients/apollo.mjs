// Apollo Client 4 without React: queries and mutations over HTTP (HttpLink), subscriptions over
// graphql-transport-ws (GraphQLWsLink on a graphql-ws client), chosen by split. A query, a
// mutation, a subscription that sees the snapshot, SYNCED and the mutation's live event, and a
// missing token, whose UNAUTHENTICATED code the caller reads from the error Apollo throws.
import WebSocket from 'ws';
import { ApolloClient, InMemoryCache, HttpLink, CombinedGraphQLErrors, gql, split } from '@apollo/client';
import { GraphQLWsLink } from '@apollo/client/link/subscriptions';
import { getMainDefinition } from '@apollo/client/utilities';
import { createClient } from 'graphql-ws';

import { config, run, within, Waiter, meQuery, createMutation, eventsSubscription, createVariables, eventsVariables, errorSummary, closeSummary, isKind, streamSummary } from './lib.mjs';

// operationType is the type of the operation a document (as Apollo prints it) holds.
function operationType(query) {
  return getMainDefinition(gql(query)).operation;
}

// apollo is a client with the token (none when token is null) that records which transport
// carried each operation.
function apollo(token, wire) {
  const fetchAndRecord = async (url, init) => {
    const res = await fetch(url, init);
    wire.push({ transport: 'http', status: res.status, contentType: res.headers.get('content-type'), operation: operationType(JSON.parse(init.body).query) });
    return res;
  };
  const nexts = new Set();
  const http = new HttpLink({ uri: config.http, headers: token ? { Authorization: `Bearer ${token}` } : {}, fetch: fetchAndRecord });
  const ws = new GraphQLWsLink(createClient({
    url: config.ws, webSocketImpl: WebSocket, retryAttempts: 0,
    connectionParams: token ? { Authorization: `Bearer ${token}` } : undefined,
    on: {
      message: (m) => {
        // The first next of each operation stands for all of them.
        if (m.type === 'next' && nexts.has(m.id)) return;
        nexts.add(m.id);
        wire.push({ transport: 'ws', message: m.type });
      },
      closed: (ev) => wire.push({ transport: 'ws', closed: closeSummary(ev) }),
    },
  }));
  const isSubscription = ({ query }) => {
    const def = getMainDefinition(query);
    return def.kind === 'OperationDefinition' && def.operation === 'subscription';
  };
  return new ApolloClient({ link: split(isSubscription, ws, http), cache: new InMemoryCache() });
}

// thrown describes an error Apollo rejected with.
function thrown(e) {
  return { combinedGraphQLErrors: CombinedGraphQLErrors.is(e), errors: (e?.errors ?? [e]).map(errorSummary) };
}


run(async () => {
  const out = {};
  const wire = new Waiter();
  const client = apollo(config.token, wire);

  const q = await within(client.query({ query: gql(meQuery), fetchPolicy: 'network-only' }), 'the query');
  out.query = { subject: q.data?.me?.subject ?? null, error: q.error ? thrown(q.error) : null };

  const events = new Waiter();
  let subError = null;
  const sub = client.subscribe({ query: gql(eventsSubscription), variables: eventsVariables() }).subscribe({
    next: (r) => events.push(r.data?.instanceEvents ?? { kind: 'NO_DATA', error: r.error ? thrown(r.error) : null }),
    error: (e) => { subError = thrown(e); },
  });
  await events.until('SYNCED', isKind('SYNCED'));

  const m = await within(client.mutate({ mutation: gql(createMutation), variables: createVariables(`${config.prefix}-apollo`) }), 'createInstance');
  const created = m.data?.createInstance;
  out.mutation = { id: created?.instance?.id ?? null, name: created?.instance?.name ?? null, userErrors: created?.userErrors ?? null };
  const live = await events.until('CREATED', isKind('CREATED', out.mutation.id));
  sub.unsubscribe();
  // The last subscription gone, the graphql-ws client closes its socket normally.
  await wire.until('the WebSocket to close after unsubscribe', (w) => w.closed);

  out.subscription = {
    ...streamSummary(events.values, live),
    error: subError,
  };
  out.wire = wire.values;

  // Without a token: HTTP 401, which Apollo throws as the GraphQL errors of the body.
  const anonymousWire = new Waiter();
  try {
    const r = await within(apollo(null, anonymousWire).query({ query: gql(meQuery) }), 'the query without a token');
    out.noToken = { data: r.data ?? null };
  } catch (e) {
    out.noToken = thrown(e);
  }
  out.noToken.wire = anonymousWire.values;
  return out;
});
