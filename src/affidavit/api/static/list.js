// The job list (/ui/): what waits for a person first (waiting, parked — with since when), then
// every job; each list filtered by status and paged with the API's keyset cursor. The filter
// and the cursors live in the page's query string (never the key).
"use strict";

const PAGE_SIZE = 50;
const NEEDS_PERSON = ["parked", "waiting"];
const ALL_STATUSES = ["waiting", "parked", "pending", "running", "completed", "failed",
  "cancelled"];

function ago(iso) {
  const ms = Date.now() - Date.parse(iso);
  if (!Number.isFinite(ms)) return "";
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 90) return `${s} s ago`;
  if (s < 90 * 60) return `${Math.round(s / 60)} min ago`;
  if (s < 36 * 3600) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} days ago`;
}

function listUrl(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (Array.isArray(v)) v.forEach((x) => q.append(k, x));
    else if (v) q.set(k, v);
  }
  const s = q.toString();
  return s ? `/ui/?${s}` : "/ui/";
}

async function jobsPage(statuses, before, limit) {
  const q = new URLSearchParams({ limit: String(limit) });
  statuses.forEach((s) => q.append("status", s));
  if (before) q.set("before", before);
  return api(`/api/jobs?${q}`);
}

function jobsTable(id, jobs, since) {
  const table = el("table", { id });
  const heads = ["job", "plan", "namespace", "status", since ? "waiting since" : "updated",
    "events", "created"];
  table.append(el("tr", {}, ...heads.map((h) => el("th", { text: h }))));
  for (const job of jobs) {
    table.append(el("tr", { "data-job": job.job_id, "data-status": job.status },
      el("td", {}, el("a", { href: `/ui/jobs/${encodeURIComponent(job.job_id)}`, class: "mono",
        text: job.job_id })),
      el("td", { text: job.plan_name || "" }),
      el("td", { text: job.namespace }),
      el("td", { class: `status s-${job.status}`, text: job.status }),
      el("td", { class: "since", title: job.updated_at,
        text: since ? `${ago(job.updated_at)} (${job.updated_at})` : job.updated_at }),
      el("td", { text: String(job.event_count) }),
      el("td", { text: job.created_at })));
  }
  return table;
}

function pager(page, cursorName, params) {
  const nav = el("p", { class: "pager" });
  if (page.before) {
    nav.append(el("a", { href: listUrl({ ...params, [cursorName]: "" }), "data-page": "first",
      text: "« first page" }), " ");
  }
  if (page.next_before) {
    nav.append(el("a", { href: listUrl({ ...params, [cursorName]: page.next_before }),
      "data-page": "next", text: "next page »" }));
  }
  return nav;
}

async function renderList(content) {
  const query = new URLSearchParams(window.location.search);
  const statuses = query.getAll("status").filter((s) => ALL_STATUSES.includes(s));
  const asked = Number.parseInt(query.get("limit") || "", 10);
  const limit = asked >= 1 && asked <= 1000 ? asked : PAGE_SIZE;
  const params = { status: statuses, before: query.get("before") || "",
    wbefore: query.get("wbefore") || "", limit: limit === PAGE_SIZE ? "" : String(limit) };

  const filter = el("select", { id: "status-filter", "aria-label": "status" },
    el("option", { value: "", text: "all (waiting for a person first)" }),
    ...ALL_STATUSES.map((s) => el("option", { value: s, text: s })));
  filter.value = statuses.length === 1 ? statuses[0] : "";
  filter.addEventListener("change", () => {
    window.location.assign(listUrl({ status: filter.value ? [filter.value] : [],
      limit: params.limit }));
  });
  content.append(el("h1", { text: "Jobs" }), el("p", { class: "filters" },
    el("label", { for: "status-filter", text: "Status " }), filter));

  if (!statuses.length) {
    const waiting = await jobsPage(NEEDS_PERSON, params.wbefore, limit);
    content.append(el("h2", { text: "Waiting for a person" }));
    if (waiting.jobs.length) {
      content.append(jobsTable("waiting", waiting.jobs, true), pager(waiting, "wbefore", params));
    } else {
      content.append(el("p", { id: "waiting-none", text: "Nothing waits for a person." }));
    }
    content.append(el("h2", { text: "All jobs" }));
  }
  const page = await jobsPage(statuses, params.before, limit);
  const since = statuses.length > 0 && statuses.every((s) => NEEDS_PERSON.includes(s));
  content.append(jobsTable("jobs", page.jobs, since), pager(page, "before", params));
  if (!page.jobs.length) {
    content.append(el("p", { text: statuses.length ? "No job with this status."
      : "No jobs in your namespace yet." }));
  }
}
