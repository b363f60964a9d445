// The Proposals view: open policy proposals (GET /v1/policy/proposals?status=open), one at a
// time in detail: its patch and patched files (the diff of the data), its tests, its replay
// impact with the example executions (each opens that execution's detail), and approve /
// reject with a comment. Every control is a button or a text field: keyboard-usable. An
// execution's detail view offers "Propose a change" (POST {"from_execution"}) for a denied or
// held one.
'use strict';

(function (sg) {
  const { $, el, api, errorText, when, table, say } = sg;

  // An example is {kind, id}: an execution opens its detail, a session its own view (the
  // session and its executions), never an execution lookup that would 404.
  function bucket(name, b) {
    const box = el('div', null, 'bucket');
    box.appendChild(el('strong', name + ': ' + ((b && b.count) || 0)));
    ((b && b.examples) || []).forEach((example) => {
      const open = el('button', example.id, 'link');
      open.type = 'button';
      open.dataset.kind = example.kind;
      open.setAttribute('aria-label', 'open ' + example.kind + ' ' + example.id);
      open.addEventListener('click', async () => {
        const target = $('proposal-execution');
        target.replaceChildren(example.kind === 'session'
          ? await sessionView(example.id)
          : await sg.detail.render(example.id));
        target.focus();
      });
      box.appendChild(open);
    });
    return box;
  }

  // A session: its state and its executions, each opening its detail.
  async function sessionView(id) {
    const box = el('div', null, 'session-view');
    box.dataset.sessionId = id;
    const reply = await api('GET', '/v1/sessions/' + encodeURIComponent(id));
    if (reply.status !== 200) {
      box.appendChild(el('p', 'session ' + id + ': ' + errorText(reply), 'error'));
      return box;
    }
    const s = reply.data;
    box.appendChild(el('h3', 'Session ' + s.id));
    box.appendChild(el('p', 'tenant ' + s.tenant + ', ' + s.language + ', ' + s.status
      + (s.closed_reason ? ' (' + s.closed_reason + ')' : '') + ', ' + s.executions + ' executions'));
    const runs = await api('GET', '/v1/executions?limit=100&session=' + encodeURIComponent(id));
    ((runs.status === 200 && runs.data.executions) || []).forEach((x) => {
      const open = el('button', x.id + ' (' + x.status + ')', 'link');
      open.type = 'button';
      open.addEventListener('click', async () => {
        box.appendChild(await sg.detail.render(x.id));
      });
      box.appendChild(open);
    });
    return box;
  }

  function tests(t) {
    const box = el('div', null, 'detail-part');
    box.appendChild(el('h3', 'Tests'));
    box.appendChild(el('p', (t.passed ? 'pass' : 'FAIL') + ': ' + t.cases_passed + ' cases passed, '
      + t.cases_failed + ' failed, coverage ' + Number(t.coverage_percent || 0).toFixed(1)
      + '%; decision matrix ' + t.matrix, t.passed ? '' : 'error'));
    if (t.failures) box.appendChild(el('pre', t.failures));
    if (t.matrix_diff) {
      box.appendChild(el('p', 'Decision matrix changes (rewritten on approval):', 'muted'));
      box.appendChild(el('pre', t.matrix_diff, 'diff'));
    }
    return box;
  }

  function replay(r) {
    const box = el('div', null, 'detail-part');
    box.appendChild(el('h3', 'Replay over the last ' + r.days + ' days (' + r.total + ' decisions, '
      + r.unchanged + ' unchanged)'));
    if (r.truncated) {
      box.appendChild(el('p', 'Only the newest ' + r.limit + ' decisions of the window were replayed; '
        + 'older ones were not.', 'warning'));
    }
    box.appendChild(bucket('allow -> deny', r.allow_to_deny));
    box.appendChild(bucket('deny -> allow', r.deny_to_allow));
    box.appendChild(bucket('review changes', r.review_changes));
    box.appendChild(bucket('limit changes', r.limit_changes));
    box.appendChild(bucket('grant changes (hosts, inspection, credentials, mounts, backend)',
      r.grant_changes));
    return box;
  }

  function decide(p) {
    const form = el('form', null, 'decide');
    const label = el('label', 'Comment');
    label.htmlFor = 'proposal-comment';
    const comment = el('textarea');
    comment.id = 'proposal-comment';
    comment.rows = 2;
    comment.cols = 60;
    const approve = el('button', 'Approve and apply');
    approve.type = 'button';
    approve.id = 'proposal-approve';
    approve.disabled = !p.tests_passed;
    const reject = el('button', 'Reject');
    reject.type = 'button';
    reject.id = 'proposal-reject';
    const act = (verb) => async () => {
      // An approval names the candidate shown here: if the proposal was rebased since, it is
      // refused (409) and the page shows the new evidence.
      const body = { comment: comment.value || undefined };
      if (verb === 'approve') body.candidate_revision = p.candidate_revision;
      const reply = await api('POST', '/v1/policy/proposals/' + encodeURIComponent(p.id) + '/' + verb, body);
      if (reply.status === 200) say('Proposal ' + p.id + ' ' + (verb === 'approve' ? 'approved' : 'rejected') + '.');
      else say(verb + ' ' + p.id + ': ' + errorText(reply));
      await refresh();
      await show(p.id);
    };
    approve.addEventListener('click', act('approve'));
    reject.addEventListener('click', act('reject'));
    [label, comment, approve, reject].forEach((n) => form.appendChild(n));
    return form;
  }

  async function show(id) {
    const reply = await api('GET', '/v1/policy/proposals/' + encodeURIComponent(id));
    const box = $('proposal');
    box.replaceChildren();
    if (reply.status !== 200) {
      box.appendChild(el('p', errorText(reply), 'error'));
      return;
    }
    const p = reply.data;
    box.appendChild(el('h3', p.title));
    const by = el('p', 'by ' + p.author_key_id + ' (' + p.origin + '), ', 'muted');
    by.appendChild(when(p.created_at));
    by.appendChild(document.createTextNode((p.source_execution ? ', from ' + p.source_execution : '')
      + '; base ' + p.base_revision + ' -> candidate ' + p.candidate_revision));
    box.appendChild(by);
    if (p.rationale) box.appendChild(el('p', p.rationale));
    if (p.justification) {
      const words = el('blockquote', p.justification, 'agent-words');
      words.title = "the agent's own words: not verified";
      box.appendChild(el('p', "The agent's words (not verified):", 'muted'));
      box.appendChild(words);
    }
    box.appendChild(el('h3', 'Change (JSON merge patch per data file)'));
    box.appendChild(el('pre', JSON.stringify(p.patch, null, 2), 'diff'));
    (p.evidence.files || []).forEach((f) => {
      const details = el('details');
      details.appendChild(el('summary', f.path + ' as it would be'));
      details.appendChild(el('pre', f.contents));
      box.appendChild(details);
    });
    box.appendChild(tests(p.evidence.tests || {}));
    box.appendChild(replay(p.evidence.replay || {}));
    if (p.status === 'open') box.appendChild(decide(p));
    else box.appendChild(el('p', p.status + ' by ' + p.decided_by + (p.comment ? ': ' + p.comment : '')));
    box.appendChild(el('div', null, 'execution-slot')).id = 'proposal-execution';
    $('proposal-execution').tabIndex = -1;
    box.focus();
  }

  // Paging: the open proposals, PAGE at a time, newest first. `pages` holds the `before`
  // cursor of each page shown so far (the first is none), so Newer goes back.
  const PAGE = 50;
  let pages = [''];

  function pager(next) {
    const nav = el('p', null, 'pager');
    const newer = el('button', 'Newer proposals');
    newer.type = 'button';
    newer.id = 'proposals-newer';
    newer.disabled = pages.length <= 1;
    newer.addEventListener('click', () => { pages.pop(); refresh(false); });
    const older = el('button', 'Older proposals');
    older.type = 'button';
    older.id = 'proposals-older';
    older.disabled = !next;
    older.addEventListener('click', () => { pages.push(next); refresh(false); });
    nav.appendChild(newer);
    nav.appendChild(older);
    nav.appendChild(document.createTextNode(' page ' + pages.length));
    return nav;
  }

  async function refresh(first) {
    if (!sg.key()) return;
    if (first !== false) pages = [''];
    const before = pages[pages.length - 1];
    const reply = await api('GET', '/v1/policy/proposals?status=open&limit=' + PAGE
      + (before ? '&before=' + encodeURIComponent(before) : ''));
    const list = $('proposals-list');
    list.replaceChildren();
    if (reply.status !== 200) {
      list.appendChild(el('p', errorText(reply), 'muted'));
      return;
    }
    const rows = reply.data.proposals || [];
    if (rows.length === 0) {
      list.appendChild(el('p', 'No open proposals.', 'muted'));
      if (pages.length > 1) list.appendChild(pager(null));
      return;
    }
    list.appendChild(table(['Proposed', 'Title', 'Origin', 'Tests', 'deny -> allow', 'allow -> deny', ''],
      rows, (p) => {
        const open = el('button', 'Review');
        open.type = 'button';
        open.addEventListener('click', () => show(p.id));
        const r = p.evidence.replay || {};
        return [when(p.created_at), p.title, p.origin, p.tests_passed ? 'pass' : 'FAIL',
          (r.deny_to_allow || {}).count, (r.allow_to_deny || {}).count, open];
      }, 'proposals'));
    list.appendChild(pager(reply.data.next_before || null));
  }

  // "Propose a change" for a denied or held execution: the bundle's suggestion as a proposal.
  async function proposeFrom(id) {
    const reply = await api('POST', '/v1/policy/proposals', { from_execution: id });
    if (reply.status !== 201) {
      say('Propose a change for ' + id + ': ' + errorText(reply));
      return;
    }
    say('Proposal ' + reply.data.id + ' opened from ' + id + '.');
    await refresh();
    await show(reply.data.id);
    $('proposals-section').scrollIntoView();
  }

  document.addEventListener('DOMContentLoaded', () => {
    $('proposals-refresh').addEventListener('click', () => refresh());
    $('key-form').addEventListener('submit', () => setTimeout(refresh, 0));
    refresh();
  });

  sg.proposals = { refresh: refresh, show: show, proposeFrom: proposeFrom };
})(window.sandgate);
