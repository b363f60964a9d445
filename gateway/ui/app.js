// sandgate review page. Every piece of data is put on the page with textContent, never as HTML.
'use strict';

(function () {
  const KEY = 'sandgate.key';
  const REFRESH_MS = 2000;
  // Verifying walks the whole chain: not on every refresh.
  const CHAIN_EVERY_MS = 60000;
  let chainCheckedAt = 0;
  const $ = (id) => document.getElementById(id);

  function key() {
    return sessionStorage.getItem(KEY) || '';
  }

  async function api(method, path, body) {
    const init = { method: method, headers: { Authorization: 'Bearer ' + key() } };
    if (body !== undefined) {
      init.headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    const response = await fetch(path, init);
    let data = null;
    try {
      data = await response.json();
    } catch (_) {
      data = null;
    }
    return { status: response.status, data: data };
  }

  function el(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (className) node.className = className;
    return node;
  }

  function cell(row, text, className) {
    const td = el('td', text, className);
    row.appendChild(td);
    return td;
  }

  function errorText(reply) {
    const error = reply.data && reply.data.error;
    return error ? error.code + ': ' + error.message : 'HTTP ' + reply.status;
  }

  function say(text, isError) {
    const message = $('message');
    message.textContent = text;
    message.className = isError ? 'error' : '';
  }

  function reasonsText(reasons) {
    return (reasons || []).map((r) => r.code + ': ' + r.message).join('\n');
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
    $('approvals-empty').hidden = approvals.length > 0;
  }

  function approvalRow(approval) {
    const row = document.createElement('tr');
    row.dataset.approvalId = approval.id;
    row.dataset.executionId = approval.execution_id;
    cell(row, approval.created_at + '\n' + approval.execution_id);
    const by = approval.requested_by || {};
    cell(row, (approval.tenant || '') + '\n' + (by.principal || '') + ' (' + (by.key_id || '') + ')');
    cell(row, reasonsText(approval.reasons));
    cell(row).appendChild(el('pre', decisionText(approval.decision)));
    const request = approval.request || {};
    const files = (request.files || []).map((f) => f.path + ' (' + f.bytes + ' B)').join(', ');
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
    cell(row, approval.expires_at);
    const actions = cell(row);
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
    return row;
  }

  async function decide(id, decision, comment) {
    const reply = await api('POST', '/v1/approvals/' + encodeURIComponent(id),
      { decision: decision, comment: comment });
    if (reply.status === 200) {
      say('Approval ' + id + ': ' + reply.data.approval.status + '; execution ' +
        reply.data.execution.id + ' is ' + reply.data.execution.status + '.');
    } else {
      say('Could not ' + decision + ' ' + id + ': ' + errorText(reply), true);
    }
    refresh();
  }

  function renderExecutions(executions) {
    const body = $('executions').tBodies[0];
    body.replaceChildren();
    executions.forEach((execution) => {
      const row = document.createElement('tr');
      row.dataset.executionId = execution.id;
      cell(row, execution.id);
      cell(row, execution.created_at);
      cell(row, execution.tenant);
      cell(row, execution.language);
      cell(row, execution.status, 'status status-' + execution.status);
      const d = execution.decision || {};
      cell(row, (d.allow ? 'allow' : 'deny') + (d.backend ? ' on ' + d.backend : ''));
      cell(row, reasonsText(d.reasons));
      cell(row, execution.exit_code === null ? '' : execution.exit_code);
      const show = el('button', 'Connections', 'connections');
      show.type = 'button';
      show.addEventListener('click', () => loadConnections(execution.id));
      cell(row).appendChild(show);
      body.appendChild(row);
    });
  }

  async function loadConnections(id) {
    const reply = await api('GET', '/v1/executions/' + encodeURIComponent(id) + '/connections');
    const body = $('connections').tBodies[0];
    body.replaceChildren();
    $('connections-for').textContent = 'of ' + id;
    if (reply.status !== 200) {
      say('Connections of ' + id + ': ' + errorText(reply), true);
      return;
    }
    const connections = reply.data.connections || [];
    if (connections.length === 0) $('connections-for').textContent = 'of ' + id + ': none';
    connections.forEach((c) => {
      const row = document.createElement('tr');
      cell(row, c.opened_at);
      cell(row, c.host);
      cell(row, c.port);
      cell(row, c.scheme);
      cell(row, c.allow ? 'yes' : 'no');
      cell(row, c.reason + (c.message ? ': ' + c.message : ''));
      cell(row, (c.bytes_up || 0) + ' / ' + (c.bytes_down || 0));
      body.appendChild(row);
    });
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

  let busy = false;
  async function refresh() {
    if (!key() || busy) return;
    busy = true;
    try {
      const approvals = await pendingApprovals();
      if (approvals.status === 200) {
        renderApprovals(approvals.data.approvals);
      } else {
        say('Approvals: ' + errorText(approvals), true);
      }
      const executions = await api('GET', '/v1/executions?limit=50');
      if (executions.status === 200) renderExecutions(executions.data.executions);
      if (Date.now() - chainCheckedAt >= CHAIN_EVERY_MS) await refreshChain();
    } catch (err) {
      say('The gateway did not answer: ' + err, true);
    } finally {
      busy = false;
    }
  }

  document.addEventListener('DOMContentLoaded', () => {
    $('key-form').addEventListener('submit', (event) => {
      event.preventDefault();
      const value = $('key').value.trim();
      $('key').value = '';
      if (!value) return;
      sessionStorage.setItem(KEY, value);
      chainCheckedAt = 0;
      say('Key set for this tab.');
      refresh();
    });
    $('verify-chain').addEventListener('click', () => {
      if (key()) refreshChain();
    });
    $('forget-key').addEventListener('click', () => {
      sessionStorage.removeItem(KEY);
      $('approvals').tBodies[0].replaceChildren();
      $('executions').tBodies[0].replaceChildren();
      $('chain').textContent = 'unknown';
      say('Key forgotten.');
    });
    if (key()) say('Using the key set earlier in this tab.');
    refresh();
    setInterval(refresh, REFRESH_MS);
  });
})();
