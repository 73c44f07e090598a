// Line charts drawn as SVG: a few dozen lines instead of a charting library. `LiveChart` keeps
// series keyed by step (a point re-sent after a reconnect replaces itself instead of doubling)
// and redraws at most once per frame and whenever its box changes width.

import { h, replace, svg } from "./dom.js";
import { formatNumber } from "./format.js";

const MARGIN = { top: 12, right: 16, bottom: 28, left: 56 };

/** About `count` round tick values covering [min, max] (1, 2 or 5 times a power of ten apart). */
export function niceTicks(min, max, count = 5) {
  if (!Number.isFinite(min) || !Number.isFinite(max)) return [];
  if (min === max) {
    const pad = Math.abs(min) * 0.1 || 1;
    min -= pad;
    max += pad;
  }
  const raw = (max - min) / Math.max(1, count);
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw) ?? 10 * power;
  const ticks = [];
  for (let v = Math.floor(min / step) * step; v <= max + step * 1e-9; v += step) {
    if (v >= min - step * 1e-9) ticks.push(Number(v.toPrecision(12)));
  }
  return ticks;
}

function extent(values) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const v of values) {
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  return [lo, hi];
}

/** An `<svg>` with one path per series; `series`: [{name, label, points: [[x, y], ...]}]. */
export function lineChart({ series, width, height, xLabel = "step", yFormat = formatNumber }) {
  const innerW = Math.max(10, width - MARGIN.left - MARGIN.right);
  const innerH = Math.max(10, height - MARGIN.top - MARGIN.bottom);
  const all = series.flatMap((s) => s.points);
  const root = svg("svg", {
    class: "chart",
    width,
    height,
    viewBox: `0 0 ${width} ${height}`,
    role: "img",
    "aria-label": `${series.map((s) => s.label || s.name).join(", ")} by ${xLabel}`,
  });
  if (all.length === 0) {
    root.append(
      svg("text", {
        x: width / 2,
        y: height / 2,
        class: "chart-empty",
        "text-anchor": "middle",
        text: "waiting for data…",
      }),
    );
    return root;
  }
  let [x0, x1] = extent(all.map((p) => p[0]));
  let [y0, y1] = extent(all.map((p) => p[1]));
  if (x0 === x1) [x0, x1] = [x0 - 1, x1 + 1];
  const yTicks = niceTicks(y0, y1, Math.max(2, Math.round(innerH / 40)));
  [y0, y1] = [Math.min(y0, yTicks[0]), Math.max(y1, yTicks[yTicks.length - 1])];
  if (y0 === y1) [y0, y1] = [y0 - 1, y1 + 1];
  const sx = (x) => MARGIN.left + ((x - x0) / (x1 - x0)) * innerW;
  const sy = (y) => MARGIN.top + innerH - ((y - y0) / (y1 - y0)) * innerH;

  const grid = svg("g", { class: "chart-grid" });
  for (const t of yTicks) {
    grid.append(
      svg("line", { x1: MARGIN.left, x2: MARGIN.left + innerW, y1: sy(t), y2: sy(t) }),
      svg("text", { x: MARGIN.left - 6, y: sy(t), dy: "0.32em", "text-anchor": "end", text: yFormat(t) }),
    );
  }
  const xTicks = niceTicks(x0, x1, Math.max(2, Math.round(innerW / 80))).filter((t) => Number.isInteger(t));
  for (const t of xTicks) {
    grid.append(
      svg("text", { x: sx(t), y: MARGIN.top + innerH + 18, "text-anchor": "middle", text: formatNumber(t) }),
    );
  }
  grid.append(
    svg("line", {
      class: "chart-axis",
      x1: MARGIN.left,
      x2: MARGIN.left + innerW,
      y1: MARGIN.top + innerH,
      y2: MARGIN.top + innerH,
    }),
  );
  root.append(grid);

  series.forEach((s, index) => {
    if (s.points.length === 0) return;
    const d = s.points.map(([x, y], i) => `${i ? "L" : "M"}${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join("");
    const [lx, ly] = s.points[s.points.length - 1];
    root.append(
      svg("path", {
        class: `chart-line series-${index}`,
        d,
        "data-series": s.name,
        "data-points": s.points.length,
      }),
      svg("circle", {
        class: `chart-dot series-${index}`,
        cx: sx(lx),
        cy: sy(ly),
        r: s.points.length === 1 ? 3.5 : 2.5,
      }),
    );
  });
  root.append(hoverLayer({ series, sx, sy, innerH, innerW, yFormat, xLabel }));
  return root;
}

// A crosshair and a readout of every series at the step nearest the pointer.
function hoverLayer({ series, sx, sy, innerH, innerW, yFormat, xLabel }) {
  const layer = svg("g", { class: "chart-hover" });
  const rule = svg("line", { y1: MARGIN.top, y2: MARGIN.top + innerH, visibility: "hidden" });
  const label = svg("text", { y: MARGIN.top + 10, visibility: "hidden" });
  const capture = svg("rect", {
    x: MARGIN.left,
    y: MARGIN.top,
    width: innerW,
    height: innerH,
    fill: "transparent",
  });
  const steps = [...new Set(series.flatMap((s) => s.points.map((p) => p[0])))].sort((a, b) => a - b);
  capture.addEventListener("pointermove", (event) => {
    const box = capture.getBoundingClientRect();
    const px = MARGIN.left + ((event.clientX - box.left) / box.width) * innerW;
    let best = steps[0];
    for (const step of steps) if (Math.abs(sx(step) - px) < Math.abs(sx(best) - px)) best = step;
    const parts = series
      .map((s) => [s, s.points.find((p) => p[0] === best)])
      .filter(([, p]) => p)
      .map(([s, p]) => `${s.label || s.name} ${yFormat(p[1])}`);
    const x = sx(best);
    rule.setAttribute("x1", x);
    rule.setAttribute("x2", x);
    label.textContent = `${xLabel} ${best} · ${parts.join(" · ")}`;
    const rightHalf = x > MARGIN.left + innerW / 2;
    label.setAttribute("x", rightHalf ? x - 6 : x + 6);
    label.setAttribute("text-anchor", rightHalf ? "end" : "start");
    rule.setAttribute("visibility", "visible");
    label.setAttribute("visibility", "visible");
  });
  capture.addEventListener("pointerleave", () => {
    rule.setAttribute("visibility", "hidden");
    label.setAttribute("visibility", "hidden");
  });
  layer.append(rule, label, capture);
  return layer;
}

export class LiveChart {
  /** `series`: [{name, label}] in drawing order; the element is `chart.el`. */
  constructor({ title, series, height = 220, yFormat = formatNumber }) {
    this.defs = series;
    this.data = new Map(series.map((s) => [s.name, new Map()]));
    this.height = height;
    this.yFormat = yFormat;
    this.plot = h("div", { class: "chart-plot" });
    const legend = h(
      "div",
      { class: "chart-legend" },
      series.map((s, i) =>
        h("span", { class: `legend-item series-${i}` }, h("i", { "aria-hidden": "true" }), s.label || s.name),
      ),
    );
    this.el = h(
      "figure",
      { class: "chart-card", dataset: { chart: title } },
      h("figcaption", {}, h("span", { text: title }), legend),
      this.plot,
    );
    this.frame = 0;
    this.width = 0;
    this.resize = new ResizeObserver(() => {
      if (this.plot.clientWidth !== this.width) this.schedule();
    });
    this.resize.observe(this.plot);
  }

  set(name, points) {
    const series = this.data.get(name);
    if (!series) return;
    series.clear();
    for (const [x, y] of points) if (Number.isFinite(x) && Number.isFinite(y)) series.set(x, y);
    this.schedule();
  }

  add(name, x, y) {
    const series = this.data.get(name);
    if (!series || !Number.isFinite(x) || !Number.isFinite(y)) return;
    series.set(x, y);
    this.schedule();
  }

  schedule() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      this.render();
    });
  }

  render() {
    this.width = this.plot.clientWidth;
    if (!this.width) return;
    const series = this.defs.map((s) => ({
      ...s,
      points: [...this.data.get(s.name).entries()].sort((a, b) => a[0] - b[0]),
    }));
    replace(this.plot, lineChart({ series, width: this.width, height: this.height, yFormat: this.yFormat }));
  }

  destroy() {
    this.resize.disconnect();
    cancelAnimationFrame(this.frame);
  }
}
