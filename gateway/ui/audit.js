// sandgate audit page: charts over GET /v1/audit/summary (the v_* views), drawn with the
// vendored Chart.js (canvas; no CDN, no inline script or style). Labels come from the data and
// are drawn on the canvas as text.
'use strict';

(function (sg) {
  const { $, api, errorText, say } = sg;
  const REFRESH_MS = 30000;
  const COLOURS = {
    allow: '#3a7d32', review: '#2a4f9a', deny: '#b03a2e', succeeded: '#3a7d32', failed: '#b03a2e',
    timeout: '#c77c00', oom: '#8e3a9e', killed: '#6d4c41', cancelled: '#8a8a8a', denied: '#d35400',
    pending_approval: '#2a4f9a', queued: '#5d8fd6', running: '#1f9aa8', error: '#000000',
  };
  const charts = {};

  function colour(name, i) {
    const spare = ['#4c78a8', '#f58518', '#54a24b', '#e45756', '#72b7b2', '#b279a2', '#9d755d'];
    return COLOURS[name] || spare[i % spare.length];
  }

  // Draws (or redraws) the chart in canvas `id`; `note` says when there is nothing to draw.
  function draw(id, config, empty) {
    if (charts[id]) charts[id].destroy();
    config.options = Object.assign({ responsive: true, maintainAspectRatio: false, animation: false },
      config.options || {});
    charts[id] = new Chart($('chart-' + id), config);
    $('note-' + id).textContent = empty ? 'Nothing in this window.' : '';
  }

  // "ap_…38788dc": ids are long; the start and the end tell them apart.
  function short(id) {
    return id.length > 14 ? id.slice(0, 3) + '\u2026' + id.slice(-7) : id;
  }

  function minutes(seconds) {
    return +(Math.max(0, seconds) / 60).toFixed(2);
  }

  function timeLabel(iso, bucket) {
    const d = new Date(iso);
    const opts = bucket >= 86400 ? { month: 'short', day: 'numeric' }
      : { month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit', hour12: false };
    return new Intl.DateTimeFormat(undefined, opts).format(d);
  }

  function decisions(s) {
    const times = Array.from(new Set(s.decisions.map((d) => d.time))).sort();
    const outcomes = ['allow', 'review', 'deny'];
    const datasets = outcomes.map((outcome, i) => ({
      label: outcome,
      backgroundColor: colour(outcome, i),
      data: times.map((t) => {
        const found = s.decisions.find((d) => d.time === t && d.outcome === outcome);
        return found ? found.decisions : 0;
      }),
    }));
    draw('decisions', {
      type: 'bar',
      data: { labels: times.map((t) => timeLabel(t, s.bucket_seconds)), datasets: datasets },
      options: { scales: { x: { stacked: true }, y: { stacked: true, beginAtZero: true, title: { display: true, text: 'decisions per ' + Math.round(s.bucket_seconds / 60) + ' min' } } } },
    }, times.length === 0);
  }

  function denials(s) {
    draw('denials', {
      type: 'bar',
      data: {
        labels: s.denials.map((d) => d.reason),
        datasets: [{ label: 'denied decisions', backgroundColor: colour('deny', 0), data: s.denials.map((d) => d.decisions) }],
      },
      options: { indexAxis: 'y', scales: { x: { beginAtZero: true } } },
    }, s.denials.length === 0);
  }

  function egress(s) {
    const hosts = Array.from(new Set(s.egress.map((e) => e.host)));
    const datasets = ['allow', 'deny'].map((outcome, i) => ({
      label: outcome,
      backgroundColor: colour(outcome, i),
      data: hosts.map((h) => {
        const found = s.egress.find((e) => e.host === h && e.outcome === outcome);
        return found ? found.attempts : 0;
      }),
    }));
    draw('egress', {
      type: 'bar',
      data: { labels: hosts, datasets: datasets },
      options: { indexAxis: 'y', scales: { x: { stacked: true, beginAtZero: true, title: { display: true, text: 'connection attempts' } }, y: { stacked: true } } },
    }, hosts.length === 0);
  }

  function approvals(s) {
    const list = s.approvals_waiting;
    draw('approvals', {
      type: 'bar',
      data: {
        labels: list.map((a) => short(a.id) + (a.tenant ? ' (' + a.tenant + ')' : '')),
        datasets: [
          { label: 'waiting (min)', backgroundColor: '#2a4f9a', data: list.map((a) => minutes(a.age_seconds)) },
          { label: 'expires in (min)', backgroundColor: '#c7d4ea', data: list.map((a) => minutes(a.expires_in_seconds)) },
        ],
      },
      options: { indexAxis: 'y', scales: { x: { beginAtZero: true, title: { display: true, text: 'minutes' } } } },
    }, list.length === 0);
  }

  function executions(s) {
    const list = s.executions;
    draw('executions', {
      type: 'bar',
      data: {
        labels: list.map((e) => e.status),
        datasets: [{ label: 'executions', backgroundColor: list.map((e, i) => colour(e.status, i)), data: list.map((e) => e.executions) }],
      },
      options: { plugins: { legend: { display: false } }, scales: { y: { beginAtZero: true } } },
    }, list.length === 0);
    const timed = list.filter((e) => e.max_ms !== null);
    draw('durations', {
      type: 'bar',
      data: {
        labels: timed.map((e) => e.status),
        datasets: [
          { label: 'p50 (ms)', backgroundColor: '#4c78a8', data: timed.map((e) => Math.round(e.p50_ms)) },
          { label: 'p90 (ms)', backgroundColor: '#f58518', data: timed.map((e) => Math.round(e.p90_ms)) },
          { label: 'max (ms)', backgroundColor: '#b03a2e', data: timed.map((e) => e.max_ms) },
        ],
      },
      options: { scales: { y: { beginAtZero: true, title: { display: true, text: 'milliseconds' } } } },
    }, timed.length === 0);
  }

  function sessions(s) {
    const list = s.sessions_open;
    draw('sessions', {
      type: 'bar',
      data: {
        labels: list.map((x) => short(x.id) + ' (' + x.tenant + ', ' + x.language + ', ' + x.executions + ' runs)'),
        datasets: [
          { label: 'age (min)', backgroundColor: '#1f9aa8', data: list.map((x) => minutes(x.age_seconds)) },
          { label: 'idle (min)', backgroundColor: '#b8dde1', data: list.map((x) => minutes(x.idle_seconds)) },
        ],
      },
      options: { indexAxis: 'y', scales: { x: { beginAtZero: true, title: { display: true, text: 'minutes' } } } },
    }, list.length === 0);
  }

  let busy = false;
  async function refresh() {
    if (!sg.key() || busy) return;
    busy = true;
    try {
      const reply = await api('GET', '/v1/audit/summary?since=' + encodeURIComponent($('since').value));
      if (reply.status !== 200) {
        say('Charts: ' + errorText(reply), true);
        return;
      }
      const s = reply.data;
      [decisions, denials, egress, approvals, executions, sessions].forEach((f) => f(s));
      document.body.dataset.drawn = String(Date.now());
      say('Since ' + new Date(s.since).toLocaleString() + '; refreshed every 30 s.');
    } catch (err) {
      say('The gateway did not answer: ' + err, true);
    } finally {
      busy = false;
    }
  }

  async function identify() {
    const found = await sg.whoami();
    if (found.error) {
      say('This key is refused: ' + errorText(found.error), true);
      return;
    }
    const me = found.me;
    $('whoami').textContent = 'Signed in as ' + me.principal + ' (' + me.role + ')';
    if (me.role !== 'auditor' && me.role !== 'admin') {
      say('The charts need an auditor or admin key; this one is a ' + me.role + ' key.', true);
      return;
    }
    refresh();
  }

  document.addEventListener('DOMContentLoaded', () => {
    $('key-form').addEventListener('submit', (event) => {
      event.preventDefault();
      const value = $('key').value.trim();
      $('key').value = '';
      if (!value) return;
      sg.setKey(value);
      identify();
    });
    $('forget-key').addEventListener('click', () => {
      sg.setKey('');
      Object.keys(charts).forEach((id) => { charts[id].destroy(); delete charts[id]; });
      $('whoami').textContent = '';
      say('Key forgotten.');
    });
    $('since').addEventListener('change', refresh);
    if (sg.key()) identify();
    setInterval(refresh, REFRESH_MS);
  });
})(window.sandgate);
