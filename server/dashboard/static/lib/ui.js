// Small pieces every view uses: status badges, progress bars, toasts, pollers, error boxes.

import { h } from "./dom.js";

export function statusBadge(status) {
  return h(
    "span",
    { class: `badge status-${status}`, dataset: { status } },
    h("i", { "aria-hidden": "true" }),
    status,
  );
}

/** A bar for `percent` (0–100, or null when the total is unknown: an indeterminate bar). */
export function progressBar(percent, { label = "progress", compact = false } = {}) {
  const known = typeof percent === "number" && Number.isFinite(percent);
  const value = known ? Math.max(0, Math.min(100, percent)) : null;
  return h(
    "div",
    {
      class: ["progress", compact && "compact", !known && "indeterminate"],
      role: "progressbar",
      "aria-label": label,
      "aria-valuemin": 0,
      "aria-valuemax": 100,
      "aria-valuenow": known ? Math.round(value) : undefined,
    },
    h("div", { class: "progress-fill", style: { width: known ? `${value}%` : "30%" } }),
  );
}

let toastRoot = null;
export function toast(message, kind = "info", ms = 4000) {
  toastRoot ??= document.getElementById("toasts");
  const item = h(
    "div",
    { class: `toast toast-${kind}`, role: kind === "error" ? "alert" : "status" },
    message,
  );
  toastRoot.append(item);
  setTimeout(() => item.classList.add("leaving"), ms - 300);
  setTimeout(() => item.remove(), ms);
}

export function errorBox(error, title = "Something went wrong") {
  return h(
    "div",
    { class: "error-box", role: "alert" },
    h("strong", {}, title),
    h("p", {}, error?.message || String(error)),
    error?.code ? h("code", {}, error.code) : null,
  );
}

export function emptyState(title, detail, action = null) {
  return h(
    "div",
    { class: "empty" },
    h("p", { class: "empty-title" }, title),
    detail ? h("p", {}, detail) : null,
    action,
  );
}

/**
 * Call `task` now and then every `ms` after each call settles (calls never overlap), skipping
 * ticks while the tab is hidden. Returns a stop function.
 */
export function poll(task, ms) {
  let timer = 0;
  let stopped = false;
  const tick = async () => {
    if (stopped) return;
    if (!document.hidden) {
      try {
        await task();
      } catch (err) {
        if (err?.name !== "AbortError") console.warn("poll failed", err);
      }
    }
    if (!stopped) timer = setTimeout(tick, ms);
  };
  tick();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

export function copyButton(text, label = "Copy") {
  return h(
    "button",
    {
      type: "button",
      class: "btn ghost tiny",
      title: `Copy ${text}`,
      "aria-label": `Copy ${text}`,
      onClick: async () => {
        try {
          await navigator.clipboard.writeText(text);
          toast("Copied to the clipboard");
        } catch {
          toast("The browser refused clipboard access", "error");
        }
      },
    },
    label,
  );
}

/** Run an async button action with the button disabled meanwhile; errors become toasts. */
export async function busy(button, action) {
  button.disabled = true;
  button.setAttribute("aria-busy", "true");
  try {
    return await action();
  } catch (err) {
    toast(err.message || String(err), "error", 6000);
    return undefined;
  } finally {
    button.disabled = false;
    button.removeAttribute("aria-busy");
  }
}
