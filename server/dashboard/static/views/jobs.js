// The jobs list: status filter chips, live status (polled every 2 s) and cursor pagination.

import { getJson } from "../lib/api.js";
import { h, replace } from "../lib/dom.js";
import {
  formatAgo,
  formatDateTime,
  formatDuration,
  formatNumber,
  jobDuration,
  shortRef,
} from "../lib/format.js";
import { emptyState, errorBox, poll, progressBar, statusBadge } from "../lib/ui.js";

const PAGE = 20;
const MAX_LIMIT = 100; // the API's largest page
const POLL_MS = 2000;

// Each chip is a set of statuses the API filters on (`status=a&status=b`); [] = every job. The
// groups are presentation only: the statuses themselves are the server's (its OpenAPI document
// lists them), and "All" filters nothing, so a job in a status no chip names still shows there.
export const FILTERS = [
  { key: "all", label: "All", statuses: [] },
  {
    key: "active",
    label: "Active",
    statuses: ["queued", "starting", "running", "pausing", "cancelling", "retrying"],
  },
  { key: "running", label: "Running", statuses: ["starting", "running"] },
  { key: "queued", label: "Queued", statuses: ["queued", "retrying"] },
  { key: "paused", label: "Paused", statuses: ["pausing", "paused"] },
  { key: "succeeded", label: "Succeeded", statuses: ["succeeded"] },
  { key: "failed", label: "Failed", statuses: ["failed"] },
  { key: "cancelled", label: "Cancelled", statuses: ["cancelling", "cancelled"] },
];

function progressCell(job) {
  const p = job.progress || {};
  const total = p.total_steps;
  const text = total ? `${p.step ?? 0} / ${total}` : p.step ? `step ${p.step}` : "—";
  const percent = p.percent ?? (total ? (100 * (p.step || 0)) / total : job.status === "succeeded" ? 100 : 0);
  return h(
    "td",
    { class: "col-progress" },
    progressBar(percent, { compact: true, label: `${job.id} progress` }),
    h("span", { class: "mono small" }, text),
  );
}

function jobRow(job, navigate) {
  const model = job.spec?.model?.model_id || (job.spec?.model?.config ? "config" : null);
  const row = h(
    "tr",
    { dataset: { jobId: job.id, status: job.status }, class: "clickable" },
    h("td", {}, statusBadge(job.status)),
    h(
      "td",
      { class: "col-name" },
      h("a", { href: `#/jobs/${encodeURIComponent(job.id)}`, class: "job-link" }, job.name || job.id),
      h("div", { class: "mono small muted" }, job.id),
    ),
    h("td", { class: "mono small", title: model || "" }, shortRef(model)),
    progressCell(job),
    h("td", { class: "mono num" }, formatNumber(job.progress?.loss)),
    h("td", { title: formatDateTime(job.created_at) }, formatAgo(job.created_at)),
    h("td", { class: "num" }, formatDuration(jobDuration(job))),
  );
  // The whole row opens the job; the link inside stays the keyboard and screen-reader path.
  row.addEventListener("click", (event) => {
    if (!event.target.closest("a, button")) navigate(`/jobs/${encodeURIComponent(job.id)}`);
  });
  return row;
}

export async function mount(root, { query, navigate }) {
  let filter = FILTERS.find((f) => f.key === query.get("status")) || FILTERS[0];
  let items = [];
  let hasMore = false;
  let loadError = null;
  let version = 0; // bumped by a filter change: answers for the previous filter are dropped

  const chips = h(
    "div",
    { class: "chips", role: "toolbar", "aria-label": "Filter jobs by status" },
    FILTERS.map((f) =>
      h(
        "button",
        {
          type: "button",
          class: "chip",
          dataset: { filter: f.key },
          "aria-pressed": String(f === filter),
          onClick: () => setFilter(f),
        },
        f.label,
      ),
    ),
  );
  const tbody = h("tbody");
  const table = h(
    "table",
    { class: "table jobs-table" },
    h("caption", { class: "visually-hidden" }, "Training jobs, newest first"),
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        ["Status", "Job", "Model", "Progress", "Loss", "Created", "Duration"].map((t) =>
          h("th", { scope: "col" }, t),
        ),
      ),
    ),
    tbody,
  );
  const body = h("div", { class: "card table-card" }, h("p", { class: "muted loading" }, "Loading jobs…"));
  const more = h(
    "button",
    { type: "button", class: "btn", hidden: true, onClick: () => loadMore() },
    "Load more",
  );
  const live = h("span", { class: "live-dot", title: "Refreshing every 2 s" }, "live");
  root.append(
    h(
      "section",
      { class: "page" },
      h(
        "div",
        { class: "page-head" },
        h("h1", {}, "Jobs", live),
        h("a", { class: "btn primary", href: "#/new" }, "New job"),
      ),
      chips,
      body,
      h("div", { class: "more" }, more),
    ),
  );

  // expand=spec: a row shows the model id, and lists leave the spec out unless asked.
  const params = (extra) => ({ status: filter.statuses, expand: "spec", ...extra });

  function render() {
    if (loadError) replace(body, errorBox(loadError, "Could not load the jobs"));
    else if (items.length === 0) {
      replace(
        body,
        emptyState(
          filter.key === "all" ? "No jobs yet" : `No ${filter.label.toLowerCase()} jobs`,
          filter.key === "all" ? "Submit a fine-tuning job to see it here." : null,
          filter.key === "all" ? h("a", { class: "btn primary", href: "#/new" }, "New job") : null,
        ),
      );
    } else {
      replace(
        tbody,
        items.map((job) => jobRow(job, navigate)),
      );
      if (!body.contains(table)) replace(body, h("div", { class: "table-scroll" }, table));
    }
    more.hidden = !hasMore || Boolean(loadError);
  }

  // Refresh every loaded row (up to the API's page limit) in one request.
  async function refresh() {
    const limit = Math.min(MAX_LIMIT, Math.max(PAGE, items.length));
    const mine = version;
    try {
      const page = await getJson("/v1/jobs", params({ limit }));
      if (mine !== version) return;
      const fresh = new Set(page.data.map((job) => job.id));
      const older =
        items.length > MAX_LIMIT ? items.slice(MAX_LIMIT).filter((job) => !fresh.has(job.id)) : [];
      items = [...page.data, ...older];
      hasMore = older.length ? hasMore : page.has_more;
      loadError = null;
    } catch (err) {
      if (mine !== version) return;
      loadError = err;
    }
    render();
  }

  async function loadMore() {
    more.disabled = true;
    const mine = version;
    try {
      const page = await getJson("/v1/jobs", params({ limit: PAGE, after: items[items.length - 1]?.id }));
      if (mine !== version) return;
      const known = new Set(items.map((job) => job.id));
      items = [...items, ...page.data.filter((job) => !known.has(job.id))];
      hasMore = page.has_more;
      render();
    } catch (err) {
      loadError = err;
      render();
    } finally {
      more.disabled = false;
    }
  }

  function setFilter(next) {
    filter = next;
    for (const chip of chips.children)
      chip.setAttribute("aria-pressed", String(chip.dataset.filter === next.key));
    history.replaceState(null, "", next.key === "all" ? "#/jobs" : `#/jobs?status=${next.key}`);
    version += 1;
    items = [];
    hasMore = false;
    refresh();
  }

  return poll(refresh, POLL_MS);
}
