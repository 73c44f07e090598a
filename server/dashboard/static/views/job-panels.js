// The panels of the job page: checkpoints, events and logs. Each owns its element and a
// refresh/add method; the page decides when to call them.

import { downloadFile, getJson, postJson } from "../lib/api.js";
import { h, replace } from "../lib/dom.js";
import { formatAgo, formatBytes, formatDateTime, formatNumber, formatShortTime } from "../lib/format.js";
import { busy, emptyState, errorBox, toast } from "../lib/ui.js";

// A checkpoint's own metrics, else the training loss charted at its step (runs without
// evaluation save checkpoints with no metrics of their own).
function metricsText(metrics, trainLoss) {
  const entries = Object.entries(metrics || {}).filter(([, v]) => typeof v === "number");
  if (entries.length) return entries.map(([k, v]) => `${k} ${formatNumber(v)}`).join(" · ");
  return typeof trainLoss === "number" ? `train loss ${formatNumber(trainLoss)}` : "—";
}

export class CheckpointsPanel {
  constructor(jobId, { onResumed, lossAt = () => undefined }) {
    this.jobId = jobId;
    this.onResumed = onResumed;
    this.lossAt = lossAt;
    this.actions = []; // the job's `actions`: "Resume from here" is offered when it has "resume"
    this.body = h("div", { class: "panel-body" }, h("p", { class: "muted" }, "Loading…"));
    this.el = h(
      "section",
      { class: "card panel", "aria-labelledby": "ckpt-title" },
      h("h2", { id: "ckpt-title" }, "Checkpoints"),
      this.body,
    );
  }

  async refresh(actions = this.actions) {
    this.actions = actions || [];
    try {
      const page = await getJson(`/v1/jobs/${encodeURIComponent(this.jobId)}/checkpoints`, { limit: 100 });
      this.render(page.data);
    } catch (err) {
      replace(this.body, errorBox(err, "Could not load the checkpoints"));
    }
  }

  render(checkpoints) {
    if (!checkpoints.length) {
      replace(
        this.body,
        emptyState("No checkpoints yet", "Set training.save_every to save during training."),
      );
      return;
    }
    const canResume = this.actions.includes("resume");
    const rows = checkpoints.map((c) =>
      h(
        "tr",
        { dataset: { checkpointId: c.id, step: c.step } },
        h(
          "td",
          { class: "mono num" },
          String(c.step),
          c.is_best ? h("span", { class: "best", title: "Best checkpoint" }, " ★ best") : null,
        ),
        h("td", { class: "mono small" }, metricsText(c.metrics, this.lossAt(c.step))),
        h("td", { class: "num" }, formatBytes(c.size_bytes)),
        h("td", { title: formatDateTime(c.created_at) }, formatAgo(c.created_at)),
        h(
          "td",
          { class: "actions" },
          h(
            "button",
            {
              type: "button",
              class: "btn tiny",
              dataset: { action: "download" },
              onClick: (e) => this.download(e.currentTarget, c),
            },
            "Download",
          ),
          h(
            "button",
            {
              type: "button",
              class: "btn tiny",
              dataset: { action: "resume-from" },
              disabled: !canResume,
              title: canResume
                ? `Resume the job from step ${c.step}`
                : "Pause, cancel or wait for a failure to resume from a checkpoint",
              onClick: (e) => this.resume(e.currentTarget, c),
            },
            "Resume from here",
          ),
        ),
      ),
    );
    replace(
      this.body,
      h(
        "div",
        { class: "table-scroll" },
        h(
          "table",
          { class: "table checkpoints-table" },
          h(
            "thead",
            {},
            h(
              "tr",
              {},
              ["Step", "Metrics", "Size", "Saved", ""].map((t) => h("th", { scope: "col" }, t)),
            ),
          ),
          h("tbody", {}, rows),
        ),
      ),
    );
  }

  download(button, checkpoint) {
    const path = `/v1/jobs/${encodeURIComponent(this.jobId)}/checkpoints/${encodeURIComponent(checkpoint.id)}/download`;
    return busy(button, async () => {
      const saved = await downloadFile(path, `${this.jobId}-step-${checkpoint.step}.tar`);
      toast(`Downloaded ${saved.name} (${formatBytes(saved.size)})`, "success");
    });
  }

  resume(button, checkpoint) {
    return busy(button, async () => {
      const job = await postJson(`/v1/jobs/${encodeURIComponent(this.jobId)}/resume`, {
        checkpoint: checkpoint.id,
      });
      toast(`Resuming from step ${checkpoint.step}`, "success");
      this.onResumed(job);
    });
  }
}

const LEVEL_ICON = { info: "•", warn: "▲", warning: "▲", error: "✖" };
const MAX_EVENTS = 500;

export class EventsPanel {
  constructor() {
    this.events = new Map(); // id -> event; a replayed event replaces itself
    this.showMetrics = false;
    const toggle = h("input", {
      type: "checkbox",
      id: "show-metric-events",
      onChange: (e) => this.setShowMetrics(e.target.checked),
    });
    this.list = h("ol", { class: "events", "aria-live": "off" });
    this.el = h(
      "section",
      { class: "card panel", "aria-labelledby": "events-title" },
      h(
        "div",
        { class: "panel-head" },
        h("h2", { id: "events-title" }, "Events"),
        h("label", { class: "check small" }, toggle, "metrics events"),
      ),
      h("div", { class: "panel-body scroll" }, this.list),
    );
  }

  setShowMetrics(value) {
    this.showMetrics = value;
    this.render();
  }

  add(event) {
    if (event?.id === undefined || event.id === null) return;
    this.events.set(event.id, event);
    if (this.events.size > MAX_EVENTS) this.events.delete(this.events.keys().next().value);
    this.scheduleRender();
  }

  lastId() {
    let last = null;
    for (const id of this.events.keys()) if (last === null || id > last) last = id;
    return last;
  }

  scheduleRender() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      this.render();
    });
  }

  render() {
    const shown = [...this.events.values()]
      .filter((e) => this.showMetrics || e.type !== "metrics")
      .sort((a, b) => b.id - a.id);
    if (!shown.length) {
      replace(this.list, h("li", { class: "muted" }, "No events yet"));
      return;
    }
    replace(
      this.list,
      shown.map((e) =>
        h(
          "li",
          { class: `event level-${e.level} type-${e.type}`, dataset: { eventId: e.id, type: e.type } },
          h(
            "time",
            { datetime: e.created_at, title: formatDateTime(e.created_at) },
            formatShortTime(e.created_at),
          ),
          h("span", { class: "event-level", "aria-label": e.level }, LEVEL_ICON[e.level] || "•"),
          h("span", { class: "event-type" }, e.type),
          h("span", { class: "event-message" }, e.message),
        ),
      ),
    );
  }

  destroy() {
    cancelAnimationFrame(this.frame);
  }
}

// "attempt-1-ranks/<run id>/attempt_0/0/stderr.log" → "rank 0 · stderr"; other names stay as they are.
export function logLabel(name) {
  const rank = /(?:^|\/)(\d+)\/(std(?:out|err))\.log$/.exec(name);
  return rank ? `rank ${rank[1]} · ${rank[2]}` : name;
}

export class LogsPanel {
  constructor(jobId) {
    this.jobId = jobId;
    this.selected = null;
    this.tabs = h("div", { class: "tabs", role: "tablist", "aria-label": "Log files" });
    this.pre = h("pre", { class: "log", tabindex: "0", "aria-label": "Log tail" }, "Loading…");
    this.note = h("p", { class: "hint" });
    this.el = h(
      "section",
      { class: "card panel", "aria-labelledby": "logs-title" },
      h("div", { class: "panel-head" }, h("h2", { id: "logs-title" }, "Logs"), this.tabs),
      this.pre,
      this.note,
    );
  }

  async refresh() {
    try {
      const logs = await getJson(`/v1/jobs/${encodeURIComponent(this.jobId)}/logs`, { lines: 200 });
      this.render(logs.files || []);
    } catch (err) {
      this.pre.textContent = err.message;
    }
  }

  render(files) {
    if (!files.length) {
      replace(this.tabs);
      this.pre.textContent = "No logs yet: they appear once a worker starts the job.";
      this.note.textContent = "";
      return;
    }
    // Start on a file that has something to show (the attempt log is empty until torchrun prints).
    if (!files.some((f) => f.name === this.selected))
      this.selected = (files.find((f) => f.lines.length) || files[0]).name;
    replace(
      this.tabs,
      files.map((f) =>
        h(
          "button",
          {
            type: "button",
            role: "tab",
            class: "tab",
            "aria-selected": String(f.name === this.selected),
            title: f.name,
            onClick: () => {
              this.selected = f.name;
              this.render(files);
            },
          },
          logLabel(f.name),
        ),
      ),
    );
    const file = files.find((f) => f.name === this.selected);
    // Keep following the tail only when the reader is already at the bottom.
    const atBottom = this.pre.scrollTop + this.pre.clientHeight >= this.pre.scrollHeight - 8;
    this.pre.textContent = file.lines.length ? file.lines.join("\n") : "(empty)";
    if (atBottom) this.pre.scrollTop = this.pre.scrollHeight;
    this.note.textContent = file.truncated ? `Last ${file.lines.length} lines.` : "";
  }
}

// What the model says while it trains (training.sample_every + sample_prompts): the newest
// sampled step first, each prompt with the completion the current weights gave it. Hidden
// until the job has samples.
const MAX_SAMPLE_STEPS = 20;

export class SamplesPanel {
  constructor(jobId) {
    this.jobId = jobId;
    this.byStep = new Map(); // step -> [{prompt, completion}]; a replayed step replaces itself
    this.body = h("div", { class: "panel-body scroll" });
    this.el = h(
      "section",
      { class: "card panel samples", "aria-labelledby": "samples-title", hidden: true },
      h("h2", { id: "samples-title" }, "Samples"),
      this.body,
    );
  }

  async refresh() {
    try {
      const path = `/v1/jobs/${encodeURIComponent(this.jobId)}/events`;
      const page = await getJson(path, { type: "sample", order: "desc", limit: MAX_SAMPLE_STEPS });
      for (const event of page.data) this.add(event, false);
      this.render();
    } catch (err) {
      this.el.hidden = false;
      replace(this.body, errorBox(err, "Could not load the samples"));
    }
  }

  add(event, render = true) {
    if (event?.type !== "sample") return;
    const data = event.data || {};
    const step = Number(data.step);
    if (!Number.isFinite(step) || !Array.isArray(data.samples)) return;
    this.byStep.set(step, data.samples);
    if (render) this.render();
  }

  render() {
    const steps = [...this.byStep.keys()].sort((a, b) => b - a).slice(0, MAX_SAMPLE_STEPS);
    this.el.hidden = steps.length === 0;
    replace(
      this.body,
      steps.map((step) =>
        h(
          "article",
          { class: "sample-step", dataset: { step } },
          h("h3", {}, `Step ${step}`),
          h(
            "dl",
            {},
            this.byStep.get(step).map((s) => [
              h("dt", { class: "sample-prompt" }, String(s.prompt ?? "")),
              h("dd", { class: "sample-completion mono" }, String(s.completion ?? "") || "(empty)"),
            ]),
          ),
        ),
      ),
    );
  }
}
