// The decision panel of a job's page: what a person is asked to decide (the park in force, the
// open waits) and — for a key whose role allows it, as the HTTP API does — the forms that decide:
// approve or deny an approval, signal a wait, resume a park (pinned to the park's version).
// Every decision goes through the same API as the CLI's and is recorded with the key's agent.
"use strict";

const MAX_EDITOR_CHARS = 256 * 1024;
const DECISION_HELP = {
  retry: "the effect did not happen: run the tool again",
  accept_result: "the effect happened: record the result below as the step's and continue",
  continue: "accept the world as it is now: the mismatched step is not checked again",
  fail: "fail the job (sealed, final)",
};
const RECONCILE_NONE = "the tool has no reconcile hook: nobody could look the effect up";

function pretty(value) { return JSON.stringify(value, null, 2); }

function facts(rows) {
  const dl = el("dl", { class: "facts" });
  for (const [label, value, attrs] of rows) {
    if (value === undefined) continue;
    dl.append(el("dt", { text: label }));
    const dd = el("dd", attrs || {});
    if (value instanceof Node) dd.append(value);
    else dd.textContent = value === null ? "—" : String(value);
    dl.append(dd);
  }
  return dl;
}

function jsonBlock(value, attrs = {}) {
  return el("pre", { class: "mono json-view", ...attrs, text: pretty(value) });
}

// A JSON editor: a textarea checked as the person types; ``read()`` returns the parsed value or
// throws an Error naming what is wrong (nothing is sent then).
function jsonEditor(id, label, initial) {
  const area = el("textarea", { id, class: "mono json-editor", rows: 5, spellcheck: "false",
    "aria-label": label, maxlength: String(MAX_EDITOR_CHARS) });
  area.value = initial;
  const note = el("span", { class: "json-note", "data-for": id });
  const check = () => {
    try {
      JSON.parse(area.value);
      note.textContent = "valid JSON";
      note.className = "json-note ok";
      area.removeAttribute("aria-invalid");
    } catch (err) {
      note.textContent = `not JSON: ${err.message}`;
      note.className = "json-note bad";
      area.setAttribute("aria-invalid", "true");
    }
  };
  area.addEventListener("input", check);
  check();
  const read = () => {
    if (area.value.length > MAX_EDITOR_CHARS) {
      throw new Error(`${label} is longer than ${MAX_EDITOR_CHARS} characters`);
    }
    try {
      return JSON.parse(area.value);
    } catch (err) {
      throw new Error(`${label} is not JSON: ${err.message}`);
    }
  };
  return { node: el("div", { class: "editor" }, el("label", { for: id, text: label }), area, note),
    read };
}

function since(iso) {
  return iso ? `since ${iso}${typeof ago === "function" ? ` (${ago(iso)})` : ""}` : "";
}

// A refusal is said in the panel, next to the buttons (the panel stays as the person left it);
// an accepted decision above the page, which is then redrawn without the panel's old state.
function say(panel, text, kind) {
  const line = panel.querySelector("#decide-status");
  line.hidden = false;
  line.className = `decide-status ${kind}`;
  line.textContent = text;
}

function announce(text) {
  const line = $("#decided");
  line.hidden = false;
  line.textContent = text;
  line.scrollIntoView({ block: "nearest" });
}

async function send(panel, path, body, done, onDecided) {
  panel.querySelectorAll("button").forEach((b) => { b.disabled = true; });
  $("#decided").hidden = true;
  panel.dataset.dirty = "true"; // a redraw while the request is out keeps this panel (and its answer)
  let job;
  try {
    job = await api(path, { method: "POST", body });
  } catch (err) {
    say(panel, err.hint ? `${err.message} — ${err.hint}` : err.message, "bad");
    panel.querySelectorAll("button").forEach((b) => { b.disabled = false; });
    return;
  }
  panel.dataset.dirty = "";
  if (job.appended === false) {
    announce("This wait had been answered already: nothing was recorded (the first answer "
      + `stands) — the job is ${job.status}.`);
  } else {
    announce(`${done} at ${job.updated_at} — the job is now ${job.status}.`);
  }
  await onDecided();
}

function parkFacts(park) {
  const rows = [
    ["step", `${park.node_id}${park.step_id ? ` (step ${park.step_id})` : ""}`],
    ["tool", park.tool, { "data-fact": "tool" }],
    ["arguments", park.args_error ? `cannot be resolved: ${park.args_error}`
      : jsonBlock(park.args, { "data-fact": "args" })],
    ["idempotency key", park.idempotency_key, { class: "mono", "data-fact": "idempotency-key" }],
    ["external key", park.external_key, { class: "mono", "data-fact": "external-key" }],
  ];
  if (park.reconcile) {
    rows.push(["reconcile", park.reconcile.hook
      ? `the hook failed, so nothing is known: ${park.reconcile.error
        ? park.reconcile.error.message || pretty(park.reconcile.error) : "no error recorded"}`
      : RECONCILE_NONE, { "data-fact": "reconcile" }]);
  }
  if (park.recorded_result !== undefined) {
    rows.push(["recorded result", jsonBlock(park.recorded_result,
      { "data-fact": "recorded-result" })]);
  }
  if (park.detail) rows.push(["detail", jsonBlock(park.detail)]);
  return facts(rows);
}

function mismatchTable(mismatches) {
  const table = el("table", { id: "mismatches" });
  table.append(el("tr", {}, ...["resource", "recorded", "observed now", "why", "verifier"]
    .map((h) => el("th", { text: h }))));
  for (const m of mismatches) {
    table.append(el("tr", { "data-resource": m.resource_id || "" },
      el("td", { class: "mono", text: `${m.resource_type}: ${m.resource_id} (${m.operation})` }),
      el("td", { class: "mono", "data-fact": "recorded",
        text: m.recorded === null ? "—" : String(m.recorded) }),
      el("td", { class: "mono", "data-fact": "observed",
        text: m.observed === null ? "(see why)" : String(m.observed) }),
      el("td", { text: m.reason || "" }),
      el("td", { text: m.verifier || "" })));
  }
  return table;
}

function parkSection(jobId, park, caller, panel, onDecided) {
  const box = el("div", { id: "park", "data-reason": park.reason,
    "data-park-version": String(park.version) });
  box.append(el("h3", { text: `Parked: ${park.reason.replaceAll("_", " ")}` }),
    el("p", { text: `${park.message ? `${park.message}. ` : ""}Parked at version `
      + `${park.version} ${since(park.since)}.` }),
    parkFacts(park));
  if (park.mismatches && park.mismatches.length) box.append(mismatchTable(park.mismatches));
  if (!caller.may_resume) {
    box.append(el("p", { class: "hint", id: "resume-denied",
      text: `Resuming a parked job needs an admin key; this key (${caller.agent_id}) is `
        + `${caller.role}.` }));
    return box;
  }
  const form = el("form", { id: "resume", "data-park-version": String(park.version) });
  let result = null;
  if (park.decisions.includes("accept_result")) {
    const initial = park.recorded_result !== undefined ? pretty(park.recorded_result) : "{}";
    result = jsonEditor("resume-result", "Result (for accept result)", initial);
    form.append(result.node);
  }
  const note = el("input", { id: "resume-note", type: "text", maxlength: "1000",
    placeholder: "note, recorded with the decision", "aria-label": "note" });
  form.append(el("label", { for: "resume-note", class: "field-label", text: "Note" }), note);
  const buttons = el("div", { class: "decisions" });
  for (const decision of park.decisions) {
    const button = el("button", { type: "button", "data-decision": decision,
      class: decision === "fail" ? "danger" : "", title: DECISION_HELP[decision] || "",
      text: decision.replaceAll("_", " ") });
    button.addEventListener("click", () => {
      const body = { decision, park_version: park.version };
      if (note.value.trim()) body.note = note.value.trim();
      if (decision === "accept_result") {
        try {
          body.result = result.read();
        } catch (err) {
          say(panel, err.message, "bad");
          return;
        }
        if (body.result === null) {
          say(panel, "accept result needs a result (null is no result)", "bad");
          return;
        }
      }
      send(panel, `/api/jobs/${encodeURIComponent(jobId)}/resume`, body,
        `Resumed (${decision}) by ${caller.agent_id}, pinned to park version ${park.version}`,
        onDecided);
    });
    buttons.append(button);
  }
  form.append(buttons, el("ul", { class: "hint" }, ...park.decisions.map((d) =>
    el("li", {}, el("b", { text: d.replaceAll("_", " ") }), `: ${DECISION_HELP[d] || ""}`))));
  form.addEventListener("submit", (ev) => ev.preventDefault());
  box.append(form);
  return box;
}

function waitSection(jobId, wait, caller, panel, onDecided) {
  const approval = wait.wait_type === "approval";
  const box = el("div", { class: "wait-decision", "data-wait-node": wait.node_id,
    "data-wait-type": wait.wait_type });
  box.append(el("h3", { text: `${approval ? "Approval" : "Signal"} `
    + `“${stepName(wait.node_id, wait.correlation_key)}”` }),
    el("p", { text: `Waiting ${since(wait.since)}.` }),
    facts([
      ["correlation key", wait.correlation_key, { class: "mono" }],
      [approval ? "what the plan asks approval for" : "attached by the plan",
        wait.payload_error ? `cannot be resolved: ${wait.payload_error}`
          : wait.payload === null || wait.payload === undefined ? "nothing attached"
            : jsonBlock(wait.payload, { "data-fact": "payload" })],
    ]));
  if (approval) {
    const rows = [["who may decide", `${(wait.approvers || []).join(", ")}; `
      + `${wait.min_approvals || 1} distinct approval(s) needed`]];
    if (wait.call) rows.push(["tool call", `${wait.call.tool_name} at ${wait.call.step_id}`]);
    for (const a of wait.approvals || []) {
      rows.push([a.approved ? "approved by" : "rejected by", `${a.principal} (${a.role})`]);
    }
    box.append(facts(rows));
  }
  if (!wait.may_decide) {
    box.append(el("p", { class: "hint", "data-denied": wait.node_id,
      text: `This key (${caller.agent_id}) is ${caller.role}: it may look, not decide `
        + `(${wait.why_not || "its role does not allow it"}).` }));
    return box;
  }
  const path = `/api/jobs/${encodeURIComponent(jobId)}/signal`;
  const form = el("form", { "data-signal": wait.node_id });
  form.addEventListener("submit", (ev) => ev.preventDefault());
  if (approval) {
    const commentId = `comment-${wait.node_id}`;
    const comment = el("textarea", { id: commentId, class: "comment", rows: 2, maxlength: "2000",
      "aria-label": "comment", placeholder: "comment, recorded with your decision" });
    const answer = (approved) => () => {
      const payload = { approved };
      if (comment.value.trim()) payload.comment = comment.value.trim();
      send(panel, path, { key: wait.correlation_key, payload },
        `${approved ? "Approved" : "Denied"} by ${caller.agent_id}`, onDecided);
    };
    const yes = el("button", { type: "button", "data-action": "approve", text: "Approve" });
    const no = el("button", { type: "button", "data-action": "deny", class: "danger",
      text: "Deny" });
    yes.addEventListener("click", answer(true));
    no.addEventListener("click", answer(false));
    form.append(el("label", { for: commentId, class: "field-label", text: "Comment" }), comment,
      el("div", { class: "decisions" }, yes, no));
  } else {
    const editor = jsonEditor(`signal-${wait.node_id}`, "Signal payload (JSON)", "{}");
    const go = el("button", { type: "button", "data-action": "signal", text: "Send signal" });
    go.addEventListener("click", () => {
      let payload;
      try {
        payload = editor.read();
      } catch (err) {
        say(panel, err.message, "bad");
        return;
      }
      send(panel, path, { key: wait.correlation_key, payload },
        `Signal sent by ${caller.agent_id}`, onDecided);
    });
    form.append(editor.node, el("div", { class: "decisions" }, go));
  }
  box.append(form);
  return box;
}

// The panel (null when the job waits for nobody). ``onDecided``: called after a decision was
// accepted (the page then refreshes the job).
async function decisionPanel(jobId, onDecided) {
  const found = await api(`/api/jobs/${encodeURIComponent(jobId)}/decisions`);
  $("#who").textContent = `${found.caller.agent_id} (${found.caller.role})`;
  if (!found.park && !found.waits.length) return null;
  const panel = el("section", { id: "decide", class: "card", "data-version": String(found.version),
    "data-role": found.caller.role });
  panel.append(el("h2", { text: "Decide" }),
    el("p", { class: "hint", text: `Deciding as ${found.caller.agent_id} (${found.caller.role}); `
      + "the decision is recorded in the job's log with your agent and the time." }));
  panel.addEventListener("input", () => { panel.dataset.dirty = "true"; });
  if (found.park) panel.append(parkSection(jobId, found.park, found.caller, panel, onDecided));
  for (const wait of found.waits) {
    panel.append(waitSection(jobId, wait, found.caller, panel, onDecided));
  }
  panel.append(el("p", { id: "decide-status", role: "status", hidden: "" }));
  return panel;
}
