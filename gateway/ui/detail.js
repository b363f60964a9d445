// The detail view of one execution: decision, reasons, limits, grant, files, outputs (with
// download links), output text, connections, egress requests and audit events. Built from
// GET /v1/executions/{id}, /connections and (auditor, admin) /v1/audit/events?execution_id=.
'use strict';

(function (sg) {
  const { el, api, errorText, when, bytes, duration, table } = sg;

  function section(title) {
    const box = el('div', null, 'detail-part');
    box.appendChild(el('h3', title));
    return box;
  }

  function facts(pairs) {
    const list = el('dl', null, 'facts');
    pairs.forEach(([name, value]) => {
      if (value === undefined || value === null || value === '') return;
      list.appendChild(el('dt', name));
      const dd = el('dd');
      if (value instanceof Node) dd.appendChild(value);
      else dd.textContent = String(value);
      list.appendChild(dd);
    });
    return list;
  }

  function summary(x) {
    const part = section('Execution ' + x.id);
    part.appendChild(facts([
      ['status', x.status],
      ['tenant', x.tenant],
      ['language', x.language],
      ['labels', sg.labelChips(x.labels)],
      ['created', when(x.created_at)],
      ['started', x.started_at ? when(x.started_at) : null],
      ['finished', x.finished_at ? when(x.finished_at) : null],
      ['duration', duration(x.duration_ms)],
      ['exit code', x.exit_code],
      ['start', x.start],
      ['container', x.container],
      ['session', x.session_id],
      ['result', x.result],
      ['error', x.error],
    ]));
    return part;
  }

  function decision(x) {
    const d = x.decision || {};
    const part = section('Decision');
    part.appendChild(facts([
      ['outcome', d.allow ? 'allow' : 'deny'],
      ['backend', d.backend],
      ['decision id', d.id],
      ['policy revision', d.policy_revision],
    ]));
    if ((x.status === 'denied' || x.status === 'pending_approval') && sg.proposals) {
      const propose = el('button', 'Propose a change');
      propose.type = 'button';
      propose.className = 'propose';
      propose.addEventListener('click', () => sg.proposals.proposeFrom(x.id));
      part.appendChild(propose);
    }
    const reasons = d.reasons || [];
    if (reasons.length === 0) part.appendChild(el('p', 'No reasons given.', 'muted'));
    else part.appendChild(table(['Reason', 'Message'], reasons, (r) => [r.code, r.message], 'reasons'));
    return part;
  }

  function limits(x) {
    const part = section('Limits');
    const l = x.limits;
    if (!l) {
      part.appendChild(el('p', 'None (nothing ran).', 'muted'));
      return part;
    }
    part.appendChild(facts([
      ['timeout', duration(l.timeout_ms)],
      ['memory', l.memory_mb + ' MB'],
      ['cpus', l.cpus],
      ['pids', l.pids],
      ['disk', l.disk_mb + ' MB'],
      ['output', bytes(l.output_bytes)],
    ]));
    return part;
  }

  function grant(x) {
    const part = section('Grant');
    const g = x.grant || {};
    const network = g.network && g.network.allow ? g.network.allow : [];
    if (network.length === 0) part.appendChild(el('p', 'network: none', 'muted'));
    else {
      part.appendChild(table(['Host', 'Ports', 'Inspect', 'Credentials'], network, (h) => [
        h.host, (h.ports || []).join(', '), h.inspect ? 'yes' : 'no', (h.credentials || []).join(', '),
      ], 'grant'));
      part.appendChild(facts([
        ['max connections', g.network.max_connections],
        ['max bytes', bytes(g.network.max_bytes)],
      ]));
    }
    (g.mounts || []).forEach((m) => {
      part.appendChild(el('p', 'mount ' + (m.dataset || '') + ' at ' + m.target +
        (m.read_only === false ? ' (writable)' : ' (read-only)')));
    });
    return part;
  }

  function files(x) {
    const part = section('Files in');
    const list = x.files || [];
    if (list.length === 0) part.appendChild(el('p', 'No files uploaded.', 'muted'));
    else part.appendChild(table(['Path', 'Size'], list, (f) => [f.path, bytes(f.bytes)], 'files'));
    return part;
  }

  // The download goes through fetch with the key (a plain link could not carry it), then is
  // handed to the browser as a file.
  async function download(id, path) {
    const response = await fetch('/v1/executions/' + encodeURIComponent(id) + '/outputs/' +
      path.split('/').map(encodeURIComponent).join('/'),
      { headers: { Authorization: 'Bearer ' + sg.key() } });
    if (!response.ok) {
      sg.say('Download of ' + path + ': HTTP ' + response.status, true);
      return;
    }
    const url = URL.createObjectURL(await response.blob());
    const link = el('a');
    link.href = url;
    link.download = path.split('/').pop();
    document.body.appendChild(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }

  function outputs(x) {
    const part = section('Outputs');
    const list = x.outputs || [];
    if (list.length === 0) part.appendChild(el('p', 'No output files.', 'muted'));
    else {
      part.appendChild(table(['File', 'Size', 'sha256'], list, (o) => {
        const link = el('a', o.path, 'download');
        link.href = '#';
        link.dataset.path = o.path;
        link.addEventListener('click', (event) => {
          event.preventDefault();
          download(x.id, o.path);
        });
        return [link, bytes(o.bytes), o.sha256];
      }, 'outputs'));
    }
    (x.outputs_skipped || []).forEach((s) => {
      part.appendChild(el('p', 'not collected: ' + s.path + ' (' + s.reason + ')', 'warn'));
    });
    if (x.outputs_truncated) part.appendChild(el('p', 'The output limit stopped collection.', 'warn'));
    ['stdout', 'stderr'].forEach((stream) => {
      if (!x[stream]) return;
      part.appendChild(el('h4', stream + (x[stream + '_truncated'] ? ' (truncated)' : '')));
      part.appendChild(el('pre', x[stream], 'stream'));
    });
    return part;
  }

  function connections(reply) {
    const part = section('Connections');
    if (reply.status !== 200) {
      part.appendChild(el('p', errorText(reply), 'error'));
      return [part];
    }
    const list = reply.data.connections || [];
    if (list.length === 0) part.appendChild(el('p', 'No egress attempts.', 'muted'));
    else {
      part.appendChild(table(['Opened', 'Host', 'Port', 'Scheme', 'Allowed', 'Reason', 'Bytes up / down'],
        list, (c) => [when(c.opened_at), c.host, c.port, c.scheme, c.allow ? 'yes' : 'no',
          c.reason + (c.message ? ': ' + c.message : ''),
          bytes(c.bytes_up || 0) + ' / ' + bytes(c.bytes_down || 0)], 'connections'));
    }
    const requests = section('Egress requests');
    const rows = reply.data.requests || [];
    if (rows.length === 0) requests.appendChild(el('p', 'No requests inside inspected tunnels.', 'muted'));
    else {
      requests.appendChild(table(['Started', 'Method', 'Host', 'Path', 'Status', 'Allowed', 'Reason', 'Credentials'],
        rows, (r) => [when(r.started_at), r.method, r.host + ':' + r.port, r.path, r.status_code,
          r.allow ? 'yes' : 'no', r.reason, (r.credentials || []).join(', ')], 'requests'));
    }
    return [part, requests];
  }

  function events(reply) {
    const part = section('Audit events');
    if (reply.status === 403) {
      part.appendChild(el('p', 'not permitted (auditor or admin keys only)', 'muted'));
    } else if (reply.status !== 200) {
      part.appendChild(el('p', errorText(reply), 'error'));
    } else {
      const list = (reply.data.events || []).slice().reverse();
      part.appendChild(table(['#', 'At', 'Kind', 'Allow', 'Reasons', 'Policy revision'], list,
        (e) => [e.seq, when(e.at), e.kind, e.allow === null ? '' : (e.allow ? 'yes' : 'no'),
          sg.reasonsText(e.reasons), e.policy_revision], 'events'));
    }
    return part;
  }

  // The whole view of execution `id`, as one element.
  async function render(id) {
    const box = el('div', null, 'detail');
    box.dataset.executionId = id;
    const path = '/v1/executions/' + encodeURIComponent(id);
    const [record, conns, audit] = await Promise.all([
      api('GET', path),
      api('GET', path + '/connections'),
      api('GET', '/v1/audit/events?limit=200&execution_id=' + encodeURIComponent(id)),
    ]);
    if (record.status !== 200) {
      box.appendChild(el('p', 'Execution ' + id + ': ' + errorText(record), 'error'));
      return box;
    }
    const x = record.data;
    const grid = el('div', null, 'detail-grid');
    [summary(x), decision(x), limits(x), grant(x), files(x), outputs(x)]
      .forEach((part) => grid.appendChild(part));
    box.appendChild(grid);
    connections(conns).forEach((part) => box.appendChild(part));
    box.appendChild(events(audit));
    return box;
  }

  sg.detail = { render: render };
})(window.sandgate);
