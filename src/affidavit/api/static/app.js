// The affidavit trace page: a job list (/ui/) and one job's trace (/ui/jobs/<id>), drawn from
// the JSON API with the caller's key. No build step, no third-party code, no network but ours.
"use strict";

const KEY = "affidavit.key";
const COLORS = {
  pure: "var(--pure)", side_effect_committed: "var(--committed)", compensated: "var(--compensated)",
  in_flight: "var(--in_flight)", waiting: "var(--waiting)", parked: "var(--parked)",
  running: "var(--running)", failed: "var(--failed)", pending: "var(--pending)",
  skipped: "var(--skipped)", approved: "var(--pure)", signalled: "var(--pure)",
  unknown: "var(--in_flight)", denied: "var(--failed)",
};
const LABELS = {
  pure: "pure", side_effect_committed: "side effect committed", compensated: "compensated",
  in_flight: "in flight", waiting: "waiting", parked: "parked", running: "running",
  failed: "failed", pending: "pending", skipped: "skipped", approved: "approved",
  denied: "denied", signalled: "signalled", unknown: "unknown outcome",
};
const INPUT_SHOWN_CHARS = 200; // the header shows the job's input up to this many characters
const SVG = "http://www.w3.org/2000/svg";

const $ = (sel) => document.querySelector(sel);

function el(tag, attrs = {}, ...children) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4))
                                      : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null) continue;
    if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.hint = e.hint || "";
  }
}

// ``init.body``: sent as JSON with ``init.method`` (POST for decisions). The key goes in the
// Authorization header only: never in a URL, so never in a server's or proxy's access log.
async function api(path, init = {}) {
  const headers = { Authorization: `Bearer ${sessionStorage.getItem(KEY)}` };
  const options = { method: init.method || "GET", headers, cache: "no-store" };
  if (init.body !== undefined) {
    headers["Content-Type"] = "application/json";
    options.body = JSON.stringify(init.body);
  }
  const response = await fetch(path, options);
  let body = null;
  try { body = await response.json(); } catch (_) { /* not JSON */ }
  if (!response.ok) throw new ApiError(response.status, body);
  return body;
}

function showError(err) {
  const box = $("#error");
  box.hidden = false;
  box.textContent = err.hint ? `${err.message} — ${err.hint}` : err.message;
}

function short(hash) { return hash ? `${hash.slice(0, 12)}…` : ""; }

// A step as people know it: an agent's wait or approval step by its key (``big_refund``), with
// its sequence id; any other step by its id.
function stepName(nodeId, key) {
  return key && String(nodeId).startsWith("#") ? `${key} (step ${nodeId})` : String(nodeId);
}

// How a step's call was recovered after the attempt that made it died (trace ``recovered``).
function recoveryText(r) {
  const who = `attempt ${r.attempt} (worker ${r.worker_id || "unrecorded"})`;
  const dead = r.after === "timeout" ? "timed out" : "died with its call open";
  if (r.how === "caught_up") return `caught up by reconcile: ${who} ${dead}; its effect was found`;
  if (r.how === "rerun") {
    return `re-run: ${who} ${dead}, reconcile found nothing; attempt ${r.rerun_attempt} ran on `
      + `worker ${r.rerun_worker_id}`;
  }
  return `lost: ${who} ${dead}, reconcile found nothing; not re-run`;
}

function recoveredCell(n) {
  return el("td", { class: "recovered", "data-recovered": String((n.recovered || []).length),
    text: (n.recovered || []).map(recoveryText).join("; ") });
}

// (the job list is list.js)

// --- one job -------------------------------------------------------------------------------------

function layers(nodes) {
  const byId = Object.fromEntries(nodes.map((n) => [n.id, n]));
  const depth = {};
  const visit = (id) => {
    if (depth[id] !== undefined) return depth[id];
    const deps = byId[id].depends_on.filter((d) => byId[d]);
    depth[id] = deps.length ? 1 + Math.max(...deps.map(visit)) : 0;
    return depth[id];
  };
  nodes.forEach((n) => visit(n.id));
  return depth;
}

function dag(nodes) {
  const depth = layers(nodes);
  const W = 200, H = 46, GX = 56, GY = 22, PAD = 12;
  const rows = {};
  const pos = {};
  for (const n of nodes) {
    const d = depth[n.id];
    rows[d] = (rows[d] || 0) + 1;
    pos[n.id] = { x: PAD + d * (W + GX), y: PAD + (rows[d] - 1) * (H + GY) };
  }
  const width = PAD * 2 + (Math.max(...Object.values(depth), 0) + 1) * (W + GX) - GX;
  const height = PAD * 2 + Math.max(...Object.values(rows), 1) * (H + GY) - GY;
  const svg = el("svg:svg", { id: "dag", width, height, viewBox: `0 0 ${width} ${height}`,
    role: "img", "aria-label": "task graph" });
  svg.append(el("svg:defs", {}, el("svg:marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10,
    refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" },
  el("svg:path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#8a949e" }))));
  for (const n of nodes) {
    for (const dep of n.depends_on) {
      if (!pos[dep]) continue;
      const a = pos[dep], b = pos[n.id];
      const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2, mx = (x1 + x2) / 2;
      svg.append(el("svg:path", { d: `M ${x1} ${y1} C ${mx} ${y1}, ${mx} ${y2}, ${x2} ${y2}`,
        fill: "none", stroke: "#8a949e", "stroke-width": 1.4, "marker-end": "url(#arrow)",
        "data-edge": `${dep}->${n.id}` }));
    }
  }
  for (const n of nodes) {
    const p = pos[n.id];
    const g = el("svg:g", { class: "node", "data-node": n.id, "data-state": n.state,
      transform: `translate(${p.x},${p.y})` });
    g.append(el("svg:title", { text: `${n.id} (${n.type}${n.tool ? `: ${n.tool}` : ""}) — `
      + `${LABELS[n.state] || n.state}, ${n.attempts} attempt(s)` }));
    g.append(el("svg:rect", { width: W, height: H, rx: 7, fill: COLORS[n.state] || "#999" }));
    g.append(el("svg:text", { x: 10, y: 19, fill: "#fff", "font-weight": 700, text: n.id }));
    g.append(el("svg:text", { x: 10, y: 36, fill: "#fff",
      text: `${n.type} · ${LABELS[n.state] || n.state}` }));
    svg.append(g);
  }
  return svg;
}

function legend() {
  return el("div", { class: "legend" }, ...Object.keys(LABELS).map((s) =>
    el("span", { style: `--c:${COLORS[s]}`, text: LABELS[s] })));
}

function timeline(trace) {
  const t0 = Date.parse(trace.created_at);
  const ends = trace.nodes.flatMap((n) => [n.started_at, n.finished_at]).filter(Boolean)
    .map(Date.parse);
  const span = Math.max(1, ...ends.map((t) => t - t0));
  const W = 720, LEFT = 140, ROW = 22;
  const shown = trace.nodes.filter((n) => n.started_at || n.finished_at);
  const svg = el("svg:svg", { id: "timeline", width: LEFT + W + 90,
    height: Math.max(1, shown.length) * ROW + 24, role: "img", "aria-label": "timeline" });
  shown.forEach((n, i) => {
    const start = Date.parse(n.started_at || n.finished_at) - t0;
    const end = n.finished_at ? Date.parse(n.finished_at) - t0 : span;
    const x = LEFT + (start / span) * W;
    const w = Math.max(3, ((end - start) / span) * W);
    const y = i * ROW + 4;
    svg.append(el("svg:text", { x: 0, y: y + 13, text: n.key || n.id }));
    svg.append(el("svg:rect", { x, y, width: w, height: ROW - 6, rx: 3,
      fill: COLORS[n.state] || "#999", "data-bar": n.id }));
    svg.append(el("svg:text", { x: x + w + 6, y: y + 13, fill: "#5f6b76",
      text: `${n.duration_ms === null ? "" : `${n.duration_ms.toFixed(1)} ms`}`
        + `${n.attempts > 1 ? ` · ${n.attempts} attempts` : ""}` }));
  });
  svg.append(el("svg:text", { x: LEFT, y: shown.length * ROW + 20, fill: "#5f6b76",
    text: `0 … ${span} ms after the job was created` }));
  return svg;
}

const PROOFS = [
  ["replay", "replay proof", (v) => v.replay_proof_result,
    (c) => c.error || ""],
  ["ledger", "ledger proof", (v) => v.tool_invocation_ledger_proof,
    (c) => c.error || (c.pending_idempotency_keys || []).join(", ")],
  ["chain", "stored chain", (v) => v.stored_chain,
    (c) => (c.first_bad_version ? `first bad version ${c.first_bad_version}` : "")],
  ["seal", "seal", (v) => v.seal,
    (c) => c.error || (c.present ? `key ${c.key_id}` : "not sealed yet")],
];

async function badges(jobId, status) {
  const box = el("div", { class: "badges", id: "proofs" });
  let verdict;
  try {
    verdict = await api(`/api/jobs/${jobId}/verify?fresh=1`);  // a verdict of the store as it is now
  } catch (err) {
    if (err.status === 404 || err.status === 405) {
      box.append(el("span", { class: "badge na", "data-proof": "all", text: "proofs: not available" }));
      return box;
    }
    throw err;
  }
  for (const [name, label, pick, why] of PROOFS) {
    const check = pick(verdict) || {};
    if (name === "seal" && !TERMINAL.includes(status) && !check.present) {
      // (a job is sealed when it finishes: no seal yet is what an unfinished job has)
      box.append(el("span", { class: "badge na", "data-proof": name, "data-ok": "pending",
        title: `the job is ${status}: it is sealed when it finishes`, text: "not sealed yet" }));
      continue;
    }
    const good = check.ok === true;
    box.append(el("span", { class: `badge ${good ? "ok" : "fail"}`, "data-proof": name,
      "data-ok": String(good), title: why(check) || (good ? "" : "failed"),
      text: `${label} ${good ? "OK" : "FAILED"}` }));
  }
  box.append(el("span", { class: "mono", id: "execution-hash",
    title: `event chain root ${verdict.event_chain_root_hash}`,
    text: `execution hash ${short(verdict.execution_hash)}` }));
  return box;
}

async function allEvents(jobId) {
  const events = [];
  let after = 0;
  for (let i = 0; i < 50; i += 1) {
    const page = await api(`/api/jobs/${jobId}/events?after_version=${after}&limit=1000`);
    events.push(...page.events);
    if (page.next_after_version === null) break;
    after = page.next_after_version;
  }
  return events;
}

function eventsTable(events) {
  const table = el("table", { id: "events" });
  table.append(el("tr", {}, ...["version", "type", "node", "chain hash", "payload"]
    .map((h) => el("th", { text: h }))));
  for (const e of events) {
    const payload = el("details", {}, el("summary", { text: "payload" }),
      el("pre", { class: "mono", text: JSON.stringify(e.payload, null, 2) }));
    table.append(el("tr", { "data-version": String(e.version) },
      el("td", { text: String(e.version) }), el("td", { text: e.type }),
      el("td", { text: (e.payload && e.payload.node_id) || "" }),
      el("td", { class: "mono", title: e.chain_hash, text: short(e.chain_hash) }),
      el("td", {}, payload)));
  }
  return table;
}

async function renderJob(content, jobId, onDecided) {
  const trace = await api(`/api/jobs/${jobId}/trace`);
  const job = trace.job;
  document.title = `affidavit · ${job.job_id}`;
  content.append(el("h1", {}, "Job ", el("span", { class: "mono", text: job.job_id }), " — ",
    el("span", { class: "status", id: "job-status", text: job.status })));
  content.append(el("p", { text: `plan ${job.plan_name || "(unnamed)"} · namespace `
    + `${job.namespace} · ${trace.event_count} events · head ${short(job.head_hash)}` }));
  const input = JSON.stringify(trace.input === undefined ? null : trace.input);
  const cut = input.length > INPUT_SHOWN_CHARS;
  content.append(el("p", { id: "job-input" }, "input ", el("code", { class: "mono",
    "data-cut": String(cut), text: cut ? `${input.slice(0, INPUT_SHOWN_CHARS)}…` : input }),
  cut ? el("span", { class: "hint", text: ` (${input.length} characters; the whole input is `
    + "the job_created event's, below)" }) : ""));
  content.append(await badges(jobId, job.status));
  if (trace.forked_from) {  // a fork: a link to the source job (text nodes: never markup)
    const src = trace.forked_from;
    content.append(el("p", { id: "forked-from" }, "Forked from ",
      el("a", { href: `/ui/jobs/${encodeURIComponent(src.job_id)}`, class: "mono",
        text: src.job_id }),
      ` after step ${src.step}: the steps up to it are the source's recorded results`));
  }
  content.append(...family(trace));
  if (trace.parked) {
    content.append(el("p", { class: "card", id: "parked",
      text: `Parked on ${trace.parked.node_id} (${trace.parked.reason}). Decide with `
        + `affidavit resume ${job.job_id} --decision … --park ${trace.parked.version}` }));
  }
  for (const w of trace.waiting_for) {
    content.append(el("p", { class: "card", "data-wait": w.node_id,
      text: `Waiting on ${stepName(w.node_id, w.correlation_key)}: affidavit signal `
        + `${job.job_id} --key ${w.correlation_key}` }));
  }
  const slot = el("div", { id: "decide-slot" });
  const panel = await decisionPanel(jobId, onDecided);
  if (panel) slot.append(panel);
  content.append(slot);
  if (trace.kind === "agent") content.append(...agentCalls(trace));
  else content.append(el("h2", { text: "Task graph" }), legend(), el("div", { class: "card" },
    dag(trace.nodes)));
  content.append(el("h2", { text: "Timeline" }), el("div", { class: "card" }, timeline(trace)));
  const nodes = el("table", { id: "nodes" });
  nodes.append(el("tr", {}, ...["node", "type", "state", "attempts", "duration", "error",
    "recovered"].map((h) => el("th", { text: h }))));
  for (const n of trace.nodes) {
    nodes.append(el("tr", { "data-node": n.id },
      el("td", { text: stepName(n.id, n.key) }), el("td", { text: n.tool ? `${n.type}: ${n.tool}` : n.type }),
      el("td", { text: LABELS[n.state] || n.state }), el("td", { text: String(n.attempts) }),
      el("td", { text: n.duration_ms === null ? "" : `${n.duration_ms.toFixed(1)} ms` }),
      el("td", { text: n.error ? n.error.message || JSON.stringify(n.error) : "" }),
      recoveredCell(n)));
  }
  content.append(el("h2", { text: "Steps" }), nodes);
  const events = await allEvents(jobId);
  content.append(el("h2", { text: "Stream" }), streamList(events));
  content.append(el("h2", { text: "Events" }), eventsTable(events));
  return trace;
}

// --- the job's tree: its parent and its child jobs, each a link to its own page --------------------

function jobLink(jobId) {
  return el("a", { href: `/ui/jobs/${encodeURIComponent(jobId)}`, class: "mono", text: jobId });
}

function family(trace) {
  const shown = [];
  if (trace.parent_job_id) {
    shown.push(el("p", { id: "parent-job" }, "Child job of ", jobLink(trace.parent_job_id)));
  }
  const children = trace.children || [];
  if (children.length) {
    const table = el("table", { id: "children" });
    table.append(el("tr", {}, ...["child job", "status"].map((h) => el("th", { text: h }))));
    for (const c of children) {
      table.append(el("tr", { "data-child": c.job_id, "data-status": c.status },
        el("td", {}, jobLink(c.job_id)), el("td", { class: "status", text: c.status })));
    }
    shown.push(el("h2", { text: `Child jobs (${children.length})` }), table);
  }
  return shown;
}

// --- the job's live stream (ctx.emit): its values, and new ones as they are recorded ------------

function streamItem(e) {
  const p = e.payload || {};
  const from = p.node_id ? ` (${p.node_id}, attempt ${p.attempt})` : "";
  return el("li", { "data-seq": String(p.seq), "data-version": String(e.version) },
    el("code", { text: JSON.stringify(p.value) }), el("span", { class: "hint", text: from }));
}

function streamList(events) {
  const list = el("ol", { id: "stream", start: "0" });
  for (const e of events) if (e.type === "stream_emitted") list.append(streamItem(e));
  return list;
}

// Read /api/jobs/<id>/stream (Server-Sent Events) with fetch, so that the key stays in the
// Authorization header (an EventSource cannot send one): ``onEvent(type, event)`` for each
// event after version ``after``, until the stream's ``end`` (the job finished). A stream the
// server closed at its time limit is opened again after the last version read.
async function follow(jobId, after, onEvent) {
  const headers = { Authorization: `Bearer ${sessionStorage.getItem(KEY)}` };
  let last = after;
  for (;;) {
    const response = await fetch(`/api/jobs/${jobId}/stream?after_version=${last}`,
      { headers, cache: "no-store" });
    if (!response.ok) throw new ApiError(response.status, await response.json().catch(() => null));
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const fields = {};
        for (const line of buffer.slice(0, cut).split("\n")) {
          const i = line.indexOf(":");
          if (i === 0) continue; // a comment (heartbeat)
          const name = i < 0 ? line : line.slice(0, i);
          fields[name] = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
        }
        buffer = buffer.slice(cut + 2);
        if (fields.event === "end") return;
        if (fields.id) last = Number(fields.id);
        if (fields.data !== undefined) onEvent(fields.event, JSON.parse(fields.data));
      }
    }
  }
}

// --- keeping a job's page current -----------------------------------------------------------------

const TERMINAL = ["completed", "failed", "cancelled"];
const REFRESH_MS = 2000;

// Redraw the job into ``content`` (built aside, then swapped in: no flicker, no reload). A
// decision panel the person has started filling in is kept as it is, with a note when the job
// moved on under it (the decision is still pinned to what the person saw).
async function drawJob(content, jobId, onDecided) {
  const fresh = el("div");
  const trace = await renderJob(fresh, jobId, onDecided);
  const kept = content.querySelector("#decide[data-dirty=true]");
  if (kept) {
    const slot = fresh.querySelector("#decide-slot");
    slot.replaceChildren(kept);
    const moved = kept.dataset.version !== String(trace.event_count);
    let note = kept.querySelector("#decide-changed");
    if (moved && !note) {
      const redraw = el("button", { type: "button", text: "Show the current state" });
      redraw.addEventListener("click", () => {
        kept.dataset.dirty = "";
        onDecided();
      });
      note = el("p", { id: "decide-changed", class: "decide-status bad" }, el("span"), redraw);
      kept.prepend(note);
    }
    if (note) {
      note.firstChild.textContent = `The job changed since this panel was drawn (now `
        + `${trace.job.status}, ${trace.event_count} events): a decision about a park no `
        + "longer in force is refused. ";
    }
  }
  content.replaceChildren(...fresh.childNodes);
  content.dataset.version = String(trace.event_count);
  content.dataset.status = trace.job.status;
  return trace;
}

// Show the job and follow its stream while it is not terminal: a stream value is added at once,
// any other event redraws the page (once for a burst). Without a stream, poll.
async function showJob(content, jobId) {
  let queue = Promise.resolve();
  let shown = null;
  const redraw = () => {
    queue = queue.catch(() => undefined)
      .then(async () => { shown = await drawJob(content, jobId, redraw); });
    return queue;
  };
  await redraw();
  if (TERMINAL.includes(shown.job.status)) return;
  let pending = null;
  const later = () => { pending = pending || window.setTimeout(() => { pending = null; redraw(); }, 250); };
  follow(jobId, shown.event_count, (type, event) => {
    const list = document.querySelector("#stream");
    if (type === "stream_emitted" && list
        && !list.querySelector(`[data-version="${event.version}"]`)) list.append(streamItem(event));
    if (type !== "stream_emitted") later();
  }).then(later, (err) => { showError(err); window.setTimeout(tick, REFRESH_MS); });
  // A waiting parent records nothing while its children run: their statuses are polled, and a
  // change redraws the page.
  const childrenMoved = async () => {
    const rows = [...document.querySelectorAll("#children tr[data-child]")];
    if (!rows.some((r) => !TERMINAL.includes(r.dataset.status))) return false;
    const trace = await api(`/api/jobs/${jobId}/trace`);
    const now = new Map((trace.children || []).map((c) => [c.job_id, c.status]));
    return now.size !== rows.length || rows.some((r) => now.get(r.dataset.child) !== r.dataset.status);
  };
  const watchChildren = async () => {
    if (TERMINAL.includes(shown.job.status)) return;
    try {
      if (await childrenMoved()) await redraw();
    } catch (err) {
      showError(err);
    }
    window.setTimeout(watchChildren, REFRESH_MS);
  };
  window.setTimeout(watchChildren, REFRESH_MS);
  const tick = async () => {
    if (TERMINAL.includes(shown.job.status)) return;
    try {
      const job = await api(`/api/jobs/${jobId}`);
      if (job.event_count !== shown.event_count || job.status !== shown.job.status) {
        await redraw();
      }
      $("#error").hidden = true;
    } catch (err) {
      showError(err);
    }
    window.setTimeout(tick, REFRESH_MS);
  };
}

// --- agent jobs: the sequence of recorded calls (no task graph to draw) ---------------------------

function waitText(w) {
  const answered = w.answered_at ? ` answered by ${w.signalled_by}` : " (open)";
  const wake = w.wake_at ? ` until ${w.wake_at}` : "";
  return `${w.wait_type} ${w.correlation_key}${wake}${answered}`;
}

function agentCalls(trace) {
  const agent = trace.agent || {};
  const table = el("table", { id: "agent-calls" });
  table.append(el("tr", {}, ...["step", "kind", "tool", "state", "attempts", "duration", "waits",
    "recovered"].map((h) => el("th", { text: h }))));
  for (const n of trace.nodes) {
    const state = el("td", { class: "state", text: LABELS[n.state] || n.state });
    state.style.borderLeft = `6px solid ${COLORS[n.state] || "var(--pending)"}`;
    table.append(el("tr", { "data-seq": String(n.seq), "data-state": n.state },
      el("td", { class: "step-name", text: stepName(n.id, n.key) }), el("td", { text: n.type }),
      el("td", { text: n.tool || "" }), state, el("td", { text: String(n.attempts) }),
      el("td", { text: n.duration_ms === null ? "" : `${n.duration_ms.toFixed(1)} ms` }),
      el("td", { text: (n.waits || []).map(waitText).join("; ") }), recoveredCell(n)));
  }
  const pinned = agent.version === null || agent.version === undefined
    ? "not pinned" : `version ${agent.version}`;
  const title = `Agent ${agent.name || ""} ${pinned} — `
    + `${trace.nodes.length} recorded calls`;
  return [el("h2", { text: "Agent calls" }), legend(),
    el("div", { class: "card" }, el("p", { text: title }), table)];
}

// --- start ----------------------------------------------------------------------------------------

async function start() {
  const content = $("#content");
  const login = $("#login");
  if (!sessionStorage.getItem(KEY)) {
    login.hidden = false;
    login.addEventListener("submit", (ev) => {
      ev.preventDefault();
      sessionStorage.setItem(KEY, $("#key").value.trim());
      window.location.reload();
    });
    return;
  }
  $("#forget").hidden = false;
  $("#forget").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    window.location.reload();
  });
  const match = window.location.pathname.match(/^\/ui\/jobs\/([^/]+)\/?$/);
  try {
    if (match) await showJob(content, decodeURIComponent(match[1]));
    else await renderList(content);
    document.body.dataset.ready = "true";
  } catch (err) {
    if (err.status === 401) sessionStorage.removeItem(KEY);
    showError(err);
    document.body.dataset.ready = "error";
  }
}

start();
