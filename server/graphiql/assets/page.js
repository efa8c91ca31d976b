// Boots GraphiQL with a fetcher that adds the bearer token from the bar
// above the editor: queries and mutations go over HTTP, subscriptions over a
// WebSocket that sends the token in connection_init. It lives in its own file,
// not inline in the page, so the page's Content-Security-Policy can forbid
// inline scripts altogether.
(function () {
  'use strict';

  var STORAGE_KEY = 'computeql.token';

  var mount = document.getElementById('graphiql');
  var input = document.getElementById('token');
  var endpoint = mount.getAttribute('data-endpoint');

  // localStorage throws in some private modes and sandboxed frames; the page
  // must still work there, just without remembering the token.
  var memoryToken = '';
  function loadToken() {
    try {
      return window.localStorage.getItem(STORAGE_KEY) || '';
    } catch (e) {
      return memoryToken;
    }
  }
  function saveToken(token) {
    memoryToken = token;
    try {
      if (token) {
        window.localStorage.setItem(STORAGE_KEY, token);
      } else {
        window.localStorage.removeItem(STORAGE_KEY);
      }
    } catch (e) {
      // Keep the in-memory copy only.
    }
  }

  // A printed sign-in link carries the token in the fragment because browsers
  // never send fragments to servers, proxies or Referer headers. Parsed by
  // hand rather than with URLSearchParams, which would turn '+' into a space.
  function takeTokenFromFragment() {
    var hash = window.location.hash.replace(/^#/, '');
    if (!hash) {
      return;
    }
    var found = false;
    var token = '';
    var rest = hash.split('&').filter(function (part) {
      if (part.indexOf('token=') !== 0) {
        return true;
      }
      found = true;
      token = part.slice('token='.length);
      try {
        token = decodeURIComponent(token);
      } catch (e) {
        // Not percent-encoded after all: use it as written.
      }
      return false;
    });
    if (!found) {
      return;
    }
    saveToken(token.trim());
    // Drop the secret from the address bar, and so from history and from
    // anything copied out of it.
    var url = window.location.pathname + window.location.search;
    if (rest.length) {
      url += '#' + rest.join('&');
    }
    window.history.replaceState(window.history.state, '', url);
  }

  // Decides from the query text itself rather than GraphiQL's documentAST,
  // which lags behind the editor by a debounce and so can describe the
  // previous query when Run is pressed right after an edit. A lexical scan is
  // enough: operation keywords only matter outside strings, comments and
  // selection sets.
  function isSubscription(params) {
    // One pass, so whichever of string or comment starts first wins.
    var text = String(params.query || '').replace(/"""[\s\S]*?"""|"(?:[^"\\\n]|\\.)*"|#[^\n\r]*/g, ' ');
    var ops = [];
    var head = '';
    var braces = 0;
    var parens = 0;
    for (var i = 0; i < text.length; i++) {
      var c = text[i];
      if (c === '(') {
        parens++;
      } else if (c === ')') {
        parens--;
      } else if (c === '{' && parens === 0) {
        if (braces === 0) {
          var m = /^\s*(query|mutation|subscription|fragment)?\s*([_A-Za-z][_0-9A-Za-z]*)?/.exec(head);
          ops.push({ kind: m[1] || 'query', name: m[2] || '' });
        }
        braces++;
      } else if (c === '}' && parens === 0) {
        braces--;
        if (braces === 0) {
          head = '';
        }
        continue;
      }
      if (braces === 0) {
        head += c;
      }
    }
    ops = ops.filter(function (op) {
      return op.kind !== 'fragment';
    });
    var op = ops.length === 1 ? ops[0] : null;
    if (params.operationName) {
      op = ops.filter(function (o) {
        return o.name === params.operationName;
      })[0];
    }
    return !!op && op.kind === 'subscription';
  }

  function hasHeader(headers, name) {
    name = name.toLowerCase();
    return Object.keys(headers).some(function (k) {
      return k.toLowerCase() === name;
    });
  }

  // One socket for the page, opened by the first subscription and closed when
  // none is left, so a page used only for queries holds no connection. Made
  // once the scripts are known to have loaded.
  var sockets = null;

  // subscribe returns the Observable GraphiQL expects of a fetcher for a
  // stream of results; its Stop button calls unsubscribe.
  function subscribe(params) {
    return {
      subscribe: function (observer) {
        var stop = sockets.subscribe(
          { query: params.query, variables: params.variables || {}, operationName: params.operationName || undefined },
          {
            next: function (result) {
              observer.next(result);
            },
            // GraphiQL shows the payload of a completed stream, so errors are
            // passed on as a last result rather than as an exception.
            error: function (errors) {
              observer.next({ errors: errors });
              observer.complete();
            },
            complete: function () {
              observer.complete();
            },
          }
        );
        return { unsubscribe: stop };
      },
    };
  }

  function fetcher(params, opts) {
    if (isSubscription(params)) {
      return subscribe(params);
    }
    var headers = { 'Content-Type': 'application/json', Accept: 'application/json' };
    var extra = (opts && opts.headers) || {};
    Object.keys(extra).forEach(function (k) {
      headers[k] = extra[k];
    });
    // An Authorization typed into GraphiQL's own headers editor is a
    // deliberate, per-tab override, so the bar only fills it in when absent.
    var token = loadToken();
    if (token && !hasHeader(headers, 'Authorization')) {
      headers.Authorization = 'Bearer ' + token;
    }
    return window
      .fetch(endpoint, {
        method: 'POST',
        headers: headers,
        body: JSON.stringify(params),
        credentials: 'same-origin',
        cache: 'no-store',
      })
      .then(function (res) {
        input.setAttribute('aria-invalid', res.status === 401 ? 'true' : 'false');
        return res.text().then(function (text) {
          try {
            return JSON.parse(text);
          } catch (e) {
            // Proxies and auth middleware answer in plain text or HTML; show
            // that rather than a bare JSON syntax error. Returned as a GraphQL
            // error, not thrown, so GraphiQL does not print a stack trace.
            return {
              errors: [
                {
                  message:
                    'HTTP ' + res.status + (res.statusText ? ' ' + res.statusText : '') +
                    ' from ' + endpoint + (text.trim() ? ': ' + text.trim().slice(0, 500) : ''),
                },
              ],
            };
          }
        });
      });
  }

  takeTokenFromFragment();
  input.value = loadToken();

  if (!window.React || !window.ReactDOM || !window.GraphiQL || !window.ComputeQLWS) {
    mount.textContent = 'GraphiQL failed to load: one of its scripts is missing.';
    return;
  }
  sockets = new window.ComputeQLWS.Client({ endpoint: endpoint, token: loadToken });

  // What the editor shows the first time (GraphiQL keeps the user's own document after that).
  var example = [
    '# Welcome to ComputeQL. Put a bearer token in the bar above (make run prints a link that',
    '# signs in), then run this with the ▶ button or Ctrl-Enter. The Docs pane lists',
    '# everything else.',
    '#',
    '# The instances of the demo organization acme, oldest first:',
    '{',
    '  instances(organizationId: "acme", first: 10) {',
    '    edges { node { id name projectId status { powerState privateIP healthStatus } } }',
    '  }',
    '}',
    '',
    '# Then try, one at a time:',
    '#   subscription { instanceEvents(organizationId: "acme", allowBookmarks: true) { kind cursor instance { name status { powerState } } } }',
    '#   (a SNAPSHOT per instance, SYNCED, then every change; resume with after: the last cursor)',
    '#   mutation { stopInstance(input: {id: "<an id from above>"}) { userErrors { field code message } } }',
    ''
  ].join('\n');

  var root = window.ReactDOM.createRoot(mount);
  function render() {
    // A fresh fetcher identity makes GraphiQL introspect again, so a token
    // entered after the page loaded also unlocks the schema and docs.
    var current = function (params, opts) {
      return fetcher(params, opts);
    };
    root.render(window.React.createElement(window.GraphiQL, { fetcher: current, defaultQuery: example }));
  }

  // Saved on every keystroke so the next request uses it, but the schema is
  // refetched only once editing is done (blur or Enter).
  input.addEventListener('input', function () {
    saveToken(input.value.trim());
    input.removeAttribute('aria-invalid');
  });
  input.addEventListener('change', render);
  window.addEventListener('storage', function (e) {
    if (e.key === STORAGE_KEY) {
      input.value = e.newValue || '';
      render();
    }
  });

  render();
})();
