// What the review page and the audit page share: the key, the API call, and putting values on
// the page. Every value becomes text (textContent), never HTML.
'use strict';

window.sandgate = (function () {
  const KEY = 'sandgate.key';
  const $ = (id) => document.getElementById(id);

  function key() {
    return sessionStorage.getItem(KEY) || '';
  }

  function setKey(value) {
    if (value) sessionStorage.setItem(KEY, value);
    else sessionStorage.removeItem(KEY);
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

  // "3 s ago", "5 min ago", "2 h ago", "4 d ago"; "in 12 min" for the future.
  function relative(date) {
    const seconds = Math.round((Date.now() - date.getTime()) / 1000);
    const ahead = seconds < 0;
    const s = Math.abs(seconds);
    let text;
    if (s < 60) text = s + ' s';
    else if (s < 3600) text = Math.floor(s / 60) + ' min';
    else if (s < 86400) text = Math.floor(s / 3600) + ' h ' + Math.floor((s % 3600) / 60) + ' min';
    else text = Math.floor(s / 86400) + ' d';
    return ahead ? 'in ' + text : text + ' ago';
  }

  const FORMAT = new Intl.DateTimeFormat(undefined, {
    year: 'numeric', month: 'short', day: 'numeric',
    hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false,
  });

  // A <time> showing "1 Dec 2026, 18:04:05 (3 min ago)" in the reader's time zone; the exact
  // stored instant is its datetime attribute and tooltip.
  function when(iso) {
    if (!iso) return el('span', '');
    const date = new Date(iso);
    if (isNaN(date.getTime())) return el('span', iso);
    const node = el('time', FORMAT.format(date) + ' (' + relative(date) + ')', 'when');
    node.dateTime = iso;
    node.title = iso;
    return node;
  }

  function whenCell(row, iso) {
    const td = cell(row);
    td.appendChild(when(iso));
    return td;
  }

  function bytes(n) {
    if (n === null || n === undefined) return '';
    if (n < 1024) return n + ' B';
    if (n < 1024 * 1024) return (n / 1024).toFixed(1) + ' KiB';
    return (n / 1024 / 1024).toFixed(1) + ' MiB';
  }

  function duration(ms) {
    if (ms === null || ms === undefined) return '';
    if (ms < 1000) return ms + ' ms';
    if (ms < 60000) return (ms / 1000).toFixed(1) + ' s';
    return Math.floor(ms / 60000) + ' min ' + Math.round((ms % 60000) / 1000) + ' s';
  }

  function reasonsText(reasons) {
    return (reasons || []).map((r) => r.code + ': ' + r.message).join('\n');
  }

  function labelsText(labels) {
    return Object.keys(labels || {}).sort().map((k) => k + '=' + labels[k]).join('\n');
  }

  // Labels as small chips, one per key=value.
  function labelChips(labels) {
    const box = el('span', null, 'labels');
    Object.keys(labels || {}).sort().forEach((k) => {
      box.appendChild(el('span', k + '=' + labels[k], 'label'));
    });
    return box;
  }

  // A table with a head row and one row per item, `columns` mapping an item to cell content
  // (text, or a node).
  function table(headings, items, columns, className) {
    const t = el('table', null, className);
    const head = t.createTHead().insertRow();
    headings.forEach((h) => head.appendChild(el('th', h)));
    const body = t.createTBody();
    items.forEach((item) => {
      const row = body.insertRow();
      columns(item).forEach((value) => {
        const td = cell(row);
        if (value instanceof Node) td.appendChild(value);
        else if (value !== undefined && value !== null) td.textContent = String(value);
      });
    });
    return t;
  }

  // Who the key is (GET /v1/me), or null with the reply when it is refused.
  async function whoami() {
    const reply = await api('GET', '/v1/me');
    return reply.status === 200 ? { me: reply.data } : { error: reply };
  }

  return {
    $: $, key: key, setKey: setKey, api: api, el: el, cell: cell, errorText: errorText,
    say: say, when: when, whenCell: whenCell, relative: relative, bytes: bytes,
    duration: duration, reasonsText: reasonsText, labelsText: labelsText,
    labelChips: labelChips, table: table, whoami: whoami,
  };
})();
