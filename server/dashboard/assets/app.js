// The ComputeQL dashboard: sign in with a bearer token, pick an organization and project,
// and watch their instances live. The table is fed by the instanceEvents subscription alone
// (a SNAPSHOT per instance, then every change), so it never polls and never reloads; the
// mutations only report errors, and their effect arrives through the same stream. Plain
// DOM code without a framework or build step, so the binary embeds it as written.
(function () {
  'use strict';

  var TOKEN_KEY = 'computeql.token'; // shared with the GraphiQL page
  var SCOPE_KEY = 'computeql.dashboard.scope';
  var HISTORY_PAGE = 100;
  var HISTORY_PAGES = 20; // 2,000 events: more than a person reads, fewer than the log keeps
  var RETRY_MAX_MS = 15000;
  var DISARM_MS = 5000; // how long a first click on Delete waits for the second

  var INSTANCE_FIELDS =
    'fragment I on Instance { id name description organizationId projectId networkId flavorId imageId ' +
    'sshCertificateAuthorityId region { id } flavor { id cpus memoryGiB } image { id name } ' +
    'networking { securityGroupIds publicIP allowedSourceAddresses } desiredPowerState generation ' +
    'observedGeneration deletionProtection expiresAt expiryAction sshPublicKeys status { provisioningStatus healthStatus powerState privateIP publicIP macAddress ' +
    'conditions { type status reason message lastTransitionTime } } createdAt createdBy updatedAt updatedBy deletedAt }';
  var EVENT_FIELDS = 'cursor kind changedFields occurredAt message actor action outcome instance { ...I }';

  var endpoint = document.body.getAttribute('data-endpoint');
  var $ = function (id) {
    return document.getElementById(id);
  };

  var state = {
    token: '',
    me: null,
    org: '',
    project: '',
    networks: [], // of the organization
    instances: {}, // id -> instance, as the latest event carried it
    catalog: {}, // region -> {flavors, images}
    detail: null, // {id, instance, events, stop, error, edit}: the open detail view
    list: null, // {stop, cursor, retries, timer}
    armed: {}, // id -> timer of a Delete clicked once
  };
  var sockets = new window.ComputeQLWS.Client({
    endpoint: endpoint,
    token: function () {
      return state.token;
    },
  });

  // --- small helpers --------------------------------------------------------

  function el(tag, attrs) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      var v = attrs[k];
      if (v === null || v === undefined || v === false) {
        return;
      }
      if (k === 'text') {
        node.textContent = v;
      } else if (k.indexOf('on') === 0) {
        node.addEventListener(k.slice(2), v);
      } else {
        node.setAttribute(k, v === true ? '' : v);
      }
    });
    for (var i = 2; i < arguments.length; i++) {
      var c = arguments[i];
      if (c !== null && c !== undefined) {
        node.appendChild(typeof c === 'string' ? document.createTextNode(c) : c);
      }
    }
    return node;
  }

  function clear(node) {
    while (node.firstChild) {
      node.removeChild(node.firstChild);
    }
  }

  function options(select, items, value, placeholder) {
    clear(select);
    if (placeholder !== undefined) {
      select.appendChild(el('option', { value: '', text: placeholder }));
    }
    items.forEach(function (it) {
      select.appendChild(el('option', { value: it.value, text: it.label }));
    });
    select.value = value || '';
    if (select.selectedIndex < 0 && select.options.length) {
      select.selectedIndex = 0;
    }
  }

  function loadStored(key) {
    try {
      return window.localStorage.getItem(key) || '';
    } catch (e) {
      return '';
    }
  }

  function store(key, value) {
    try {
      if (value) {
        window.localStorage.setItem(key, value);
      } else {
        window.localStorage.removeItem(key);
      }
    } catch (e) {
      // Private modes refuse storage: the session still works, it is just not remembered.
    }
  }

  function showBanner(text) {
    var b = $('banner');
    b.textContent = text || '';
    b.hidden = !text;
  }

  function errorText(errors) {
    return (errors || [])
      .map(function (e) {
        return e.message;
      })
      .join('; ');
  }

  function errorCode(errors) {
    var e = (errors || [])[0];
    return (e && e.extensions && e.extensions.code) || '';
  }

  // gql runs a query or mutation over HTTP. It resolves with data and rejects with an Error
  // carrying the GraphQL errors; a refused token signs the user out.
  function gql(query, variables) {
    return window
      .fetch(endpoint, {
        method: 'POST',
        headers: { 'Content-Type': 'application/json', Authorization: 'Bearer ' + state.token },
        body: JSON.stringify({ query: query, variables: variables || {} }),
        credentials: 'same-origin',
        cache: 'no-store',
      })
      .then(function (res) {
        return res.text().then(function (text) {
          var body;
          try {
            body = JSON.parse(text);
          } catch (e) {
            body = { errors: [{ message: 'HTTP ' + res.status + ' from ' + endpoint }] };
          }
          if (res.status === 401) {
            signOut('The token was refused: ' + errorText(body.errors));
          }
          if (body.errors && body.errors.length) {
            var err = new Error(errorText(body.errors));
            err.errors = body.errors;
            err.data = body.data;
            throw err;
          }
          return body.data;
        });
      });
  }

  // --- sign-in --------------------------------------------------------------

  // A printed sign-in link carries the token in the fragment, which browsers never send to
  // servers, proxies or Referer headers; it is dropped from the address bar once read.
  function takeTokenFromFragment() {
    var m = /(?:^#|&)token=([^&]*)/.exec(window.location.hash);
    if (!m) {
      return;
    }
    var token = m[1];
    try {
      token = decodeURIComponent(token);
    } catch (e) {
      // Not percent-encoded after all: use it as written.
    }
    store(TOKEN_KEY, token.trim());
    window.history.replaceState(window.history.state, '', window.location.pathname + window.location.search);
  }

  function signIn(token) {
    state.token = token;
    $('signin-error').textContent = '';
    return gql('{ me { subject grants { organizationId projectId role } } }')
      .then(function (data) {
        store(TOKEN_KEY, token);
        state.me = data.me;
        $('whoami').textContent = data.me.subject;
        $('whoami').hidden = false;
        $('signout').hidden = false;
        $('signin').hidden = true;
        $('app').hidden = false;
        var orgs = [];
        data.me.grants.forEach(function (g) {
          if (orgs.indexOf(g.organizationId) < 0) {
            orgs.push(g.organizationId);
          }
        });
        orgs.sort();
        var saved = loadStored(SCOPE_KEY).split('/');
        options(
          $('org'),
          orgs.map(function (o) {
            return { value: o, label: o };
          }),
          saved[0]
        );
        return chooseOrg($('org').value, saved[1] || '');
      })
      .catch(function (err) {
        if (!state.me) {
          signOut(err.message);
        } else {
          showBanner(err.message);
        }
      });
  }

  function signOut(message) {
    stopList();
    closeDetail();
    state.token = '';
    state.me = null;
    store(TOKEN_KEY, '');
    $('app').hidden = true;
    $('whoami').hidden = true;
    $('signout').hidden = true;
    $('signin').hidden = false;
    $('signin-error').textContent = message || '';
    $('signin-token').value = '';
  }

  // --- organization and project ----------------------------------------------

  function chooseOrg(org, project) {
    state.org = org;
    state.networks = [];
    return gql('query($o: ID) { networks(organizationId: $o) { id name projectId region prefix } }', { o: org })
      .then(function (data) {
        state.networks = data.networks;
        var projects = [];
        data.networks.forEach(function (n) {
          if (projects.indexOf(n.projectId) < 0) {
            projects.push(n.projectId);
          }
        });
        projects.sort();
        var items = projects.map(function (p) {
          return { value: p, label: p };
        });
        options($('project'), items, project || '', 'All projects');
        chooseProject($('project').value);
      })
      .catch(function (err) {
        showBanner('Loading ' + org + ': ' + err.message);
      });
  }

  function chooseProject(project) {
    state.project = project;
    store(SCOPE_KEY, state.org + '/' + project);
    closeCreate();
    closeDetail();
    startList();
  }

  // --- the live table ---------------------------------------------------------

  function setLive(s, text) {
    var live = $('live');
    live.setAttribute('data-state', s);
    live.textContent = text;
  }

  function startList() {
    stopList();
    state.instances = {};
    renderTable();
    state.list = { cursor: '', retries: 0, timer: null, stop: null };
    subscribeList();
  }

  function stopList() {
    var l = state.list;
    state.list = null;
    if (l) {
      window.clearTimeout(l.timer);
      if (l.stop) {
        l.stop();
      }
    }
  }

  // subscribeList (re)opens the project's stream: from the snapshot the first time, then,
  // after a lost connection, from the last event seen, so that nothing is missed or repeated.
  function subscribeList() {
    var l = state.list;
    var vars = { o: state.org, p: state.project || null, after: l.cursor || null };
    setLive('connecting', 'connecting…');
    l.stop = sockets.subscribe(
      {
        query:
          'subscription($o: ID!, $p: ID, $after: String) { instanceEvents(organizationId: $o, projectId: $p, after: $after, allowBookmarks: true) { ' +
          EVENT_FIELDS +
          ' } } ' +
          INSTANCE_FIELDS,
        variables: vars,
      },
      {
        started: function () {
          if (state.list === l) {
            setLive('live', 'live');
          }
        },
        next: function (result) {
          if (state.list !== l) {
            return;
          }
          if (result.errors && result.errors.length) {
            retryList(l, result.errors);
            return;
          }
          l.retries = 0;
          applyEvent(result.data.instanceEvents);
        },
        error: function (errors) {
          if (state.list === l) {
            retryList(l, errors);
          }
        },
        complete: function () {
          if (state.list === l) {
            retryList(l, [{ message: 'the stream ended' }]);
          }
        },
      }
    );
  }

  function retryList(l, errors) {
    if (l.stop) {
      l.stop();
      l.stop = null;
    }
    var code = errorCode(errors);
    if (code === 'UNAUTHENTICATED') {
      signOut('Signed out: ' + errorText(errors));
      return;
    }
    if (code === 'CURSOR_EXPIRED') {
      // Too far behind to replay: start again from a fresh snapshot.
      l.cursor = '';
      state.instances = {};
      renderTable();
    }
    var delay = Math.min(RETRY_MAX_MS, 500 * Math.pow(2, l.retries++));
    setLive('down', 'reconnecting: ' + errorText(errors));
    window.clearTimeout(l.timer);
    l.timer = window.setTimeout(function () {
      if (state.list === l) {
        subscribeList();
      }
    }, delay);
  }

  // applyEvent keeps the cursor of every event, SNAPSHOT ones included (resuming after one
  // continues the snapshot), and SYNCED and BOOKMARK ones, which carry nothing else.
  function applyEvent(ev) {
    if (state.list && ev.cursor) {
      state.list.cursor = ev.cursor;
    }
    var inst = ev.instance;
    if (!inst) {
      return;
    }
    if (ev.kind === 'DELETED') {
      delete state.instances[inst.id];
    } else {
      state.instances[inst.id] = inst;
    }
    renderRow(inst.id);
  }

  function renderTable() {
    clear($('instances').tBodies[0]);
    Object.keys(state.instances)
      .sort()
      .forEach(renderRow);
    $('empty').hidden = Object.keys(state.instances).length > 0;
  }

  function badge(col, value) {
    return el('td', { 'data-col': col, 'data-value': value }, el('span', { class: 'badge', text: value }));
  }

  // renderRow replaces the row of one instance in place, keeping the table in creation order
  // (instance ids are UUID v7, whose lexical order is creation order).
  function renderRow(id) {
    var body = $('instances').tBodies[0];
    var old = body.querySelector('tr[data-id="' + id + '"]');
    var inst = state.instances[id];
    if (!inst) {
      if (old) {
        body.removeChild(old);
      }
      $('empty').hidden = body.rows.length > 0;
      return;
    }
    var s = inst.status;
    var ips = [s.privateIP, s.publicIP].filter(Boolean).join(', ');
    var row = el(
      'tr',
      { 'data-id': inst.id, 'data-name': inst.name, class: inst.deletedAt ? 'deleting' : null },
      el('td', { 'data-col': 'name' }, el('a', { href: '#/instances/' + inst.id, text: inst.name })),
      el('td', { 'data-col': 'project', text: inst.projectId }),
      el('td', { 'data-col': 'flavor', text: inst.flavorId }),
      el('td', { 'data-col': 'image', text: inst.imageId }),
      badge('power', s.powerState),
      el('td', { 'data-col': 'ips', text: ips || '—' }),
      badge('health', s.healthStatus),
      badge('provisioning', s.provisioningStatus),
      el('td', { 'data-col': 'actions' }, el('div', { class: 'actions' }, actions(inst)))
    );
    if (old) {
      body.replaceChild(row, old);
    } else {
      var next = null;
      for (var i = 0; i < body.rows.length; i++) {
        if (body.rows[i].getAttribute('data-id') > id) {
          next = body.rows[i];
          break;
        }
      }
      body.insertBefore(row, next);
    }
    $('empty').hidden = true;
  }

  // --- actions ---------------------------------------------------------------

  var VERBS = {
    start: 'mutation($id: ID!) { r: startInstance(input: {id: $id}) { userErrors { field code message } } }',
    stop: 'mutation($id: ID!) { r: stopInstance(input: {id: $id}) { userErrors { field code message } } }',
    reboot: 'mutation($id: ID!) { r: rebootInstance(input: {id: $id}) { userErrors { field code message } } }',
    delete: 'mutation($id: ID!) { r: deleteInstance(input: {id: $id}) { userErrors { field code message } } }',
    protect: 'mutation($id: ID!) { r: updateInstance(input: {id: $id, deletionProtection: true}) { userErrors { field code message } } }',
    unprotect: 'mutation($id: ID!) { r: updateInstance(input: {id: $id, deletionProtection: false}) { userErrors { field code message } } }',
  };

  function runVerb(verb, inst) {
    showBanner('');
    return gql(VERBS[verb], { id: inst.id })
      .then(function (data) {
        if (data.r.userErrors.length) {
          showBanner(verb + ' ' + inst.name + ': ' + errorText(data.r.userErrors));
        }
      })
      .catch(function (err) {
        showBanner(verb + ' ' + inst.name + ': ' + err.message);
      });
  }

  function actions(inst) {
    var gone = !!inst.deletedAt;
    var frag = document.createDocumentFragment();
    function button(verb, label, disabled) {
      frag.appendChild(
        el('button', {
          type: 'button',
          'data-action': verb,
          disabled: gone || disabled,
          text: label,
          onclick: function () {
            runVerb(verb, inst);
          },
        })
      );
    }
    button('start', 'Start', inst.desiredPowerState === 'RUNNING');
    button('stop', 'Stop', inst.desiredPowerState === 'STOPPED');
    button('reboot', 'Reboot', inst.status.powerState !== 'RUNNING');
    // A protected instance cannot be deleted until the protection is lifted: its Delete is
    // disabled, and the switch beside it says which way it goes.
    if (inst.deletionProtection) {
      button('unprotect', 'Unprotect');
    } else {
      button('protect', 'Protect');
    }
    // Deleting takes two clicks, the second on a button that says what it will do, instead of
    // a browser dialog that blocks the page (and the live updates behind it). The armed state
    // is kept by instance, not on the button, because every event redraws the row.
    var armed = state.armed[inst.id];
    frag.appendChild(
      el('button', {
        type: 'button',
        'data-action': armed ? 'confirm-delete' : 'delete',
        class: 'danger',
        disabled: gone || inst.deletionProtection,
        title: inst.deletionProtection ? 'Deletion protection is on: unprotect the instance first' : null,
        text: armed ? 'Confirm delete' : 'Delete',
        onclick: function () {
          if (state.armed[inst.id]) {
            disarm(inst.id);
            runVerb('delete', inst);
            return;
          }
          state.armed[inst.id] = window.setTimeout(function () {
            disarm(inst.id);
          }, DISARM_MS);
          redraw(inst.id);
        },
      })
    );
    return frag;
  }

  function disarm(id) {
    window.clearTimeout(state.armed[id]);
    delete state.armed[id];
    redraw(id);
  }

  function redraw(id) {
    renderRow(id);
    if (state.detail && state.detail.id === id) {
      renderDetail();
    }
  }

  // --- catalogue -------------------------------------------------------------

  function catalog(region) {
    if (!state.catalog[region]) {
      state.catalog[region] = gql(
        'query($r: ID) { flavors(region: $r) { id name cpus memoryGiB diskGB architecture baremetal gpu { model physicalCount } } ' +
          'images(region: $r) { id name architecture sizeGiB state } }',
        { r: region }
      ).catch(function (err) {
        delete state.catalog[region];
        throw err;
      });
    }
    return state.catalog[region];
  }

  function flavorItems(flavors) {
    return flavors.map(function (f) {
      var gpu = f.gpu ? ', ' + f.gpu.physicalCount + '× ' + f.gpu.model : '';
      return {
        value: f.id,
        label: f.id + ' — ' + f.cpus + ' CPU, ' + f.memoryGiB + ' GiB, ' + f.diskGB + ' GB' + gpu + (f.baremetal ? ', bare metal' : ''),
      };
    });
  }

  function imageItems(images) {
    return images.map(function (i) {
      var st = i.state === 'READY' ? '' : ', ' + i.state.toLowerCase();
      return { value: i.id, label: i.id + ' — ' + i.architecture.toLowerCase() + ', ' + i.sizeGiB + ' GiB' + st };
    });
  }

  // --- field errors ------------------------------------------------------------

  // showFieldErrors puts each userError next to the field its path names, matching the
  // longest prefix of the path that a field of the form declares (so an error on
  // securityGroupIds.1 lands on the security groups), and lists the rest under the form.
  function showFieldErrors(form, list, errors) {
    clearFieldErrors(form, list);
    errors.forEach(function (e) {
      var path = (e.field || []).filter(function (p) {
        return p !== 'input' && !/^\d+$/.test(p);
      });
      var field = null;
      for (var n = path.length; n > 0 && !field; n--) {
        field = form.querySelector('.field[data-field="' + path.slice(0, n).join('.') + '"]');
      }
      var item = el('span', { class: 'field-error', 'data-code': e.code, text: e.message });
      if (field) {
        field.classList.add('invalid');
        field.appendChild(item);
      } else {
        list.appendChild(el('li', { 'data-code': e.code, text: e.message }));
      }
    });
  }

  function clearFieldErrors(form, list) {
    Array.prototype.forEach.call(form.querySelectorAll('.field-error'), function (n) {
      n.parentNode.removeChild(n);
    });
    Array.prototype.forEach.call(form.querySelectorAll('.invalid'), function (n) {
      n.classList.remove('invalid');
    });
    clear(list);
  }

  // --- create ----------------------------------------------------------------

  function openCreate() {
    closeDetail();
    var form = $('create');
    form.reset();
    clearFieldErrors(form, $('create-errors'));
    var projects = [];
    state.networks.forEach(function (n) {
      if (projects.indexOf(n.projectId) < 0) {
        projects.push(n.projectId);
      }
    });
    options(
      $('c-project'),
      projects.sort().map(function (p) {
        return { value: p, label: p };
      }),
      state.project
    );
    // The choices that depend on the network are emptied until they load again, so nothing
    // from another region can be picked meanwhile.
    clear($('c-flavor'));
    clear($('c-image'));
    clear($('c-sgs'));
    form.hidden = false;
    createProjectChanged();
    $('c-name').focus();
  }

  function closeCreate() {
    $('create').hidden = true;
  }

  function createProjectChanged() {
    var project = $('c-project').value;
    var nets = state.networks.filter(function (n) {
      return n.projectId === project;
    });
    options(
      $('c-network'),
      nets.map(function (n) {
        return { value: n.id, label: n.id + ' (' + n.region + ', ' + n.prefix + ')' };
      }),
      ''
    );
    gql('query($o: ID, $p: ID) { sshCertificateAuthorities(organizationId: $o, projectId: $p) { id name } }', {
      o: state.org,
      p: project,
    })
      .then(function (data) {
        options(
          $('c-sshca'),
          data.sshCertificateAuthorities.map(function (c) {
            return { value: c.id, label: c.id };
          }),
          '',
          'None (a project key pair)'
        );
      })
      .catch(function (err) {
        showBanner(err.message);
      });
    createNetworkChanged();
  }

  function createNetworkChanged() {
    var netID = $('c-network').value;
    var net = state.networks.filter(function (n) {
      return n.id === netID;
    })[0];
    if (!net) {
      return;
    }
    Promise.all([catalog(net.region), gql('query($n: ID) { securityGroups(networkId: $n) { id name } }', { n: net.id })])
      .then(function (res) {
        if ($('c-network').value !== netID) {
          return; // the user moved on while this loaded
        }
        options($('c-flavor'), flavorItems(res[0].flavors), $('c-flavor').value);
        options($('c-image'), imageItems(res[0].images), $('c-image').value);
        var box = $('c-sgs');
        clear(box);
        res[1].securityGroups.forEach(function (g) {
          box.appendChild(el('label', { class: 'inline' }, el('input', { type: 'checkbox', value: g.id }), ' ' + g.id));
        });
      })
      .catch(function (err) {
        showBanner(err.message);
      });
  }

  function submitCreate(ev) {
    ev.preventDefault();
    var form = $('create');
    var sgs = Array.prototype.filter
      .call($('c-sgs').querySelectorAll('input'), function (c) {
        return c.checked;
      })
      .map(function (c) {
        return c.value;
      });
    var input = {
      organizationId: state.org,
      projectId: $('c-project').value,
      networkId: $('c-network').value,
      name: $('c-name').value,
      flavorId: $('c-flavor').value,
      imageId: $('c-image').value,
      networking: { securityGroupIds: sgs, publicIP: $('c-publicip').checked },
    };
    if ($('c-sshca').value) {
      input.sshCertificateAuthorityId = $('c-sshca').value;
    }
    if ($('c-description').value) {
      input.description = $('c-description').value;
    }
    var keys = $('c-sshkeys').value.split('\n').filter(function (k) {
      return k.trim() !== '';
    });
    if (keys.length) {
      input.sshPublicKeys = keys;
    }
    var submit = form.querySelector('button[type="submit"]');
    submit.disabled = true;
    showBanner('');
    gql(
      'mutation($in: CreateInstanceInput!) { createInstance(input: $in) { instance { id } userErrors { field code message } } }',
      { in: input }
    )
      .then(function (data) {
        var r = data.createInstance;
        if (r.userErrors.length) {
          showFieldErrors(form, $('create-errors'), r.userErrors);
          return;
        }
        closeCreate();
      })
      .catch(function (err) {
        showFieldErrors(form, $('create-errors'), [{ field: null, code: errorCode(err.errors), message: err.message }]);
      })
      .then(function () {
        submit.disabled = false;
      });
  }

  // --- detail ----------------------------------------------------------------

  function route() {
    var m = /^#\/instances\/([^/?&]+)$/.exec(window.location.hash);
    if (m && state.me) {
      openDetail(decodeURIComponent(m[1]));
    } else {
      closeDetail();
    }
  }

  function closeDetail() {
    var open = !!state.detail;
    stopDetail();
    // Closed for another reason than the Close link (a new project, the create form), the
    // address must not keep naming the instance, or its link would no longer open it. An
    // address naming one before any is open is a link being followed, and kept.
    if (open && /^#\/instances\//.test(window.location.hash)) {
      window.history.replaceState(window.history.state, '', '#/');
    }
  }

  function stopDetail() {
    var d = state.detail;
    state.detail = null;
    if (d && d.stop) {
      d.stop();
    }
    if (d && d.terminal) {
      d.terminal.close();
    }
    $('detail').hidden = true;
    clear($('detail'));
  }

  // openDetail reads the instance's history page by page, then subscribes after the last
  // event read, so the history continues live without a gap or a repeat. The view shows the
  // instance as its own stream last carried it, not as the table's stream did: each stream is
  // in order, but the two are not in step with each other.
  function openDetail(id) {
    if (state.detail && state.detail.id === id) {
      return;
    }
    stopDetail();
    closeCreate();
    var d = { id: id, instance: null, events: [], stop: null, error: '', edit: null, resize: null, console: null, terminal: null };
    state.detail = d;
    $('detail').hidden = false;
    renderDetail();
    var q =
      'query($id: ID!, $after: String) { instance(id: $id) { ...I } instanceEvents(id: $id, first: ' +
      HISTORY_PAGE +
      ', after: $after) { edges { node { ' +
      EVENT_FIELDS +
      ' } } pageInfo { hasNextPage endCursor } } } ' +
      INSTANCE_FIELDS;
    function page(after, n) {
      return gql(q, { id: id, after: after }).then(function (data) {
        if (state.detail !== d) {
          return null;
        }
        if (n === 1) {
          d.instance = data.instance;
        }
        data.instanceEvents.edges.forEach(function (e) {
          d.events.push(e.node);
        });
        var pi = data.instanceEvents.pageInfo;
        if (pi.hasNextPage && n < HISTORY_PAGES) {
          return page(pi.endCursor, n + 1);
        }
        return pi.endCursor || after;
      });
    }
    page(null, 1)
      .then(function (cursor) {
        if (state.detail !== d) {
          return;
        }
        renderDetail();
        followDetail(d, cursor);
      })
      .catch(function (err) {
        if (state.detail === d) {
          d.error = err.message;
          renderDetail();
        }
      });
  }

  function followDetail(d, cursor) {
    d.stop = sockets.subscribe(
      {
        query:
          'subscription($o: ID!, $id: ID!, $after: String) { instanceEvents(organizationId: $o, instanceId: $id, after: $after, allowBookmarks: true) { ' +
          EVENT_FIELDS +
          ' } } ' +
          INSTANCE_FIELDS,
        variables: { o: state.org, id: d.id, after: cursor || null },
      },
      {
        next: function (result) {
          if (state.detail !== d || !result.data) {
            return;
          }
          var ev = result.data.instanceEvents;
          cursor = ev.cursor;
          if (!ev.instance) {
            return; // SYNCED or BOOKMARK: only a cursor
          }
          if (ev.kind !== 'SNAPSHOT') {
            d.events.push(ev);
          }
          d.instance = ev.instance;
          renderDetail();
        },
        error: function (errors) {
          if (state.detail !== d) {
            return;
          }
          d.error = 'history stopped: ' + errorText(errors);
          renderDetail();
          if (errorCode(errors) !== 'UNAUTHENTICATED') {
            window.setTimeout(function () {
              if (state.detail === d) {
                d.error = '';
                followDetail(d, cursor);
              }
            }, 2000);
          }
        },
        complete: function () {},
      }
    );
  }

  function dl(pairs) {
    var list = el('dl');
    pairs.forEach(function (p) {
      list.appendChild(el('dt', { text: p[0] }));
      list.appendChild(el('dd', { 'data-key': p[0], text: p[1] === null || p[1] === undefined || p[1] === '' ? '—' : String(p[1]) }));
    });
    return list;
  }

  function renderDetail() {
    var d = state.detail;
    var box = $('detail');
    if (!d) {
      return;
    }
    var focused = document.activeElement && box.contains(document.activeElement) ? document.activeElement.id : '';
    // The terminal's input has no id: whether it had the keyboard is kept apart.
    var typing = d.terminal && d.terminal.term && d.terminal.node.contains(document.activeElement);
    clear(box);
    var inst = d.instance;
    box.appendChild(
      el('div', { class: 'detail-head' }, el('h2', { text: inst ? inst.name : d.id }), el('a', { href: '#/', text: 'Close' }))
    );
    if (d.error) {
      box.appendChild(el('p', { class: 'error', role: 'alert', text: d.error }));
    }
    if (!inst) {
      return;
    }
    var s = inst.status;
    box.appendChild(el('div', { class: 'actions' }, actions(inst)));
    box.appendChild(
      el(
        'div',
        { class: 'columns' },
        dl([
          ['ID', inst.id],
          ['Organization', inst.organizationId],
          ['Project', inst.projectId],
          ['Region', inst.region && inst.region.id],
          ['Network', inst.networkId],
          ['Flavor', inst.flavorId],
          ['Image', inst.imageId],
          ['SSH CA', inst.sshCertificateAuthorityId],
          ['Security groups', inst.networking.securityGroupIds.join(', ')],
          ['Description', inst.description],
        ]),
        dl([
          ['Power', s.powerState],
          ['Desired power', inst.desiredPowerState],
          ['Provisioning', s.provisioningStatus],
          ['Health', s.healthStatus],
          ['Private IP', s.privateIP],
          ['Public IP', s.publicIP],
          ['MAC', s.macAddress],
          ['Generation', inst.observedGeneration + ' of ' + inst.generation + ' realised'],
          ['Created', when(inst.createdAt) + ' UTC by ' + inst.createdBy],
          ['Updated', when(inst.updatedAt) + ' UTC by ' + inst.updatedBy],
          ['Deletion requested', inst.deletedAt && when(inst.deletedAt) + ' UTC'],
          ['Deletion protection', inst.deletionProtection ? 'on' : 'off'],
          ['Lease', inst.expiresAt && inst.expiryAction + ' at ' + when(inst.expiresAt) + ' UTC, ' + timeLeft(inst.expiresAt)],
          ['SSH keys', keyNames(inst.sshPublicKeys)],
        ])
      )
    );
    if (s.conditions.length) {
      box.appendChild(el('h3', { text: 'Conditions' }));
      box.appendChild(
        table(
          ['Type', 'Status', 'Reason', 'Message', 'Since (UTC)'],
          s.conditions.map(function (c) {
            return [c.type, c.status, c.reason, c.message, when(c.lastTransitionTime)];
          })
        )
      );
    }
    if (!inst.deletedAt) {
      box.appendChild(resizeForm(d, inst));
      box.appendChild(editForm(d, inst));
      box.appendChild(terminalView(d, inst));
      box.appendChild(consoleView(d, inst));
    }
    box.appendChild(el('h3', { text: 'History' }));
    var rows = d.events
      .slice()
      .reverse()
      .map(function (ev) {
        var what = ev.kind;
        if (ev.action) {
          what += ' ' + ev.action + (ev.outcome ? ' (' + ev.outcome + ')' : '');
        }
        var st = ev.instance.status;
        return [
          when(ev.occurredAt),
          what,
          ev.changedFields.join(', '),
          st.powerState + ' / ' + st.provisioningStatus,
          ev.actor || 'system',
          ev.message || '',
        ];
      });
    var history = table(['When (UTC)', 'What', 'Changed', 'Power / provisioning after', 'By', 'Message'], rows);
    history.id = 'history';
    box.appendChild(history);
    if (typing && d.terminal && d.terminal.term) {
      d.terminal.term.focus();
    } else if (focused && $(focused)) {
      $(focused).focus();
    }
  }

  // keyNames lists SSH public keys by their type and comment, as ssh-add -l does.
  function keyNames(keys) {
    return (keys || [])
      .map(function (k) {
        var parts = k.split(/\s+/);
        var at = parts.findIndex(function (p) {
          return /^(ssh-|ecdsa-|sk-)/.test(p);
        });
        return at < 0 ? k : parts[at] + (parts[at + 2] ? ' ' + parts.slice(at + 2).join(' ') : '');
      })
      .join(', ');
  }

  // resizeForm changes the flavor keeping the server. It first asks for a dry run and shows
  // its plan (the quota it takes, whether the server restarts); the resize itself needs a
  // second click, which gives the consent to restart when the plan says so.
  function resizeForm(d, inst) {
    if (!d.resize || d.resize.id !== inst.id) {
      d.resize = { id: inst.id, flavorId: '', plan: null, errors: [] };
    }
    var r = d.resize;
    var form = el('form', { id: 'resize', novalidate: true }, el('h3', { text: 'Resize (keeps the disk, IP and MAC addresses)' }));
    var flavor = el('select', { id: 'r-flavor' });
    form.appendChild(el('div', { class: 'grid' }, el('div', { class: 'field', 'data-field': 'flavorId' }, el('label', { for: 'r-flavor', text: 'New flavor' }), flavor)));
    var list = el('ul', { class: 'error' });
    form.appendChild(list);
    catalog(inst.region ? inst.region.id : '').then(function (cat) {
      var disk = null;
      cat.flavors.forEach(function (f) {
        if (f.id === inst.flavorId) {
          disk = f.diskGB;
        }
      });
      // Only flavors whose disk is at least as large: a disk never shrinks.
      options(
        flavor,
        flavorItems(cat.flavors.filter(function (f) {
          return f.id !== inst.flavorId && (disk === null || f.diskGB >= disk);
        })),
        r.flavorId
      );
      r.flavorId = flavor.value;
    });
    flavor.addEventListener('change', function () {
      r.flavorId = flavor.value;
      r.plan = null;
      renderDetail();
    });
    showFieldErrors(form, list, r.errors);
    var buttons = el('div', { class: 'buttons' });
    if (r.plan) {
      var quota = r.plan.quotaChanges
        .map(function (q) {
          return q.kind + ' ' + (q.delta > 0 ? '+' : '') + q.delta;
        })
        .join(', ');
      var text = 'Resizing to ' + r.flavorId + (quota ? ' changes the quota used: ' + quota + '.' : '.');
      if (r.plan.restart) {
        text += ' The server is stopped, resized and started again.';
      }
      buttons.appendChild(el('p', { class: r.plan.restart ? 'warning' : '', id: 'resize-plan', text: text }));
      buttons.appendChild(
        el('button', {
          type: 'button',
          id: 'resize-confirm',
          class: r.plan.restart ? 'danger' : '',
          text: r.plan.restart ? 'Resize and restart' : 'Resize',
          onclick: function () {
            resize(d, inst, false);
          },
        })
      );
      buttons.appendChild(
        el('button', {
          type: 'button',
          text: 'Cancel',
          onclick: function () {
            d.resize = null;
            renderDetail();
          },
        })
      );
    } else {
      buttons.appendChild(el('button', { type: 'submit', id: 'resize-check', text: 'Resize…' }));
    }
    form.appendChild(buttons);
    form.addEventListener('submit', function (ev) {
      ev.preventDefault();
      resize(d, inst, true);
    });
    return form;
  }

  // resize runs the dry run (check) or the resize the plan described; the restart it needs
  // is consented to only once the plan said so.
  function resize(d, inst, check) {
    var r = d.resize;
    var input = { id: inst.id, flavorId: r.flavorId, allowRestart: check || (r.plan && r.plan.restart) };
    if (check) {
      input.dryRun = true;
    }
    gql(
      'mutation($in: ResizeInstanceInput!) { resizeInstance(input: $in) { instance { id } userErrors { field code message } ' +
        'plan { restart quotaChanges { kind delta } } } }',
      { in: input }
    )
      .then(function (data) {
        if (state.detail !== d) {
          return;
        }
        var res = data.resizeInstance;
        r.errors = res.userErrors;
        r.plan = res.userErrors.length ? null : res.plan;
        if (!check && !res.userErrors.length) {
          d.resize = null;
        }
        renderDetail();
      })
      .catch(function (err) {
        r.errors = [{ field: null, code: errorCode(err.errors), message: err.message }];
        renderDetail();
      });
  }

  // terminalView is the server's serial console, live, in a terminal (xterm.js): a console
  // session the API opens for this page, whose URL is a WebSocket that carries the guest's
  // output one way and the keys typed the other. The terminal's element is kept across the
  // detail's redraws (every event redraws it), so what it shows and its connection survive
  // them.
  function terminalView(d, inst) {
    var box = el('section', { id: 'terminal' }, el('h3', { text: 'Serial console' }));
    var t = d.terminal;
    if (!t) {
      box.appendChild(
        el('button', {
          type: 'button',
          id: 'terminal-open',
          text: 'Open the serial console',
          onclick: function () {
            openTerminal(d, inst.id);
          },
        })
      );
      return box;
    }
    box.appendChild(
      el(
        'div',
        { class: 'buttons' },
        el('span', { id: 'terminal-status', class: 'small', text: t.status }),
        ' ',
        el('button', {
          type: 'button',
          id: 'terminal-close',
          text: t.open ? 'Close the console' : 'Dismiss',
          onclick: function () {
            t.close();
            d.terminal = null;
            renderDetail();
          },
        })
      )
    );
    box.appendChild(t.node);
    return box;
  }

  function openTerminal(d, id) {
    var t = { node: el('div', { id: 'terminal-screen' }), status: 'Opening a console session…', open: true, ws: null, term: null };
    t.close = function () {
      t.open = false;
      if (t.ws) {
        t.ws.close(1000);
      }
      if (t.term) {
        t.term.dispose();
        t.term = null;
      }
    };
    d.terminal = t;
    renderDetail();
    function say(status) {
      t.status = status;
      if (state.detail === d && d.terminal === t) {
        renderDetail();
      }
    }
    gql(
      'mutation($id: ID!) { createConsoleSession(input: {id: $id}) { consoleSession { url expiresAt } userErrors { code message } } }',
      { id: id }
    )
      .then(function (data) {
        var p = data.createConsoleSession;
        if (!t.open) {
          return;
        }
        if (!p.consoleSession) {
          t.open = false;
          say('No console: ' + p.userErrors.map(function (e) { return e.message; }).join('; '));
          return;
        }
        var term = new window.Terminal({ cols: 100, rows: 24, convertEol: false, cursorBlink: true, scrollback: 2000 });
        term.open(t.node);
        t.term = term;
        var ws = new WebSocket(p.consoleSession.url);
        ws.binaryType = 'arraybuffer';
        t.ws = ws;
        ws.onopen = function () {
          say('Connected until ' + when(p.consoleSession.expiresAt) + ' UTC');
          // The terminal draws only while it is on screen.
          t.node.scrollIntoView({ block: 'nearest' });
          term.focus();
        };
        ws.onmessage = function (e) {
          if (t.term) {
            term.write(new Uint8Array(e.data));
          }
        };
        // A paste arrives as one string; the console takes at most 4 KiB a message, so it
        // goes in pieces of at most 1,024 UTF-16 units (4 KiB of UTF-8 at most), never
        // between the two halves of a surrogate pair.
        term.onData(function (keys) {
          for (var i = 0; i < keys.length && ws.readyState === WebSocket.OPEN; ) {
            var end = Math.min(i + 1024, keys.length);
            if (end < keys.length && /[\uD800-\uDBFF]/.test(keys.charAt(end - 1))) {
              end--;
            }
            ws.send(keys.slice(i, end));
            i = end;
          }
        });
        ws.onclose = function (e) {
          t.open = false;
          if (t.term) {
            term.write('\r\n[console closed' + (e.reason ? ': ' + e.reason : '') + ']\r\n');
          }
          say('Closed' + (e.reason ? ': ' + e.reason : ''));
        };
      })
      .catch(function (err) {
        t.open = false;
        say('No console: ' + err.message);
      });
  }

  // consoleView shows the end of the server's serial console (its boot log) when asked:
  // reading it is not free for the region, so it is read on a click, not on every event.
  function consoleView(d, inst) {
    var box = el('section', { id: 'console' }, el('h3', { text: 'Console output' }));
    box.appendChild(
      el('button', {
        type: 'button',
        id: 'console-read',
        text: d.console ? 'Refresh' : 'Show the console output',
        onclick: function () {
          gql('query($id: ID!) { instanceConsoleOutput(id: $id, tailBytes: 16384) { text truncated capturedAt } }', { id: inst.id })
            .then(function (data) {
              if (state.detail === d) {
                d.console = data.instanceConsoleOutput;
                renderDetail();
              }
            })
            .catch(function (err) {
              if (state.detail === d) {
                d.console = { text: '', error: err.message };
                renderDetail();
              }
            });
        },
      })
    );
    if (d.console && d.console.error) {
      box.appendChild(el('p', { class: 'error', role: 'alert', text: d.console.error }));
    } else if (d.console) {
      box.appendChild(
        el('p', {
          class: 'small',
          text: 'Captured ' + when(d.console.capturedAt) + ' UTC' + (d.console.truncated ? '; the last 16 KiB' : ''),
        })
      );
      box.appendChild(el('pre', { id: 'console-output', text: d.console.text }));
    }
    return box;
  }

  // when shows an RFC 3339 time to the millisecond, in UTC like every time the API returns.
  // timeLeft says how long until t, as of the page's last redraw (every event redraws it).
  function timeLeft(t) {
    var s = Math.round((new Date(t) - Date.now()) / 1000);
    if (isNaN(s) || s <= 0) {
      return 'ending now';
    }
    var d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
    return (d ? d + ' d ' : '') + (d || h ? h + ' h ' : '') + (d ? '' : m + ' min ') + 'left';
  }

  function when(t) {
    var d = new Date(t);
    return isNaN(d) ? t : d.toISOString().replace('T', ' ').replace('Z', '');
  }

  function table(head, rows) {
    var t = el('table', { class: 'small' }, el('thead', {}, el.apply(null, ['tr', {}].concat(head.map(function (h) {
      return el('th', { text: h });
    })))));
    var body = el('tbody');
    rows.forEach(function (r) {
      body.appendChild(el.apply(null, ['tr', {}].concat(r.map(function (c) {
        return el('td', { text: c });
      }))));
    });
    t.appendChild(body);
    return t;
  }

  // editForm changes the flavor or image. Either rebuilds the server, which the API refuses
  // without consent: the refusal is shown with a button that gives it (allowRebuild), for the
  // same generation the user was looking at, so a change made meanwhile is not overwritten.
  function editForm(d, inst) {
    if (!d.edit || d.edit.id !== inst.id) {
      d.edit = { id: inst.id, flavorId: inst.flavorId, imageId: inst.imageId, generation: inst.generation, errors: [], confirm: null };
    }
    var e = d.edit;
    var form = el('form', { id: 'edit', novalidate: true }, el('h3', { text: 'Change flavor or image' }));
    var grid = el('div', { class: 'grid' });
    var flavor = el('select', { id: 'e-flavor' });
    var image = el('select', { id: 'e-image' });
    grid.appendChild(el('div', { class: 'field', 'data-field': 'flavorId' }, el('label', { for: 'e-flavor', text: 'Flavor' }), flavor));
    grid.appendChild(el('div', { class: 'field', 'data-field': 'imageId' }, el('label', { for: 'e-image', text: 'Image' }), image));
    form.appendChild(grid);
    var list = el('ul', { class: 'error' });
    form.appendChild(list);
    catalog(inst.region ? inst.region.id : '').then(function (cat) {
      options(flavor, flavorItems(cat.flavors), e.flavorId);
      options(image, imageItems(cat.images), e.imageId);
    });
    flavor.addEventListener('change', function () {
      e.flavorId = flavor.value;
      e.confirm = null;
    });
    image.addEventListener('change', function () {
      e.imageId = image.value;
      e.confirm = null;
    });
    showFieldErrors(form, list, e.errors);
    var buttons = el('div', { class: 'buttons' });
    if (e.confirm) {
      buttons.appendChild(el('p', { class: 'warning', id: 'rebuild-warning', text: e.confirm }));
      buttons.appendChild(
        el('button', {
          type: 'button',
          id: 'rebuild-confirm',
          class: 'danger',
          text: 'Rebuild the server',
          onclick: function () {
            update(d, inst, true);
          },
        })
      );
      buttons.appendChild(
        el('button', {
          type: 'button',
          text: 'Cancel',
          onclick: function () {
            d.edit = null;
            renderDetail();
          },
        })
      );
    } else {
      buttons.appendChild(el('button', { type: 'submit', id: 'edit-save', text: 'Save' }));
    }
    form.appendChild(buttons);
    form.addEventListener('submit', function (ev) {
      ev.preventDefault();
      update(d, inst, false);
    });
    return form;
  }

  function update(d, inst, allowRebuild) {
    var e = d.edit;
    var input = { id: inst.id, flavorId: e.flavorId, imageId: e.imageId, expectedGeneration: e.generation };
    if (allowRebuild) {
      input.allowRebuild = true;
    }
    gql(
      'mutation($in: UpdateInstanceInput!) { updateInstance(input: $in) { instance { ...I } userErrors { field code message } } } ' +
        INSTANCE_FIELDS,
      { in: input }
    )
      .then(function (data) {
        var r = data.updateInstance;
        if (state.detail !== d) {
          return;
        }
        var needConsent = r.userErrors.length > 0 && r.userErrors.every(function (u) {
          return u.code === 'UNPROCESSABLE' && u.message.indexOf('allowRebuild') >= 0;
        });
        if (needConsent && !allowRebuild) {
          e.errors = [];
          e.confirm = errorText(r.userErrors).replace(/; set allowRebuild: true to proceed/g, '') + '.';
        } else if (r.userErrors.length) {
          e.errors = r.userErrors;
          e.confirm = null;
        } else {
          d.edit = null;
        }
        renderDetail();
      })
      .catch(function (err) {
        e.errors = [{ field: null, code: errorCode(err.errors), message: err.message }];
        renderDetail();
      });
  }

  // --- wiring ----------------------------------------------------------------

  $('signin-form').addEventListener('submit', function (ev) {
    ev.preventDefault();
    signIn($('signin-token').value.trim());
  });
  $('signout').addEventListener('click', function () {
    signOut('');
  });
  $('org').addEventListener('change', function () {
    chooseOrg($('org').value, '');
  });
  $('project').addEventListener('change', function () {
    chooseProject($('project').value);
  });
  $('new-instance').addEventListener('click', openCreate);
  $('create-cancel').addEventListener('click', closeCreate);
  $('create').addEventListener('submit', submitCreate);
  $('c-project').addEventListener('change', createProjectChanged);
  $('c-network').addEventListener('change', createNetworkChanged);
  window.addEventListener('hashchange', route);

  takeTokenFromFragment();
  var saved = loadStored(TOKEN_KEY);
  if (saved) {
    signIn(saved).then(route);
  } else {
    signOut('');
  }
})();
