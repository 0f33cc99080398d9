// Hand-written SVG charts for the dashboard: no library, no network, works offline.
// Charts.line(svg, series, opts): series = [{name, color, points: [[x, y], ...]}]
// Charts.bars(svg, bars, opts):   bars = [{label, value, color}]
"use strict";
(function () {
  const NS = "http://www.w3.org/2000/svg";
  const H = 150, L = 40, R = 8, T = 10, B = 22;
  let W = 320;  // the chart's own width in pixels, so text is never scaled

  function el(name, attrs, text) {
    const e = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function fmtTick(v) {
    if (v === 0) return "0";
    const a = Math.abs(v);
    if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (a >= 1e3) return (v / 1e3).toFixed(1) + "k";
    if (a < 1) return v.toFixed(2);
    return Number.isInteger(v) ? String(v) : v.toFixed(1);
  }

  function size(svg) {
    W = Math.max(200, Math.round(svg.getBoundingClientRect().width) || 320);
  }

  function frame(svg, yMin, yMax) {
    size(svg);
    svg.replaceChildren();
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    const y = (v) => T + (H - T - B) * (1 - (v - yMin) / (yMax - yMin || 1));
    for (const v of [yMin, (yMin + yMax) / 2, yMax]) {
      svg.append(el("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid" }));
      svg.append(el("text", { x: L - 4, y: y(v) + 3, class: "tick", "text-anchor": "end" }, fmtTick(v)));
    }
    return y;
  }

  function empty(svg, message) {
    size(svg);
    svg.replaceChildren();
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    svg.append(el("text", { x: W / 2, y: H / 2, class: "empty", "text-anchor": "middle" }, message));
  }

  function line(svg, series, opts) {
    opts = opts || {};
    const pts = series.flatMap((s) => s.points.filter((p) => p[1] !== null && p[1] !== undefined));
    if (pts.length === 0) return empty(svg, opts.empty || "no data yet");
    const xs = pts.map((p) => p[0]), ys = pts.map((p) => p[1]);
    let yMin = opts.yMin !== undefined ? opts.yMin : Math.min(...ys);
    let yMax = opts.yMax !== undefined ? opts.yMax : Math.max(...ys);
    if (yMax === yMin) { yMax = yMin + 1; }
    const xMin = Math.min(...xs), xMax = Math.max(...xs);
    const y = frame(svg, yMin, yMax);
    const x = (v) => L + (W - L - R) * (xMax === xMin ? 0.5 : (v - xMin) / (xMax - xMin));
    const unit = opts.xLabel ? " " + opts.xLabel : "", pre = opts.xPrefix || "";
    svg.append(el("text", { x: L, y: H - 6, class: "tick" }, pre + fmtTick(xMin) + unit));
    svg.append(el("text", { x: W - R, y: H - 6, class: "tick", "text-anchor": "end" }, pre + fmtTick(xMax) + unit));
    for (const s of series) {
      const p = s.points.filter((q) => q[1] !== null && q[1] !== undefined);
      if (p.length === 0) continue;
      const d = p.map((q, i) => `${i ? "L" : "M"}${x(q[0]).toFixed(1)},${y(q[1]).toFixed(1)}`).join(" ");
      svg.append(el("path", { d, class: "series", stroke: s.color }));
      for (const q of p.slice(-40)) {
        svg.append(el("circle", { cx: x(q[0]), cy: y(q[1]), r: 2.2, fill: s.color }));
      }
    }
  }

  function bars(svg, data, opts) {
    opts = opts || {};
    if (data.length === 0) return empty(svg, opts.empty || "no data yet");
    const max = Math.max(1, ...data.map((d) => d.value));
    const y = frame(svg, 0, max);
    const slot = (W - L - R) / data.length, bw = Math.max(2, Math.min(36, slot * 0.7));
    data.forEach((d, i) => {
      const cx = L + slot * (i + 0.5);
      svg.append(el("rect", { x: cx - bw / 2, y: y(d.value), width: bw, height: Math.max(0, y(0) - y(d.value)), fill: d.color || "#4f7cff" }));
      if (data.length <= 12) {
        svg.append(el("text", { x: cx, y: H - 6, class: "tick", "text-anchor": "middle" }, d.label));
      }
    });
  }

  window.Charts = { line, bars };
})();
