// Raw graphql-transport-ws frames, sent with the ws package, for what no well-behaved client
// sends: every close code of the protocol (PROTOCOL.md of graphql-ws), the pong that echoes a
// ping's payload, and an error message that is not followed by complete. Each check has a
// socket of its own and they all run at once, so the one that waits out the server's 10 s
// initialisation timeout (4408) costs no more than itself. (server/wsproto_test.go checks the
// same close with a short timeout; this one checks the default that clients meet.)
import WebSocket from 'ws';

import { config, run, within, Waiter, meQuery, eventsSubscription, eventsVariables, errorSummary } from './lib.mjs';

const protocol = 'graphql-transport-ws';

// connect opens a socket offering the subprotocols and records what the server sends.
async function connect(protocols = [protocol]) {
  const ws = new WebSocket(config.ws, protocols);
  const messages = new Waiter();
  let opened;
  const closed = new Promise((resolve) => {
    ws.on('close', (code, reason) => resolve({ code, reason: reason.toString(), ms: Date.now() - opened }));
  });
  ws.on('message', (data, isBinary) => {
    let m;
    try {
      m = JSON.parse(data.toString());
    } catch {
      m = { type: 'UNPARSABLE', raw: data.toString(), isBinary };
    }
    messages.push(m);
  });
  await within(new Promise((resolve, reject) => {
    ws.once('open', resolve);
    ws.once('error', reject);
  }), 'the WebSocket handshake');
  opened = Date.now();
  const send = (m) => ws.send(typeof m === 'string' ? m : JSON.stringify(m));
  return { ws, messages, closed, send, protocol: ws.protocol };
}

// acknowledged is a socket past connection_init and connection_ack.
async function acknowledged() {
  const s = await connect();
  s.send({ type: 'connection_init', payload: { Authorization: `Bearer ${config.token}` } });
  await s.messages.until('connection_ack', (m) => m.type === 'connection_ack');
  return s;
}

// ended waits for the server to close s and reports the close with every message s received.
async function ended(s, ms) {
  const c = await within(s.closed, 'the server to close the socket', ms);
  return { code: c.code, reason: c.reason, ms: c.ms, protocol: s.protocol, messages: s.messages.values.map((m) => m.type) };
}

// closeAfter sends the frames on an acknowledged socket (or a fresh one) and reports the close.
async function closeAfter(frames, { init = true } = {}) {
  const s = init ? await acknowledged() : await connect();
  for (const f of frames) s.send(f);
  return ended(s);
}

const checks = {
  notJSON: () => closeAfter(['{"type": "subscribe", ']),
  notAnObject: () => closeAfter(['["connection_init"]'], { init: false }),
  unknownType: () => closeAfter([{ type: 'unsubscribe', id: '1' }]),
  subscribeWithoutID: () => closeAfter([{ type: 'subscribe', payload: { query: meQuery } }]),
  subscribeWithoutPayload: () => closeAfter([{ type: 'subscribe', id: '1' }]),
  subscribeBeforeAck: () => closeAfter([{ type: 'subscribe', id: '1', payload: { query: meQuery } }], { init: false }),
  initWithoutToken: () => closeAfter([{ type: 'connection_init' }], { init: false }),
  secondInit: () => closeAfter([{ type: 'connection_init', payload: { Authorization: `Bearer ${config.token}` } }]),

  // A handshake that offers no subprotocol is accepted, then closed.
  noSubprotocol: async () => ended(await connect([])),

  // Nothing after the handshake: the server's default initialisation timeout, 10 s.
  initTimeout: async () => ended(await connect(), 20_000),

  // A second subscribe with the id of a running subscription.
  duplicateID: async () => {
    const s = await acknowledged();
    const sub = { type: 'subscribe', id: 'dup', payload: { query: eventsSubscription, variables: eventsVariables() } };
    s.send(sub);
    await s.messages.until('SYNCED', (m) => m.id === 'dup' && m.payload?.data?.instanceEvents?.kind === 'SYNCED');
    s.send(sub);
    return ended(s);
  },

  // The client completes a subscription and at once subscribes again with its id, which the
  // protocol allows: the server has to have let go of the id when it read the complete.
  reuseAfterComplete: async () => {
    const s = await acknowledged();
    const sub = { type: 'subscribe', id: 'r', payload: { query: eventsSubscription, variables: eventsVariables() } };
    const synced = (m) => m.id === 'r' && m.payload?.data?.instanceEvents?.kind === 'SYNCED';
    s.send(sub);
    const first = await s.messages.until('SYNCED', synced);
    s.send({ type: 'complete', id: 'r' });
    s.send(sub);
    const again = s.messages.until('SYNCED of the second subscription', (m) => synced(m) && m !== first);
    again.catch(() => {}); // once the close has won the race, its timeout is no failure
    const result = await within(Promise.race([again.then(() => 'synced'), s.closed]), 'SYNCED or the close');
    const open = s.ws.readyState === WebSocket.OPEN;
    s.ws.close(1000);
    return {
      resynced: result === 'synced', open,
      closed: result === 'synced' ? null : { code: result.code, reason: result.reason },
      messages: s.messages.values.filter((m) => m.id === 'r').map((m) => m.type),
    };
  },

  // Ping is answered with a pong carrying the same payload, before connection_init too; a ping
  // without a payload gets a pong without one. The socket stays open.
  pingPong: async () => {
    const s = await connect();
    const payload = { hello: 'world', nested: { n: 1, list: [true, null, 'x'] } };
    s.send({ type: 'ping', payload });
    const beforeInit = await s.messages.until('pong before connection_init', (m) => m.type === 'pong');
    s.send({ type: 'connection_init', payload: { Authorization: `Bearer ${config.token}` } });
    await s.messages.until('connection_ack', (m) => m.type === 'connection_ack');
    s.send({ type: 'ping', payload: { after: 'ack' } });
    const afterAck = await s.messages.until('pong after connection_ack', (m) => m.type === 'pong' && m !== beforeInit);
    s.send({ type: 'ping' });
    const bare = await s.messages.until('pong to a ping without payload', (m) => m.type === 'pong' && m !== beforeInit && m !== afterAck);
    const open = s.ws.readyState === WebSocket.OPEN;
    s.ws.close(1000);
    return { sent: payload, beforeInit, afterAck, bare, open, messages: s.messages.values.map((m) => m.type) };
  },

  // A query: next, then complete.
  queryThenComplete: async () => {
    const s = await acknowledged();
    s.send({ type: 'subscribe', id: 'q', payload: { query: meQuery } });
    await s.messages.until('complete of the query', (m) => m.type === 'complete' && m.id === 'q');
    s.ws.close(1000);
    return { messages: s.messages.values.filter((m) => m.id === 'q').map((m) => ({ type: m.type, subject: m.payload?.data?.me?.subject ?? null })) };
  },

  // An operation error ends the operation: no complete follows it. A ping sent after the error
  // has arrived is answered after anything the server sent for the operation.
  errorWithoutComplete: async () => {
    const s = await acknowledged();
    s.send({ type: 'subscribe', id: 'nf', payload: { query: eventsSubscription, variables: eventsVariables('no-such-organization') } });
    const err = await s.messages.until('the error message', (m) => m.type === 'error' && m.id === 'nf');
    s.send({ type: 'ping', payload: { barrier: true } });
    await s.messages.until('pong after the error', (m) => m.type === 'pong');
    // The id is free again: the same subscribe is refused the same way, not closed with 4409.
    s.send({ type: 'subscribe', id: 'nf', payload: { query: eventsSubscription, variables: eventsVariables('no-such-organization') } });
    await s.messages.until('the second error message', (m) => m.type === 'error' && m.id === 'nf' && m !== err);
    s.send({ type: 'ping', payload: { barrier: 2 } });
    await s.messages.until('pong after the second error', (m) => m.type === 'pong' && m.payload?.barrier === 2);
    const open = s.ws.readyState === WebSocket.OPEN;
    s.ws.close(1000);
    return {
      payloadIsList: Array.isArray(err.payload),
      errors: (Array.isArray(err.payload) ? err.payload : []).map(errorSummary),
      messages: s.messages.values.filter((m) => m.id === 'nf' || m.type === 'pong').map((m) => m.type),
      open,
    };
  },
};

run(async () => {
  const names = Object.keys(checks);
  const results = await Promise.all(names.map((name) => checks[name]().catch((e) => ({ error: String(e?.message ?? e) }))));
  return Object.fromEntries(names.map((name, i) => [name, results[i]]));
});
