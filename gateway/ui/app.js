// sandgate review page: pending approvals (Approve/Reject for reviewers and admins), executions
// with filters, paging and a detail view under each row, sessions with their executions, and
// the audit chain. Every piece of data is put on the page as text, never as HTML.
'use strict';

(function (sg) {
  const { $, el, cell, api, errorText, say, when, whenCell, reasonsText } = sg;
  const REFRESH_MS = 2000;
  // Verifying walks the whole chain: not on every refresh.
  const CHAIN_EVERY_MS = 60000;
  let chainCheckedAt = 0;
  let me = null;
  // Paging: the `before` cursor of each page seen, the current one last (null: the newest).
  let cursors = [null];
  let nextBefore = null;
  // Open detail rows by key ("x:<execution id>", "s:<session id>"), kept across refreshes.
  const details = new Map();

  function canDecide() {
    return me && (me.role === 'reviewer' || me.role === 'admin');
  }

  function decisionText(decision) {
    if (!decision) return '';
    const lines = ['backend ' + decision.backend + ' (' + decision.runtime + '), image ' + decision.image];
    const l = decision.limits || {};
    lines.push('timeout ' + l.timeout_ms + ' ms, memory ' + l.memory_mb + ' MB, cpus ' + l.cpus +
      ', pids ' + l.pids + ', disk ' + l.disk_mb + ' MB');
    const grant = decision.network;
    if (grant && grant.allow) {
      lines.push('network: ' + grant.allow.map((h) => h.host + ':' + h.ports.join(',')).join(' '));
    } else {
      lines.push('network: none');
    }
    (decision.mounts || []).forEach((m) => lines.push('mount ' + m.target + ' (read-only)'));
    return lines.join('\n');
  }

  // A detail row under `row`, spanning the table; built by `build` (a promise of a node) on the
  // first click, removed by the second.
  function toggleDetail(row, key, build) {
    if (details.has(key)) {
      details.get(key).tr.remove();
      details.delete(key);
      return;
    }
    const tr = document.createElement('tr');
    tr.className = 'detail-row';
    tr.dataset.detailFor = key;
    const td = el('td', 'Loading...');
    td.colSpan = row.cells.length;
    tr.appendChild(td);
    row.after(tr);
    const entry = { tr: tr, version: null };
    details.set(key, entry);
    fill(entry, build);
  }

  async function fill(entry, build) {
    const node = await build();
    entry.tr.cells[0].replaceChildren(node);
  }

  // After a table is redrawn: puts each open detail back under its row, rebuilding it when
  // what it shows has changed (`version`).
  function reattach(row, key, version, build) {
    const entry = details.get(key);
    if (!entry) return;
    row.after(entry.tr);
    entry.tr.cells[0].colSpan = row.cells.length;
    if (entry.version !== null && entry.version !== version) fill(entry, build);
    entry.version = version;
  }

  // Pending approvals: rows are kept (and so is a comment being typed) while still pending.
  function renderApprovals(approvals) {
    const body = $('approvals').tBodies[0];
    const wanted = new Set(approvals.map((a) => a.id));
    Array.from(body.rows).forEach((row) => {
      if (!wanted.has(row.dataset.approvalId)) row.remove();
    });
    const present = new Set(Array.from(body.rows).map((row) => row.dataset.approvalId));
    approvals.forEach((approval) => {
      if (present.has(approval.id)) return;
      body.appendChild(approvalRow(approval));
    });
    $('approvals').hidden = approvals.length === 0;
    $('approvals').classList.toggle('view-only', !canDecide());
    $('approvals-note').hidden = approvals.length > 0 && canDecide();
    $('approvals-note').textContent = approvals.length === 0 ? 'No pending approvals.'
      : 'View only: ' + me.role + ' keys cannot approve or reject.';
  }

  function approvalRow(approval) {
    const row = document.createElement('tr');
    row.dataset.approvalId = approval.id;
    const session = approval.subject === 'session';
    row.dataset.executionId = approval.execution_id || '';
    const requested = whenCell(row, approval.created_at);
    requested.appendChild(el('div', session ? approval.session_id : approval.execution_id, 'muted'));
    const by = approval.requested_by || {};
    cell(row, (approval.tenant || '') + '\n' + (by.principal || '') + ' (' + (by.key_id || '') + ')');
    const request = approval.request || {};
    cell(row).appendChild(sg.labelChips(request.labels));
    cell(row, reasonsText(approval.reasons));
    cell(row).appendChild(el('pre', decisionText(approval.decision)));
    if (session) {
      // A session has no code yet: what was asked is the sandbox itself.
      cell(row).appendChild(sessionRequest(request));
      whenCell(row, approval.expires_at);
      if (canDecide()) row.appendChild(decideCell(approval));
      return row;
    }
    const files = (request.files || []).map((f) => f.path + ' (' + sg.bytes(f.bytes) + ')').join(', ');
    const code = cell(row);
    const preview = approval.code_preview || '';
    code.appendChild(el('pre', preview));
    const shown = new TextEncoder().encode(preview).length;
    if (request.code_bytes > shown) {
      code.appendChild(el('div', 'Preview truncated: ' + shown + ' of ' + request.code_bytes +
        ' bytes shown. Approving runs the whole program.', 'warn'));
    }
    code.appendChild(el('div', request.language + ', sha256 ' + request.code_sha256 +
      (files ? ', files: ' + files : ''), 'muted'));
    whenCell(row, approval.expires_at);
    if (canDecide()) row.appendChild(decideCell(approval));
    return row;
  }

  // A session approval's request where an execution's code would be: language, network,
  // mounts, limits and lifetimes; each of its executions is decided again when it is sent.
  function sessionRequest(request) {
    const box = el('div');
    box.appendChild(el('div', 'session (' + request.language + ')', 'warn'));
    const network = (request.network || []).map((d) => d.host + ':' + d.port).join(', ');
    const lines = [
      'network: ' + (network || 'none'),
      'mounts: ' + ((request.mounts || []).join(', ') || 'none'),
      'limits: ' + JSON.stringify(request.limits || {}),
      'idle timeout: ' + request.idle_timeout_s + ' s, lifetime: ' + request.ttl_s + ' s',
    ];
    box.appendChild(el('pre', lines.join('\n')));
    return box;
  }

  function decideCell(approval) {
    const actions = el('td', null, 'decide');
    const comment = el('input', null, 'comment');
    comment.type = 'text';
    comment.placeholder = 'comment';
    comment.maxLength = 1000;
    const approve = el('button', 'Approve', 'approve');
    const reject = el('button', 'Reject', 'reject');
    approve.type = 'button';
    reject.type = 'button';
    // One decision per click: both buttons stay disabled until the answer is in.
    const once = (decision) => async () => {
      approve.disabled = true;
      reject.disabled = true;
      try {
        await decide(approval.id, decision, comment.value);
      } finally {
        approve.disabled = false;
        reject.disabled = false;
      }
    };
    approve.addEventListener('click', once('approve'));
    reject.addEventListener('click', once('reject'));
    actions.append(comment, approve, reject);
    return actions;
  }

  async function decide(id, decision, comment) {
    const reply = await api('POST', '/v1/approvals/' + encodeURIComponent(id),
      { decision: decision, comment: comment });
    if (reply.status === 200) {
      const subject = reply.data.session
        ? 'session ' + reply.data.session.id + ' is ' + reply.data.session.status
        : 'execution ' + reply.data.execution.id + ' is ' + reply.data.execution.status;
      say('Approval ' + id + ': ' + reply.data.approval.status + '; ' + subject + '.');
    } else {
      say('Could not ' + decision + ' ' + id + ': ' + errorText(reply), true);
    }
    refresh();
  }

  function detailButton(row, id) {
    const show = el('button', 'Details', 'details');
    show.type = 'button';
    show.addEventListener('click', () => toggleDetail(row, 'x:' + id, () => sg.detail.render(id)));
    return show;
  }

  function executionRow(execution) {
    const row = document.createElement('tr');
    row.dataset.executionId = execution.id;
    cell(row, execution.id);
    whenCell(row, execution.created_at);
    cell(row, execution.tenant);
    cell(row, execution.language);
    cell(row).appendChild(sg.labelChips(execution.labels));
    cell(row, execution.status, 'status status-' + execution.status);
    const d = execution.decision || {};
    cell(row, (d.allow ? 'allow' : 'deny') + (d.backend ? ' on ' + d.backend : ''));
    cell(row, reasonsText(d.reasons));
    cell(row, execution.exit_code === null ? '' : execution.exit_code);
    cell(row).appendChild(detailButton(row, execution.id));
    return row;
  }

  function renderExecutions(body, executions) {
    body.replaceChildren();
    executions.forEach((execution) => {
      const row = executionRow(execution);
      body.appendChild(row);
      reattach(row, 'x:' + execution.id, execution.status,
        () => sg.detail.render(execution.id));
    });
  }

  function filterQuery() {
    const params = new URLSearchParams();
    params.set('limit', $('filter-limit').value);
    const tenant = $('filter-tenant').value.trim();
    const status = $('filter-status').value;
    const label = $('filter-label').value.trim();
    if (tenant) params.set('tenant', tenant);
    if (status) params.set('status', status);
    if (label) params.set('label', label);
    const before = cursors[cursors.length - 1];
    if (before) params.set('before', before);
    return params.toString();
  }

  async function loadExecutions() {
    const reply = await api('GET', '/v1/executions?' + filterQuery());
    if (reply.status !== 200) {
      say('Executions: ' + errorText(reply), true);
      return;
    }
    renderExecutions($('executions').tBodies[0], reply.data.executions);
    nextBefore = reply.data.next_before || null;
    $('older').disabled = !nextBefore;
    $('newer').disabled = cursors.length <= 1;
    const shown = reply.data.executions.length;
    $('page-info').textContent = 'page ' + cursors.length + ' (' + shown +
      (shown === 1 ? ' execution)' : ' executions)');
  }

  function sessionExecutions(id) {
    return async () => {
      const reply = await api('GET', '/v1/executions?limit=100&session=' + encodeURIComponent(id));
      if (reply.status !== 200) return el('p', errorText(reply), 'error');
      const list = reply.data.executions;
      if (list.length === 0) return el('p', 'No executions in this session yet.', 'muted');
      const t = el('table', null, 'session-executions');
      const head = t.createTHead().insertRow();
      ['Execution', 'Created', 'Tenant', 'Language', 'Labels', 'Status', 'Decision', 'Reasons', 'Exit', '']
        .forEach((h) => head.appendChild(el('th', h)));
      renderExecutions(t.createTBody(), list.slice().reverse());
      return t;
    };
  }

  function sessionRow(session) {
    const row = document.createElement('tr');
    row.dataset.sessionId = session.id;
    cell(row, session.id);
    whenCell(row, session.created_at);
    cell(row, session.tenant);
    cell(row, session.language);
    cell(row, session.status + (session.closed_reason ? ' (' + session.closed_reason + ')' : ''),
      'status status-' + session.status);
    cell(row, session.executions);
    whenCell(row, session.last_used_at);
    whenCell(row, session.status === 'closed' ? session.closed_at : session.expires_at);
    const show = el('button', 'Executions', 'session-executions');
    show.type = 'button';
    show.addEventListener('click', () => toggleDetail(row, 's:' + session.id, sessionExecutions(session.id)));
    cell(row).appendChild(show);
    return row;
  }

  async function loadSessions() {
    const reply = await api('GET', '/v1/sessions');
    if (reply.status !== 200) {
      say('Sessions: ' + errorText(reply), true);
      return;
    }
    const body = $('sessions').tBodies[0];
    body.replaceChildren();
    const sessions = reply.data.sessions.slice(0, 50);
    sessions.forEach((session) => {
      const row = sessionRow(session);
      body.appendChild(row);
      reattach(row, 's:' + session.id, session.executions + session.status,
        sessionExecutions(session.id));
    });
    $('sessions-empty').hidden = sessions.length > 0;
  }

  async function refreshChain() {
    chainCheckedAt = Date.now();
    const chain = $('chain');
    const reply = await api('GET', '/v1/audit/verify');
    if (reply.status === 403) {
      chain.textContent = 'not permitted (auditor or admin keys only)';
      chain.className = 'muted';
    } else if (reply.status === 200 && !reply.data.broken) {
      chain.textContent = 'ok: ' + reply.data.events + ' events, head ' + reply.data.head;
      chain.className = 'chain-ok';
    } else if (reply.status === 200) {
      const b = reply.data.broken;
      chain.textContent = 'BROKEN at event ' + b.seq + ' (' + b.id + '): ' + b.problem;
      chain.className = 'chain-broken';
    } else {
      chain.textContent = errorText(reply);
      chain.className = 'chain-broken';
    }
  }

  // Every pending approval, page by page (the listing is paged, newest first), so a flood of
  // new requests cannot push an older one off the page. At most PENDING_PAGES pages.
  const PENDING_PAGES = 20;
  async function pendingApprovals() {
    let all = [];
    let path = '/v1/approvals?status=pending&limit=500';
    for (let page = 0; page < PENDING_PAGES; page++) {
      const reply = await api('GET', path);
      if (reply.status !== 200) return reply;
      all = all.concat(reply.data.approvals);
      if (!reply.data.next_before) break;
      path = '/v1/approvals?status=pending&limit=500&before=' +
        encodeURIComponent(reply.data.next_before);
    }
    return { status: 200, data: { approvals: all } };
  }

  async function identify() {
    const found = await sg.whoami();
    if (found.error) {
      me = null;
      say('This key is refused: ' + errorText(found.error), true);
      return false;
    }
    me = found.me;
    $('whoami').textContent = 'Signed in as ' + me.principal + ' (' + me.role + ', tenant ' + me.tenant + ')';
    document.body.dataset.role = me.role;
    return true;
  }

  let busy = false;
  async function refresh() {
    if (!sg.key() || busy) return;
    busy = true;
    try {
      if (!me && !(await identify())) return;
      const approvals = await pendingApprovals();
      if (approvals.status === 200) {
        renderApprovals(approvals.data.approvals);
      } else {
        $('approvals-note').textContent = 'Approvals: ' + errorText(approvals);
      }
      await loadExecutions();
      await loadSessions();
      if (Date.now() - chainCheckedAt >= CHAIN_EVERY_MS) await refreshChain();
    } catch (err) {
      say('The gateway did not answer: ' + err, true);
    } finally {
      busy = false;
    }
  }

  function forget() {
    sg.setKey('');
    me = null;
    details.clear();
    ['approvals', 'executions', 'sessions'].forEach((id) => $(id).tBodies[0].replaceChildren());
    $('approvals').hidden = true;
    $('approvals-note').hidden = false;
    $('approvals-note').textContent = 'Paste a key to see the pending approvals.';
    $('whoami').textContent = '';
    $('chain').textContent = 'unknown';
    say('Key forgotten.');
  }

  function wire() {
    $('key-form').addEventListener('submit', (event) => {
      event.preventDefault();
      const value = $('key').value.trim();
      $('key').value = '';
      if (!value) return;
      sg.setKey(value);
      me = null;
      chainCheckedAt = 0;
      say('Key set for this tab.');
      refresh();
    });
    $('verify-chain').addEventListener('click', () => {
      if (sg.key()) refreshChain();
    });
    $('forget-key').addEventListener('click', forget);
    $('filters').addEventListener('submit', (event) => {
      event.preventDefault();
      cursors = [null];
      refresh();
    });
    $('filter-limit').addEventListener('change', () => {
      cursors = [null];
      refresh();
    });
    $('clear-filters').addEventListener('click', () => {
      $('filters').reset();
      cursors = [null];
      refresh();
    });
    $('older').addEventListener('click', () => {
      if (!nextBefore) return;
      cursors.push(nextBefore);
      refresh();
    });
    $('newer').addEventListener('click', () => {
      if (cursors.length > 1) cursors.pop();
      refresh();
    });
  }

  document.addEventListener('DOMContentLoaded', () => {
    wire();
    if (sg.key()) say('Using the key set earlier in this tab.');
    refresh();
    setInterval(refresh, REFRESH_MS);
  });
})(window.sandgate);
