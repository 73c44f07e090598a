// The playground of the job page: a prompt in, the model's answer streamed out, from the job's
// final model or any of its checkpoints. It speaks the server's OpenAI endpoint
// (POST /v1/chat/completions with stream: true) and reads the SSE body with fetch + a
// ReadableStream; Stop aborts the fetch, which closes the connection and frees the server's
// generation slot.

import { ApiError, getJson, request } from "../lib/api.js";
import { h, replace } from "../lib/dom.js";
import { formatNumber } from "../lib/format.js";
import { SseParser } from "../lib/sse.js";
import { errorBox } from "../lib/ui.js";

const DEFAULTS = { temperature: 0.7, max_tokens: 128 };

/**
 * POST a streamed chat completion; calls `onDelta(text)` per token and resolves to
 * `{finishReason, deltas}` at `data: [DONE]`. Rejects with ApiError (the envelope) when the
 * server refuses the request or reports an error mid-stream, with AbortError when `signal` aborts.
 */
export async function streamChat(body, { signal, onDelta }) {
  const response = await request("/v1/chat/completions", {
    method: "POST",
    body: { ...body, stream: true },
    headers: { Accept: "text/event-stream" },
    signal,
  });
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  const parser = new SseParser();
  let finishReason = null;
  let deltas = 0;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return { finishReason, deltas }; // closed without [DONE]: what came is the answer
      for (const event of parser.push(value)) {
        if (event.data === "[DONE]") return { finishReason, deltas };
        const chunk = JSON.parse(event.data);
        if (chunk.error) throw new ApiError(500, chunk.error);
        for (const choice of chunk.choices || []) {
          if (choice.finish_reason) finishReason = choice.finish_reason;
          const text = choice.delta?.content;
          if (text) {
            deltas += 1;
            onDelta(text);
          }
        }
      }
    }
  } finally {
    reader.releaseLock();
  }
}

function field(label, input, hint) {
  return h(
    "div",
    { class: "field" },
    h("label", {}, label, input),
    hint ? h("p", { class: "hint" }, hint) : null,
  );
}

export class PlaygroundPanel {
  constructor(jobId) {
    this.jobId = jobId;
    this.controller = null; // the running generation's, while one runs
    this.model = h("select", {
      name: "model",
      "aria-label": "Model",
      onChange: () => this.showModelName(),
    });
    // The name to pass as `model` to the OpenAI client or `twinkle-jobs chat`, ready to copy.
    this.modelName = h("code", { class: "mono", dataset: { role: "model-name" } });
    this.prompt = h("textarea", {
      name: "prompt",
      rows: 3,
      placeholder: "Ask the fine-tuned model something… (Ctrl+Enter sends)",
      "aria-label": "Prompt",
      onKeydown: (e) => {
        if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) this.send();
      },
    });
    this.temperature = h("input", {
      type: "number",
      name: "temperature",
      min: 0,
      max: 2,
      step: 0.1,
      value: DEFAULTS.temperature,
    });
    this.maxTokens = h("input", {
      type: "number",
      name: "max_tokens",
      min: 1,
      max: 4096,
      step: 1,
      value: DEFAULTS.max_tokens,
    });
    this.sendButton = h(
      "button",
      { type: "submit", class: "btn primary", dataset: { action: "send" } },
      "Send",
    );
    this.stopButton = h(
      "button",
      {
        type: "button",
        class: "btn",
        dataset: { action: "stop" },
        disabled: true,
        onClick: () => this.stop(),
      },
      "Stop",
    );
    this.answer = h("pre", {
      class: "playground-answer mono",
      "aria-live": "polite",
      "aria-label": "Answer",
    });
    this.status = h("p", { class: "playground-status small muted", dataset: { state: "idle" } });
    this.errorSlot = h("div");
    this.form = h(
      "form",
      {
        class: "playground-form",
        onSubmit: (e) => {
          e.preventDefault();
          this.send();
        },
      },
      h(
        "div",
        { class: "playground-settings" },
        field("Model ", this.model, h("span", {}, "From code: model=", this.modelName)),
        field("Temperature ", this.temperature),
        field("Max tokens ", this.maxTokens),
      ),
      this.prompt,
      h("div", { class: "actions" }, this.sendButton, this.stopButton),
    );
    this.body = h("div", { class: "panel-body playground-body" }, h("p", { class: "muted" }, "Loading…"));
    this.el = h(
      "section",
      { class: "card panel playground", "aria-labelledby": "playground-title" },
      h("h2", { id: "playground-title" }, "Playground"),
      this.body,
    );
  }

  /** The models to choose from: the final model once the job succeeded, then every checkpoint. */
  async refresh(job) {
    const id = encodeURIComponent(this.jobId);
    try {
      const checkpoints = await getJson(`/v1/jobs/${id}/checkpoints`, { limit: 100 });
      const options = [];
      if (job.fine_tuned_model) options.push({ value: job.fine_tuned_model, label: "Final model" });
      const steps = checkpoints.data.map((c) => c.step).sort((a, b) => b - a);
      for (const step of steps)
        options.push({ value: `${this.jobId}:ckpt-${step}`, label: `Checkpoint · step ${step}` });
      this.render(options);
    } catch (err) {
      replace(this.body, errorBox(err, "Could not load the models of this job"));
    }
  }

  render(options) {
    if (!options.length) {
      replace(
        this.body,
        h(
          "p",
          { class: "muted empty-hint" },
          "Nothing to talk to yet: the playground opens with the first checkpoint.",
        ),
      );
      return;
    }
    const selected = this.model.value;
    replace(
      this.model,
      options.map((o) => h("option", { value: o.value, dataset: { model: o.value } }, o.label)),
    );
    if (options.some((o) => o.value === selected)) this.model.value = selected;
    this.showModelName();
    if (!this.form.isConnected) replace(this.body, this.form, this.errorSlot, this.answer, this.status);
  }

  showModelName() {
    this.modelName.textContent = this.model.value;
  }

  setState(state, text) {
    this.status.dataset.state = state;
    this.status.textContent = text;
    const running = state === "streaming" || state === "waiting";
    this.sendButton.disabled = running;
    this.stopButton.disabled = !running;
  }

  async send() {
    const content = this.prompt.value.trim();
    if (!content || this.controller) return;
    const temperature = Number(this.temperature.value);
    const maxTokens = Number.parseInt(this.maxTokens.value, 10);
    this.controller = new AbortController();
    replace(this.errorSlot);
    this.answer.textContent = "";
    this.setState("waiting", "Waiting for the model… (it may be loading)");
    const started = performance.now();
    let firstAt = null;
    try {
      const result = await streamChat(
        {
          model: this.model.value,
          messages: [{ role: "user", content }],
          temperature: Number.isFinite(temperature) ? temperature : DEFAULTS.temperature,
          max_tokens: Number.isFinite(maxTokens) ? maxTokens : DEFAULTS.max_tokens,
        },
        {
          signal: this.controller.signal,
          onDelta: (text) => {
            if (firstAt === null) {
              firstAt = performance.now();
              this.setState("streaming", "Streaming…");
            }
            this.answer.textContent += text;
          },
        },
      );
      const seconds = (performance.now() - (firstAt ?? started)) / 1000;
      const rate =
        result.deltas > 1 && seconds > 0 ? ` · ${formatNumber(result.deltas / seconds, 3)} tokens/s` : "";
      const first =
        firstAt === null ? "" : ` · first token after ${formatNumber((firstAt - started) / 1000, 2)} s`;
      this.setState("done", `Done (${result.finishReason || "end"})${first}${rate}`);
    } catch (err) {
      if (err.name === "AbortError") {
        this.setState("stopped", "Stopped");
      } else {
        replace(
          this.errorSlot,
          errorBox(
            err,
            err.status === 503 ? "Inference is unavailable right now" : "The model could not answer",
          ),
        );
        this.setState("error", "");
      }
    } finally {
      this.controller = null;
      if (this.status.dataset.state === "waiting" || this.status.dataset.state === "streaming")
        this.setState("idle", "");
    }
  }

  stop() {
    this.controller?.abort();
  }

  destroy() {
    this.stop();
  }
}
