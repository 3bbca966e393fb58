// The admission-plane dashboard: one EventSource, every value set with textContent (never as HTML).
"use strict";

const $ = (id) => document.getElementById(id);
let latest = null;

function duration(ms) {
  if (ms === null || ms === undefined) return "–";
  if (ms < 10000) return ms + " ms";
  if (ms < 120000) return (ms / 1000).toFixed(1) + " s";
  return Math.round(ms / 60000) + " min";
}

function setText(id, value) {
  const node = $(id);
  if (node) node.textContent = value === null || value === undefined ? "–" : String(value);
}

function fillTable(id, rows, columns, options = {}) {
  const body = $(id);
  if (!body) return;
  body.replaceChildren();
  if (rows.length === 0) {
    const tr = document.createElement("tr");
    const td = document.createElement("td");
    td.colSpan = columns.length + (options.extra ? 1 : 0);
    td.className = "empty";
    td.textContent = "none";
    tr.appendChild(td);
    body.appendChild(tr);
    return;
  }
  for (const row of rows) {
    const tr = document.createElement("tr");
    if (options.rowClass) tr.className = options.rowClass(row);
    for (const column of columns) {
      const td = document.createElement("td");
      td.textContent = column(row);
      tr.appendChild(td);
    }
    if (options.extra) tr.appendChild(options.extra(row));
    body.appendChild(tr);
  }
}

function drawLine(id, values) {
  const svg = $(id);
  if (!svg) return;
  svg.replaceChildren();
  const max = Math.max(1, ...values);
  const step = values.length > 1 ? 300 / (values.length - 1) : 300;
  const points = values.map((v, i) => `${(i * step).toFixed(1)},${(58 - (v / max) * 54).toFixed(1)}`).join(" ");
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", points);
  svg.appendChild(line);
  svg.setAttribute("data-last", String(values[values.length - 1] ?? 0));
}

function drawBars(id, values) {
  const svg = $(id);
  if (!svg) return;
  svg.replaceChildren();
  const max = Math.max(1, ...values);
  const width = 300 / Math.max(1, values.length);
  values.forEach((v, i) => {
    const bar = document.createElementNS("http://www.w3.org/2000/svg", "rect");
    const height = (v / max) * 56;
    bar.setAttribute("x", (i * width + 0.5).toFixed(1));
    bar.setAttribute("y", (58 - height).toFixed(1));
    bar.setAttribute("width", Math.max(1, width - 1).toFixed(1));
    bar.setAttribute("height", height.toFixed(1));
    svg.appendChild(bar);
  });
  svg.setAttribute("data-last", String(values[values.length - 1] ?? 0));
}

function span(ms) {
  if (ms >= 3600000 && ms % 3600000 === 0) return ms / 3600000 + " h";
  if (ms >= 60000 && ms % 60000 === 0) return ms / 60000 + " min";
  return duration(ms);
}

function budgetKey(b) {
  return b.model === null ? b.provider + " (all models)" : b.provider + "/" + b.model;
}

function budgetLeft(b) {
  const parts = [];
  if (b.remaining_requests !== null) parts.push(b.remaining_requests + " requests");
  if (b.remaining_tokens !== null) parts.push(b.remaining_tokens + " tokens");
  return parts.join(", ");
}

function exhausted(b) {
  return b.remaining_requests === 0 || b.remaining_tokens === 0;
}

function scopeText(p) {
  if (p.scope === "all") return "everything";
  if (p.scope === "lane") return "lane " + p.lane;
  return "key " + p.provider + "/" + p.model;
}

function releaseButton(row) {
  const td = document.createElement("td");
  if (document.body.dataset.operator === "yes") {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "release action";
    button.dataset.action = "release";
    button.dataset.lease = row.handle;
    button.textContent = "release";
    td.appendChild(button);
  }
  return td;
}

function render(data) {
  if (data.error) {
    setText("conn", "database error");
    $("conn").className = "conn down";
    return;
  }
  latest = data;
  setText("seats-in-use", data.seats.in_use);
  setText("seats-limit", data.seats.limit ?? "its own per connector");
  setText("starts-in-window", data.seats.starts_in_window);
  setText("starts-limit", data.seats.starts_limit);
  setText("queue-depth", data.queue.depth);
  setText("queue-oldest", duration(data.queue.oldest_age_ms));
  setText("recovery-required", data.recovery_required);
  setText("admissions-total", data.journal.admissions);
  setText("last-seq", data.journal.last_seq);
  const global = data.pauses.some((p) => p.scope === "all");
  setText("admission-state", global ? "paused" : data.pauses.length ? "partly paused" : "admitting");
  $("admission-state").className = data.pauses.length ? "paused" : "";
  setText("policy-revision", data.policy ? data.policy.revision : "–");
  setText("policy-document", data.policy ? JSON.stringify(data.policy.document, null, 2) :
    "no durable policy claimed yet: every connector runs its own (apply one below to put it in force)");
  const phases = Object.entries(data.leases.by_phase).sort();
  setText("leases-by-phase", phases.length ? phases.map(([phase, count]) => {
    const suspects = data.leases.suspects_by_phase[phase];
    return `${phase} ${count}` + (suspects ? ` (${suspects} suspect)` : "");
  }).join(", ") : "none");
  fillTable("queue-groups", data.queue.groups, [(g) => g.lane, (g) => g.provider, (g) => g.model, (g) => g.depth, (g) => duration(g.oldest_age_ms)]);
  fillTable("seat-groups", data.seats.groups, [(g) => g.lane, (g) => g.provider, (g) => g.model, (g) => g.seats, (g) => g.starts]);
  fillTable("cooldowns", data.cooldowns, [(c) => c.provider, (c) => c.model, (c) => duration(c.remaining_ms)]);
  const budgets = data.budgets || [];
  // Without a live revision each connector applies its own policy's budgets, which this server cannot see.
  const known = budgets.length || (data.policy && data.policy.revision);
  setText("budget-windows", budgets.length ? budgets.length + (budgets.length === 1 ? " window" : " windows") :
    known ? "none" : "none known");
  setText("budgets-exhausted", budgets.filter(exhausted).length);
  fillTable("budgets", budgets, [
    budgetKey, (b) => span(b.window_ms),
    (b) => b.requests + (b.max_requests === null ? "" : " / " + b.max_requests),
    (b) => b.reserved_tokens, (b) => b.used_tokens, (b) => b.max_tokens ?? "no limit",
    budgetLeft, (b) => b.next_reset_ms === null ? "–" : duration(b.next_reset_ms),
  ], { rowClass: (b) => "budget" + (exhausted(b) ? " exhausted" : "") });
  fillTable("leases", data.leases.rows, [
    (l) => l.phase, (l) => l.lane, (l) => l.provider + "/" + l.model, (l) => duration(l.held_ms),
    (l) => duration(l.heartbeat_age_ms), (l) => l.suspect_reason || "", (l) => l.evidence,
  ], {
    extra: releaseButton,
    rowClass: (l) => "lease" + (l.phase === "recovery_required" ? " recovery" : l.suspect_reason ? " suspect" : ""),
  });
  const pauses = $("pauses");
  pauses.replaceChildren();
  for (const p of data.pauses) {
    const li = document.createElement("li");
    li.className = "pause";
    li.textContent = scopeText(p) + " since " + new Date(p.since).toLocaleTimeString();
    pauses.appendChild(li);
  }
  if (!data.pauses.length) {
    const li = document.createElement("li");
    li.textContent = "none";
    pauses.appendChild(li);
  }
  fillTable("journal", data.journal.tail, [(e) => e.seq, (e) => new Date(e.at).toLocaleTimeString(), (e) => e.kind, (e) => e.from, (e) => e.to]);
  drawLine("chart-queue", data.charts.queue_depth);
  drawLine("chart-seats", data.charts.seats_in_use);
  drawBars("chart-admissions", data.charts.admissions);
  document.body.dataset.updated = String(data.now);
}

function connect() {
  const source = new EventSource("/api/stream");
  source.onopen = () => { setText("conn", "live"); $("conn").className = "conn live"; };
  source.onmessage = (message) => render(JSON.parse(message.data));
  source.onerror = () => { setText("conn", "reconnecting…"); $("conn").className = "conn down"; };
}

function describe(action, fields) {
  if (action === "release") {
    return "Release this seat without process evidence? Its request will never run again; if its connector " +
      "or dispatch is in fact alive, the plane will admit one turn too many.";
  }
  if (action === "policy") return "Put this policy in force as a new revision for every connector?";
  const scope = fields.scope === "all" ? "everything" : fields.scope === "lane" ? "lane " + fields.lane :
    "key " + fields.provider + "/" + fields.model;
  return (action === "pause" ? "Pause admission of " : "Resume admission of ") + scope + "?";
}

function fieldsFor(button) {
  const action = button.dataset.action;
  if (action === "release") return { lease: button.dataset.lease };
  if (action === "policy") return { policy: $("policy-editor").value };
  return { scope: $("pause-scope").value, lane: $("pause-lane").value, provider: $("pause-provider").value, model: $("pause-model").value };
}

async function perform(action, fields) {
  const body = new FormData();
  for (const [key, value] of Object.entries(fields)) body.append(key, value);
  body.append("csrf", document.querySelector('meta[name="csrf-token"]').content);
  body.append("confirm", action);
  const result = $("action-result");
  try {
    const response = await fetch("/actions/" + action, { method: "POST", body, credentials: "same-origin" });
    const answer = await response.json();
    result.className = answer.ok ? "" : "error";
    result.textContent = answer.ok ? action + ": " + answer.message : action + " refused: " + answer.error;
  } catch (error) {
    result.className = "error";
    result.textContent = action + " failed: " + error;
  }
}

function confirmThen(action, fields) {
  const dialog = $("confirm-dialog");
  setText("confirm-text", describe(action, fields));
  dialog.returnValue = "";
  dialog.onclose = () => { if (dialog.returnValue === "yes") perform(action, fields); };
  dialog.showModal();
}

document.addEventListener("click", (event) => {
  const button = event.target.closest("button.action");
  if (!button) return;
  event.preventDefault();
  confirmThen(button.dataset.action, fieldsFor(button));
});

document.addEventListener("DOMContentLoaded", () => {
  const load = $("policy-load");
  if (load) load.addEventListener("click", () => {
    if (latest && latest.policy) $("policy-editor").value = JSON.stringify(latest.policy.document, null, 2);
  });
  connect();
});
