// Line charts drawn as inline SVG: axes with round ticks, one path per series, a legend.
// lineChart(svg, {series: [{x, y, label, cls, dots}], xFormat, yFormat, yMin, yMax, xMin, xMax})
(() => {
  "use strict";
  const SVG_NS = "http://www.w3.org/2000/svg";

  function svgEl(name, attrs, parent) {
    const el = document.createElementNS(SVG_NS, name);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
    if (parent) parent.appendChild(el);
    return el;
  }

  // About `count` round values (1, 2 or 5 times a power of ten) from lo to hi, at least two.
  function ticks(lo, hi, count) {
    if (!(hi > lo)) return [lo];
    const power = Math.pow(10, Math.floor(Math.log10((hi - lo) / count)));
    const steps = [0.5, 1, 2, 5, 10].map((m) => m * power);
    let i = steps.findIndex((s) => s >= (hi - lo) / count);
    for (; i >= 0; i--) {
      const out = [];
      for (let v = Math.ceil(lo / steps[i]) * steps[i]; v <= hi + steps[i] * 1e-9; v += steps[i]) {
        out.push(Math.abs(v) < steps[i] * 1e-9 ? 0 : +v.toPrecision(12));
      }
      if (out.length >= 2 || i === 0) return out;
    }
    return [lo, hi];
  }

  function compact(v) {
    const a = Math.abs(v);
    if (a >= 1e9) return +(v / 1e9).toPrecision(3) + "G";
    if (a >= 1e6) return +(v / 1e6).toPrecision(3) + "M";
    if (a >= 1e4) return +(v / 1e3).toPrecision(3) + "k";
    return +v.toPrecision(4) + "";
  }

  function clock(seconds) {
    const s = Math.round(seconds);
    const h = Math.floor(s / 3600);
    const m = Math.floor((s % 3600) / 60);
    if (h) return h + "h" + String(m).padStart(2, "0");
    if (m) return m + "m" + String(s % 60).padStart(2, "0");
    return s + "s";
  }

  function extent(values, fallbackLo, fallbackHi) {
    let lo = Infinity;
    let hi = -Infinity;
    for (const v of values) {
      if (v === null || !isFinite(v)) continue;
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
    if (lo === Infinity) return [fallbackLo, fallbackHi];
    if (lo === hi) return [lo - 1, hi + 1];
    return [lo, hi];
  }

  // The legend is HTML just after the chart, so that it wraps on a narrow screen.
  function drawLegend(svg, series) {
    let legend = svg.nextElementSibling;
    if (!legend || !legend.classList.contains("legend")) {
      legend = document.createElement("div");
      legend.className = "legend";
      svg.after(legend);
    }
    legend.replaceChildren(...series.map((s) => {
      const item = document.createElement("span");
      const key = document.createElement("i");
      key.className = "key " + (s.cls || "");
      item.append(key, s.label);
      return item;
    }));
  }

  function lineChart(svg, opts) {
    const width = Math.max(svg.clientWidth || svg.getBoundingClientRect().width || 300, 200);
    const height = Math.max(svg.clientHeight || 180, 80);
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    svg.replaceChildren();
    const series = opts.series.filter((s) => s.x.length);
    if (!series.length) {
      drawLegend(svg, []);
      svgEl("text", { x: width / 2, y: height / 2, "text-anchor": "middle", class: "empty" }, svg)
        .textContent = opts.empty || "no data yet";
      return;
    }
    const pad = { left: 46, right: 10, top: 8, bottom: 22 };
    const xs = [].concat(...series.map((s) => s.x));
    const ys = [].concat(...series.map((s) => s.y));
    let [x0, x1] = extent(xs, 0, 1);
    let [y0, y1] = extent(ys, 0, 1);
    if (opts.xMin !== undefined) x0 = opts.xMin;
    if (opts.xMax !== undefined) x1 = Math.max(opts.xMax, x0 + 1);
    if (opts.yMin !== undefined) y0 = Math.min(opts.yMin, y0);
    if (opts.yMax !== undefined) y1 = Math.max(opts.yMax, y1);
    const yt = ticks(y0, y1, Math.max(2, Math.floor(height / 45)));
    y0 = Math.min(y0, yt[0]);
    y1 = Math.max(y1, yt[yt.length - 1]);
    const sx = (v) => pad.left + ((v - x0) / (x1 - x0 || 1)) * (width - pad.left - pad.right);
    const sy = (v) => height - pad.bottom - ((v - y0) / (y1 - y0 || 1)) * (height - pad.top - pad.bottom);
    const axis = svgEl("g", { class: "axis" }, svg);
    const yFormat = opts.yFormat || compact;
    const xFormat = opts.xFormat || compact;
    for (const v of yt) {
      svgEl("line", { x1: pad.left, x2: width - pad.right, y1: sy(v), y2: sy(v), class: "grid" }, axis);
      svgEl("text", { x: pad.left - 5, y: sy(v) + 4, "text-anchor": "end" }, axis).textContent = yFormat(v);
    }
    for (const v of ticks(x0, x1, Math.max(2, Math.floor(width / 90)))) {
      svgEl("text", { x: sx(v), y: height - 6, "text-anchor": "middle" }, axis).textContent = xFormat(v);
    }
    for (const s of series) {
      const g = svgEl("g", { class: "series " + (s.cls || "") }, svg);
      let d = "";
      let pen = false;
      for (let i = 0; i < s.x.length; i++) {
        const y = s.y[i];
        if (y === null || !isFinite(y)) { pen = false; continue; }
        d += (pen ? "L" : "M") + sx(s.x[i]).toFixed(1) + " " + sy(y).toFixed(1);
        pen = true;
        if (s.dots) svgEl("circle", { cx: sx(s.x[i]), cy: sy(y), r: 2.6 }, g);
      }
      if (d && !s.dotsOnly) svgEl("path", { d: d, class: "line" }, g);
    }
    drawLegend(svg, series.filter((s) => s.label));
  }

  window.charts = { lineChart, compact, clock };
})();
