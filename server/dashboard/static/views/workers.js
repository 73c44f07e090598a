// Workers: where jobs run, which GPUs are busy, and how fresh each heartbeat is.

import { getJson } from "../lib/api.js";
import { h, replace } from "../lib/dom.js";
import { formatAgo, formatDateTime, parseTime } from "../lib/format.js";
import { emptyState, errorBox, poll } from "../lib/ui.js";

const POLL_MS = 5000;
const STALE_AFTER_S = 30; // matches the server's default stale_after_seconds

function gpuChips(worker) {
  const gpus = worker.gpus || [];
  if (!gpus.length)
    return h("span", { class: "muted" }, `CPU · ${worker.slots ?? 1} slot${worker.slots === 1 ? "" : "s"}`);
  const busy = new Set((worker.busy_gpus || []).map(String));
  // GPUs of the machine a serving host holds (twinkle-jobs serve): not given to training.
  const serving = new Set((worker.serving_gpus || []).map(String));
  const state = (gpu) => (busy.has(gpu) ? "busy" : serving.has(gpu) ? "serving" : "free");
  const titles = { busy: "in use by a job", serving: "held by a serving host", free: "free" };
  return h(
    "span",
    { class: "gpus" },
    gpus.map((gpu) => {
      const s = state(String(gpu));
      return h("span", { class: ["gpu", s !== "free" && s], title: titles[s] }, `GPU ${gpu}`);
    }),
  );
}

function heartbeat(worker) {
  const at = worker.last_heartbeat_at || worker.heartbeat_at;
  const age = (Date.now() - (parseTime(at) ?? 0)) / 1000;
  const stale = age > STALE_AFTER_S;
  return h(
    "span",
    { class: stale ? "stale" : "", title: formatDateTime(at) },
    formatAgo(at),
    stale ? " (stale)" : "",
  );
}

function workerRow(worker) {
  const jobs = worker.running_job_ids || [];
  return h(
    "tr",
    { dataset: { workerId: worker.id } },
    h(
      "td",
      {},
      h("span", { class: `badge worker-${worker.status}` }, h("i", { "aria-hidden": "true" }), worker.status),
    ),
    h("td", {}, h("strong", {}, worker.host), h("div", { class: "mono small muted" }, worker.id)),
    h("td", {}, gpuChips(worker)),
    h(
      "td",
      {},
      jobs.length
        ? jobs.map((id) =>
            h("a", { class: "mono small block", href: `#/jobs/${encodeURIComponent(id)}` }, id),
          )
        : h("span", { class: "muted" }, String(worker.running_jobs ?? 0)),
    ),
    h("td", {}, heartbeat(worker)),
    h("td", { title: formatDateTime(worker.started_at) }, formatAgo(worker.started_at)),
  );
}

export async function mount(root) {
  const body = h("div", { class: "card table-card" }, h("p", { class: "muted loading" }, "Loading workers…"));
  root.append(
    h("section", { class: "page" }, h("div", { class: "page-head" }, h("h1", {}, "Workers")), body),
  );

  async function refresh() {
    try {
      const page = await getJson("/v1/workers");
      if (!page.data.length) {
        replace(
          body,
          emptyState(
            "No workers registered",
            h("span", {}, "Start one with ", h("code", {}, "twinkle-jobs worker"), "."),
          ),
        );
        return;
      }
      replace(
        body,
        h(
          "div",
          { class: "table-scroll" },
          h(
            "table",
            { class: "table workers-table" },
            h(
              "thead",
              {},
              h(
                "tr",
                {},
                ["Status", "Host", "GPUs", "Running jobs", "Last heartbeat", "Started"].map((t) =>
                  h("th", { scope: "col" }, t),
                ),
              ),
            ),
            h("tbody", {}, page.data.map(workerRow)),
          ),
        ),
      );
    } catch (err) {
      replace(body, errorBox(err, "Could not load the workers"));
    }
  }

  return poll(refresh, POLL_MS);
}
