// Formatting of numbers, sizes, times and durations for people reading a training dashboard.

export function formatNumber(value, digits = 4) {
  if (value === null || value === undefined || Number.isNaN(value)) return "—";
  if (typeof value !== "number") return String(value);
  if (value === 0) return "0";
  const abs = Math.abs(value);
  // Learning rates and tiny losses read best in scientific notation.
  if (abs < 1e-3 || abs >= 1e6) return value.toExponential(Math.max(0, digits - 2));
  if (Number.isInteger(value)) return value.toLocaleString("en-US");
  return Number(value.toPrecision(digits)).toString();
}

export function formatBytes(bytes) {
  if (bytes === null || bytes === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${unit === 0 ? value : value.toFixed(value < 10 ? 1 : 0)} ${units[unit]}`;
}

export function formatDuration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "—";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${String(s % 60).padStart(2, "0")}s`;
  const hours = Math.floor(m / 60);
  if (hours < 48) return `${hours}h ${String(m % 60).padStart(2, "0")}m`;
  return `${Math.floor(hours / 24)}d ${hours % 24}h`;
}

export function parseTime(value) {
  if (!value) return null;
  const time = new Date(value).getTime();
  return Number.isNaN(time) ? null : time;
}

/** "12s ago", "3m ago", or a date for anything older than a day. */
export function formatAgo(value, now = Date.now()) {
  const time = parseTime(value);
  if (time === null) return "—";
  const seconds = (now - time) / 1000;
  if (seconds < 5) return "just now";
  if (seconds < 86_400) return `${formatDuration(seconds).split(" ")[0]} ago`;
  return new Date(time).toLocaleDateString(undefined, { month: "short", day: "numeric" });
}

/** A time of today as "15:06:06", any other as "Dec 2, 15:06". */
export function formatShortTime(value, now = Date.now()) {
  const time = parseTime(value);
  if (time === null) return "—";
  const date = new Date(time);
  if (date.toDateString() === new Date(now).toDateString()) {
    return date.toLocaleTimeString(undefined, {
      hour: "2-digit",
      minute: "2-digit",
      second: "2-digit",
      hour12: false,
    });
  }
  return date.toLocaleString(undefined, {
    month: "short",
    day: "numeric",
    hour: "2-digit",
    minute: "2-digit",
    hour12: false,
  });
}

export function formatDateTime(value) {
  const time = parseTime(value);
  if (time === null) return "—";
  return new Date(time).toLocaleString(undefined, {
    month: "short",
    day: "numeric",
    hour: "2-digit",
    minute: "2-digit",
    second: "2-digit",
  });
}

/** How long a job ran (or has been running): started → finished, or → now. */
export function jobDuration(job, now = Date.now()) {
  const start = parseTime(job.started_at);
  if (start === null) return null;
  const end = parseTime(job.finished_at) ?? now;
  return (end - start) / 1000;
}

/** The last path segment of a model or file reference: "/data/models/tiny-llama" → "tiny-llama". */
export function shortRef(ref) {
  if (!ref) return "—";
  const trimmed = String(ref).replace(/\/+$/, "");
  return trimmed.split(/[\\/]/).pop() || trimmed;
}
