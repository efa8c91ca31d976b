// A small client of the graphql-transport-ws protocol, shared by GraphiQL and the dashboard.
// It is written here rather than vendored because the pages need only its core: one socket
// per client, authenticated in connection_init, with operations multiplexed over it. A lost
// socket ends every operation with an error; reconnecting (and resuming from a cursor) is the
// caller's decision, since only the caller knows where to resume.
(function () {
  'use strict';

  var PROTOCOL = 'graphql-transport-ws';

  function socketURL(endpoint) {
    var loc = window.location;
    return (loc.protocol === 'https:' ? 'wss://' : 'ws://') + loc.host + endpoint;
  }

  // Client opens its socket on the first subscribe and closes it when the last operation ends,
  // so an idle page holds no connection. opts.endpoint is the same-origin GraphQL path and
  // opts.token a function returning the bearer token to send in connection_init.
  function Client(opts) {
    this.endpoint = opts.endpoint;
    this.token = opts.token;
    this.socket = null;
    this.acked = false;
    this.nextID = 1;
    this.ops = {};
  }

  Client.prototype.count = function () {
    return Object.keys(this.ops).length;
  };

  Client.prototype.open = function () {
    var self = this;
    var ws = new window.WebSocket(socketURL(this.endpoint), PROTOCOL);
    this.socket = ws;
    this.acked = false;
    ws.onopen = function () {
      var token = self.token();
      ws.send(JSON.stringify({ type: 'connection_init', payload: token ? { Authorization: 'Bearer ' + token } : {} }));
    };
    ws.onmessage = function (ev) {
      var msg;
      try {
        msg = JSON.parse(ev.data);
      } catch (e) {
        ws.close(4400, 'invalid message');
        return;
      }
      self.receive(ws, msg);
    };
    ws.onclose = function (ev) {
      if (self.socket !== ws) {
        return;
      }
      self.socket = null;
      var reason = 'connection closed (' + ev.code + (ev.reason ? ' ' + ev.reason : '') + ')';
      var ops = self.ops;
      self.ops = {};
      Object.keys(ops).forEach(function (id) {
        ops[id].sink.error([{ message: reason, extensions: { code: closeCode(ev.code) } }]);
      });
    };
  };

  // closeCode names a refused connection_init like the HTTP answer to the same token would.
  function closeCode(code) {
    if (code === 4401 || code === 4403) {
      return 'UNAUTHENTICATED';
    }
    return 'UNAVAILABLE';
  }

  Client.prototype.send = function (msg) {
    if (this.socket && this.acked) {
      this.socket.send(JSON.stringify(msg));
    }
  };

  Client.prototype.receive = function (ws, msg) {
    var op = msg.id !== undefined ? this.ops[msg.id] : null;
    switch (msg.type) {
      case 'connection_ack':
        this.acked = true;
        for (var id in this.ops) {
          this.start(id);
        }
        break;
      case 'ping':
        ws.send(JSON.stringify({ type: 'pong' }));
        break;
      case 'next':
        if (op) {
          op.sink.next(msg.payload);
        }
        break;
      case 'error':
        if (op) {
          this.forget(msg.id);
          op.sink.error(msg.payload);
        }
        break;
      case 'complete':
        if (op) {
          this.forget(msg.id);
          op.sink.complete();
        }
        break;
    }
  };

  Client.prototype.start = function (id) {
    var op = this.ops[id];
    this.send({ id: id, type: 'subscribe', payload: op.payload });
    if (op.sink.started) {
      op.sink.started();
    }
  };

  Client.prototype.forget = function (id) {
    delete this.ops[id];
    if (this.count() === 0 && this.socket) {
      var ws = this.socket;
      this.socket = null;
      ws.close(1000, 'done');
    }
  };

  // subscribe starts an operation ({query, variables, operationName}); sink receives
  // started() once the server has accepted the connection and been sent the operation (if
  // sink has it), then next(result), and finally error(errors) or complete(), after either of
  // which nothing more. The returned unsubscribe function stops the operation and is safe to
  // call at any time.
  Client.prototype.subscribe = function (payload, sink) {
    var id = String(this.nextID++);
    this.ops[id] = { payload: payload, sink: sink };
    if (!this.socket) {
      this.open();
    } else if (this.acked) {
      this.start(id);
    }
    var self = this;
    return function unsubscribe() {
      if (!self.ops[id]) {
        return;
      }
      self.send({ id: id, type: 'complete' });
      self.forget(id);
    };
  };

  window.ComputeQLWS = { Client: Client };
})();
