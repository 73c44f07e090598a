// One job: status and actions, progress with ETA, live loss / learning-rate charts fed by the
// event stream, checkpoints, events, a playground to talk to the model, logs and the resolved spec.

import { getJson, postJson, request } from "../lib/api.js";
import { LiveChart } from "../lib/chart.js";
import { h, replace } from "../lib/dom.js";
import { formatDuration, formatNumber, formatShortTime, jobDuration } from "../lib/format.js";
import { followEventStream } from "../lib/sse.js";
import { busy, copyButton, errorBox, poll, progressBar, statusBadge, toast } from "../lib/ui.js";
import { CheckpointsPanel, EventsPanel, LogsPanel, SamplesPanel } from "./job-panels.js";
import { PlaygroundPanel } from "./playground.js";

const POLL_MS = 2000;
const LOG_POLL_MS = 3000;

// How each action looks. Which ones a job offers, and in what order, is the server's to say:
// `job.actions` (an action this map does not know gets a button labelled with its name, which
// POSTs to /v1/jobs/{id}/{action}).
export const ACTION_LOOKS = {
  pause: { label: "Pause" },
  resume: { label: "Resume" },
  cancel: {
    label: "Cancel",
    danger: true,
    confirm: (job) => `Cancel ${job.name || job.id}? Running processes are stopped.`,
  },
  clone: { label: "Clone" },
  delete: {
    label: "Delete",
    danger: true,
    confirm: (job) => `Delete ${job.name || job.id}? Its logs, checkpoints and events go with it.`,
  },
};

export function actionLook(key) {
  const look = ACTION_LOOKS[key] || {};
  return { key, label: look.label || key.charAt(0).toUpperCase() + key.slice(1), ...look };
}

function stat(label, value, key) {
  return h("div", { class: "stat", dataset: { stat: key } }, h("dt", {}, label), h("dd", {}, value));
}

export async function mount(root, { params, navigate }) {
  const jobId = params.id;
  const path = `/v1/jobs/${encodeURIComponent(jobId)}`;
  let job = await getJson(path);
  const stops = [];
  const controller = new AbortController();
  let streaming = false; // one stream at a time; restarted when a resumed job goes live again

  const lossChart = new LiveChart({
    title: "Loss",
    series: [
      { name: "loss", label: "train loss" },
      { name: "eval_loss", label: "eval loss" },
    ],
  });
  const lrChart = new LiveChart({
    title: "Learning rate",
    series: [{ name: "lr", label: "lr" }],
    yFormat: (v) => formatNumber(v, 3),
  });
  const checkpoints = new CheckpointsPanel(jobId, {
    onResumed: (updated) => update(updated),
    lossAt: (step) => lossChart.data.get("loss").get(step),
  });
  const events = new EventsPanel();
  const samples = new SamplesPanel(jobId);
  const logs = new LogsPanel(jobId);
  const playground = new PlaygroundPanel(jobId);

  const title = h("h1", { class: "job-title" });
  const badge = h("span");
  const actions = h("div", { class: "actions" });
  const errorSlot = h("div");
  const progressSlot = h("div", { class: "progress-wrap" });
  const stats = h("dl", { class: "stats" });
  const streamState = h("span", { class: "stream-state", dataset: { state: "connecting" } }, "connecting…");
  const specPre = h("pre", { class: "spec mono" });

  root.append(
    h(
      "section",
      { class: "page job-page", dataset: { jobId } },
      h("a", { class: "back", href: "#/jobs" }, "← Jobs"),
      h(
        "div",
        { class: "page-head" },
        h(
          "div",
          {},
          h("div", { class: "title-row" }, title, badge),
          h("div", { class: "mono small muted id-row" }, jobId, copyButton(jobId, "Copy id")),
        ),
        actions,
      ),
      errorSlot,
      h("section", { class: "card progress-card", "aria-label": "Progress" }, progressSlot, stats),
      h("div", { class: "charts" }, lossChart.el, lrChart.el),
      samples.el,
      h("div", { class: "split" }, checkpoints.el, events.el),
      playground.el,
      logs.el,
      h(
        "details",
        { class: "card panel spec-card" },
        h("summary", {}, h("h2", {}, "Resolved spec")),
        specPre,
      ),
      h("p", { class: "footnote" }, "Live updates: ", streamState),
    ),
  );

  function renderActions() {
    replace(
      actions,
      (job.actions || []).map(actionLook).map((a) =>
        h(
          "button",
          {
            type: "button",
            class: ["btn", a.danger && "danger"],
            dataset: { action: a.key },
            onClick: (e) => act(a, e.currentTarget),
          },
          a.label,
        ),
      ),
      h(
        "a",
        {
          class: "btn ghost",
          href: `#/new?from=${encodeURIComponent(jobId)}`,
          title: "Open the submit form filled with this job's spec",
        },
        "Edit & resubmit",
      ),
    );
  }

  function render() {
    document.title = `${job.name || job.id} · Twinkle Jobs`;
    title.textContent = job.name || job.id;
    replace(badge, statusBadge(job.status));
    renderActions();
    const p = job.progress || {};
    const total = p.total_steps;
    const percent =
      p.percent ?? (total ? (100 * (p.step || 0)) / total : job.status === "succeeded" ? 100 : null);
    replace(
      progressSlot,
      h(
        "div",
        { class: "progress-head" },
        h(
          "span",
          { class: "progress-steps mono" },
          total ? `step ${p.step ?? 0} / ${total}` : `step ${p.step ?? 0}`,
        ),
        h(
          "span",
          { class: "progress-percent mono" },
          percent === null ? "" : `${percent.toFixed(percent < 10 ? 1 : 0)}%`,
        ),
      ),
      progressBar(job.terminal && percent === null ? 0 : percent, { label: "Training progress" }),
    );
    const eta = job.terminal ? "—" : formatDuration(p.eta_seconds);
    replace(
      stats,
      stat("ETA", eta, "eta"),
      stat("Elapsed", formatDuration(jobDuration(job)), "elapsed"),
      stat("Loss", formatNumber(p.loss), "loss"),
      stat("Learning rate", formatNumber(p.lr, 3), "lr"),
      stat("Tokens / s", formatNumber(p.tokens_per_second, 3), "tokens"),
      stat("Epoch", formatNumber(p.epoch, 3), "epoch"),
      stat("Attempt", `${job.attempt} of ${job.max_retries + 1}`, "attempt"),
      job.queue_position
        ? stat("Queue position", String(job.queue_position), "queue")
        : stat("Started", formatShortTime(job.started_at), "started"),
      // A job handed to Ray or Slurm: the engine's own id and state, to find it there.
      job.engine
        ? stat(
            `On ${job.engine.name}`,
            `${job.engine.job_id ?? "—"} · ${job.engine.state ?? "—"}`,
            "engine",
          )
        : null,
    );
    replace(
      errorSlot,
      job.error
        ? errorBox(
            { message: job.error.message, code: job.error.kind },
            `${job.status === "failed" ? "The job failed" : "The last attempt failed"} (${job.error.kind} error)`,
          )
        : null,
    );
    specPre.textContent = JSON.stringify(job.spec, null, 2);
  }

  function update(next) {
    const wasLive = !job.terminal;
    const before = job.status;
    job = next;
    render();
    checkpoints.actions = job.actions;
    if (!job.terminal && !streaming) startStream();
    if (wasLive && job.terminal) {
      // Final numbers: every event is committed once the run has ended.
      checkpoints.refresh(job.actions);
      logs.refresh();
      loadMetrics();
      playground.refresh(job); // the final model, once it succeeded
    } else if (before !== job.status) {
      // pausing -> paused enables "Resume from here", running -> queued disables it.
      checkpoints.refresh(job.actions);
    }
  }

  async function act(action, button) {
    if (action.confirm && !confirm(action.confirm(job))) return;
    await busy(button, async () => {
      if (action.key === "clone") {
        const clone = await postJson(`${path}/clone`, {});
        toast(`Cloned as ${clone.id}`, "success");
        navigate(`/jobs/${encodeURIComponent(clone.id)}`);
        return;
      }
      if (action.key === "delete") {
        await request(path, { method: "DELETE" });
        toast(`Deleted ${job.name || job.id}`, "success");
        navigate("/jobs");
        return;
      }
      update(await postJson(`${path}/${encodeURIComponent(action.key)}`, {}));
      toast(`${action.label}: the job is now ${job.status}`, "success");
      checkpoints.refresh(job.actions);
    });
  }

  async function loadMetrics() {
    try {
      const metrics = await getJson(`${path}/metrics`);
      // Tolerate `{series: {name: [{step, value}]}}` and `{name: [[step, value]]}`.
      const series = metrics.series || metrics;
      for (const name of ["loss", "eval_loss", "lr"]) {
        const points = (series[name] || []).map((p) => (Array.isArray(p) ? p : [p.step, p.value]));
        (name === "lr" ? lrChart : lossChart).set(name, points);
      }
    } catch (err) {
      toast(`Metrics: ${err.message}`, "error");
    }
  }

  function onEvent(event, raw) {
    if (raw.event === "end") {
      refreshJob();
      return;
    }
    events.add(event);
    samples.add(event);
    const data = event.data || {};
    const step = Number(data.step);
    if (Number.isFinite(step)) {
      if (typeof data.loss === "number") lossChart.add("loss", step, data.loss);
      if (typeof data.eval_loss === "number") lossChart.add("eval_loss", step, data.eval_loss);
      if (typeof data.lr === "number") lrChart.add("lr", step, data.lr);
    }
    if (event.type === "checkpoint") {
      checkpoints.refresh();
      playground.refresh(job);
    }
    if (event.type === "status") refreshJob();
  }

  function startStream() {
    streaming = true;
    followEventStream(`${path}/events/stream`, {
      signal: controller.signal,
      lastEventId: events.lastId(),
      onEvent,
      onState: (state, err) => {
        streamState.dataset.state = state;
        streamState.textContent =
          {
            live: "connected",
            reconnecting: "reconnecting…",
            closed: "closed (job finished)",
            error: `error: ${err?.message}`,
          }[state] || state;
      },
      shouldReconnect: async () => !((await refreshJob()) ?? job).terminal,
    }).finally(() => {
      streaming = false;
    });
  }

  async function refreshJob() {
    try {
      update(await getJson(path));
    } catch (err) {
      if (err.name !== "AbortError") console.warn("job refresh failed", err);
    }
    return job;
  }

  render();
  checkpoints.actions = job.actions;
  const [initialEvents] = await Promise.all([
    getJson(`${path}/events`, { order: "desc", limit: 100 }).catch(() => ({ data: [] })),
    // Checkpoints after the metrics: a row without metrics of its own shows the charted loss.
    loadMetrics().then(() => checkpoints.refresh(job.actions)),
    logs.refresh(),
    samples.refresh(),
    playground.refresh(job),
  ]);
  for (const event of initialEvents.data.reverse()) events.add(event);
  events.render();
  if (!job.terminal) startStream();
  else {
    streamState.dataset.state = "closed";
    streamState.textContent = "job finished";
  }
  stops.push(poll(async () => !job.terminal && refreshJob(), POLL_MS));
  stops.push(poll(async () => !job.terminal && logs.refresh(), LOG_POLL_MS));

  return () => {
    controller.abort();
    for (const stop of stops) stop();
    lossChart.destroy();
    lrChart.destroy();
    events.destroy();
    playground.destroy();
  };
}
