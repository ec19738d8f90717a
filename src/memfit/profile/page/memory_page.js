// memory.html's drawing (memfit train --profile): reads the profile from the page's JSON and
// draws it as SVG, with no library and nothing fetched. See docs/profiling.md.
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("data").textContent);
  const NS = "http://www.w3.org/2000/svg";
  const COLORS = {
    params: "#4e79a7", master: "#a0cbe8", grads: "#f28e2b", optimizer: "#e15759",
    activations: "#59a14f", workspace: "#edc948", comm: "#b07aa1", staging: "#9c755f",
  };
  const PHASE_COLORS = {
    embedding: "#8cd17d", forward: "#59a14f", final_norm: "#8cd17d", lm_head: "#f1ce63",
    final_norm_backward: "#ffbe7d", recompute: "#b07aa1", backward: "#f28e2b",
    embedding_backward: "#ffbe7d", optimizer: "#e15759", evaluation: "#bab0ac", data: "#9c755f",
    collective: "#76b7b2", save: "#555",
  };
  const MiB = 1024 * 1024;
  const fmtMiB = (b) => (b / MiB).toFixed(1) + " MiB";
  const fmtT = (ms) => (ms >= 1000 ? (ms / 1000).toFixed(2) + " s" : ms.toFixed(1) + " ms");
  function el(name, attrs, parent) {
    const e = document.createElementNS(NS, name);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function text(parent, x, y, s, anchor) {
    const t = el("text", { x: x, y: y, "text-anchor": anchor || "start" }, parent);
    t.textContent = s;
    return t;
  }

  document.getElementById("title").textContent = D.title;
  const peak = D.peak;
  document.getElementById("sub").textContent =
    "Peak " + fmtMiB(D.pool_peak) + " measured by the pool" +
    (D.planned ? ", " + fmtMiB(D.planned.peak) + " planned" : "") +
    "; the most bytes holding live values: " + fmtMiB(peak.bytes) + " in " + peak.where + ".";
  const sh = D.shares;
  document.getElementById("shares").textContent =
    "Then: activations " + sh.activations_pct.toFixed(1) + "% (" +
    sh.activations_over_params.toFixed(2) + " x the parameters), parameters " +
    sh.params_pct.toFixed(1) + "%, gradients " + sh.grads_pct.toFixed(1) + "%, optimizer " +
    sh.optimizer_pct.toFixed(1) + "%, workspace " + sh.workspace_pct.toFixed(1) + "%.";
  // The disk tier (optimizer offloaded): the files' bytes, one line.
  if (D.disk)
    document.getElementById("disk").textContent =
      "On disk (offload files): " + fmtMiB(D.disk.files_bytes) +
      (D.disk.planned_bytes !== null ? " (" + fmtMiB(D.disk.planned_bytes) + " planned)" : "") +
      ": " + Object.keys(D.disk.by_category).map(
        (c) => c + " " + fmtMiB(D.disk.by_category[c].files)).join(", ") + ".";

  // The stack, bottom to top: what lives all step first, the arenas' live buffers on top, and
  // above them the arenas' bytes that hold no live value then.
  const order = ["params", "master", "grads", "optimizer", "comm", "staging", "workspace",
                 "activations"].filter((c) => D.categories.includes(c));
  const n = D.t.length;
  const W = 1160, H = 560, ml = 70, mr = 20, mt = 10, ph = 420, bandY = mt + ph + 26;
  const t0 = D.window[0], t1 = D.window[1];
  let ymax = D.pool_peak;
  if (D.planned) ymax = Math.max(ymax, D.planned.peak);
  ymax *= 1.06;
  const X = (t) => ml + ((t - t0) / (t1 - t0 || 1)) * (W - ml - mr);
  const Y = (b) => mt + ph - (b / ymax) * ph;

  const svg = el("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H, id: "chart" },
                 null);
  document.getElementById("plot").appendChild(svg);

  // Grid and axes.
  const step = niceStep(ymax / MiB / 6) * MiB;
  for (let b = 0; b <= ymax; b += step) {
    el("line", { x1: ml, x2: W - mr, y1: Y(b), y2: Y(b), class: "grid" }, svg);
    text(svg, ml - 6, Y(b) + 4, (b / MiB >= 10000 ? (b / MiB / 1024).toFixed(1) + " GiB"
                                  : (b / MiB).toFixed(0) + " MiB"), "end");
  }
  const tstep = niceStep((t1 - t0) / 8);
  for (let t = Math.ceil(t0 / tstep) * tstep; t <= t1; t += tstep)
    text(svg, X(t), mt + ph + 14, fmtT(t), "middle");
  function niceStep(raw) {
    const p = Math.pow(10, Math.floor(Math.log10(raw || 1)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= raw) return m * p;
    return 10 * p;
  }

  // Stacked step areas.
  const base = new Array(n).fill(0);
  function area(values, cls, fill, category) {
    let top = "", bottom = "";
    for (let i = 0; i < n; i++) {
      const xa = X(D.t[i]), xb = X(i + 1 < n ? D.t[i + 1] : t1);
      top += (i ? "L" : "M") + xa + "," + Y(base[i] + values[i]) + "L" + xb + "," +
             Y(base[i] + values[i]);
    }
    for (let i = n - 1; i >= 0; i--) {
      const xa = X(D.t[i]), xb = X(i + 1 < n ? D.t[i + 1] : t1);
      bottom += "L" + xb + "," + Y(base[i]) + "L" + xa + "," + Y(base[i]);
    }
    const attrs = { d: top + bottom + "Z", class: cls, fill: fill };
    if (category) attrs["data-category"] = category;
    el("path", attrs, svg);
    for (let i = 0; i < n; i++) base[i] += values[i];
  }
  for (const c of order) area(D.live[c], "area", COLORS[c], c);
  const defs = el("defs", {}, svg);
  const pat = el("pattern", { id: "hatch", width: 6, height: 6, patternUnits: "userSpaceOnUse",
                              patternTransform: "rotate(45)" }, defs);
  el("rect", { width: 6, height: 6, fill: "#fff" }, pat);
  el("line", { x1: 0, y1: 0, x2: 0, y2: 6, stroke: "#bbb", "stroke-width": 3 }, pat);
  area(D.pool_total.map((p, i) => Math.max(0, p - base[i])), "slack", "url(#hatch)", null);

  // The plan: its peak, and the bytes it says are live in each phase of a training micro-batch.
  if (D.planned) {
    el("line", { x1: ml, x2: W - mr, y1: Y(D.planned.peak), y2: Y(D.planned.peak),
                 class: "planned-peak", id: "planned-peak" }, svg);
    text(svg, W - mr - 4, Y(D.planned.peak) - 4, "planned peak " + fmtMiB(D.planned.peak), "end");
    let d = "";
    for (const [a, b, bytes] of D.planned_runs)
      d += "M" + X(a) + "," + Y(bytes) + "L" + X(b) + "," + Y(bytes);
    if (d) el("path", { d: d, class: "planned-live", id: "planned-live" }, svg);
  }

  // The peak of live bytes.
  const px = X(peak.t), py = Y(peak.bytes);
  el("line", { x1: px, x2: px, y1: mt, y2: mt + ph, class: "peak-line" }, svg);
  el("circle", { cx: px, cy: py, r: 5, fill: "#c00", id: "peak-marker" }, svg);
  const right = px > W / 2;
  text(svg, px + (right ? -8 : 8), Math.max(mt + 12, py - 10),
       "peak " + fmtMiB(peak.bytes) + ": " + peak.phase, right ? "end" : "start");

  // Phases and trainer slices, in two bands under the plot.
  text(svg, ml - 6, bandY + 10, "phases", "end");
  text(svg, ml - 6, bandY + 34, "trainer", "end");
  for (const [a, b, kind, name] of D.runs)
    el("rect", { x: X(a), y: bandY, width: Math.max(0.5, X(b) - X(a)), height: 14,
                 fill: PHASE_COLORS[kind] || "#999", class: "phase" }, svg)
      .appendChild(title(name + " (" + fmtT(b - a) + ")"));
  for (const [a, b, name, kind] of D.slices) {
    if (kind === "step" || kind === "micro-batch") continue;
    el("rect", { x: X(a), y: bandY + 24, width: Math.max(0.5, X(b) - X(a)), height: 14,
                 fill: PHASE_COLORS[kind] || "#999", class: "slice" }, svg)
      .appendChild(title(name + " (" + fmtT(b - a) + ")"));
  }
  for (const [a, b, name, kind] of D.slices)
    if (kind === "step") {
      el("line", { x1: X(a), x2: X(a), y1: mt, y2: bandY + 40, stroke: "#0004" }, svg);
      text(svg, X(a) + 3, bandY + 54, name);
    }
  function title(s) {
    const t = document.createElementNS(NS, "title");
    t.textContent = s;
    return t;
  }

  // Legend.
  const legend = document.getElementById("legend");
  function key(cls, color, label) {
    const k = document.createElement("span");
    k.className = "key";
    const sw = document.createElement("span");
    sw.className = "sw " + cls;
    if (color) sw.style.background = color;
    k.appendChild(sw);
    k.appendChild(document.createTextNode(label));
    legend.appendChild(k);
  }
  for (const c of order.slice().reverse())
    key("", COLORS[c], c + " " + fmtMiB(D.measured[c] || 0) +
        (D.planned ? " (planned " + fmtMiB(D.planned.by_category[c] || 0) + ")" : ""));
  key("slack", null, "arena bytes holding no live value");
  if (D.planned) {
    key("line", null, "planned peak");
    key("dot", null, "planned live bytes per phase");
  }

  // Tooltip: the state at the pointer's time.
  const tip = document.getElementById("tip");
  svg.addEventListener("mousemove", (ev) => {
    const r = svg.getBoundingClientRect();
    const x = ev.clientX - r.left;
    const t = t0 + ((x - ml) / (W - ml - mr)) * (t1 - t0);
    if (t < t0 || t > t1) { tip.style.display = "none"; return; }
    let lo = 0, hi = n - 1;
    while (lo < hi) { const m = (lo + hi + 1) >> 1; if (D.t[m] <= t) lo = m; else hi = m - 1; }
    let where = "";
    for (const [a, b, , name] of D.runs) if (a <= t && t < b) where = name;
    for (const [a, b, name, kind] of D.slices)
      if (!where && a <= t && t < b && kind !== "step" && kind !== "micro-batch") where = name;
    let s = fmtT(t) + (where ? "  " + where : "") + "\n";
    let live = 0;
    for (const c of order.slice().reverse()) {
      s += c.padEnd(12) + fmtMiB(D.live[c][lo]).padStart(12) + "\n";
      live += D.live[c][lo];
    }
    s += "live".padEnd(12) + fmtMiB(live).padStart(12) + "\n";
    s += "pool".padEnd(12) + fmtMiB(D.pool_total[lo]).padStart(12);
    tip.textContent = s;
    tip.style.display = "block";
    tip.style.left = ev.pageX + 14 + "px";
    tip.style.top = ev.pageY + 14 + "px";
  });
  svg.addEventListener("mouseleave", () => { tip.style.display = "none"; });

  // The buffers live at the peak, one by one and by group.
  function rows(id, list, cells) {
    const tbody = document.getElementById(id);
    for (const item of list) {
      const tr = document.createElement("tr");
      for (const [v, cls] of cells(item)) {
        const td = document.createElement("td");
        td.textContent = v;
        if (cls) td.className = cls;
        tr.appendChild(td);
      }
      tbody.appendChild(tr);
    }
  }
  rows("buffers", peak.buffers, (b) => [[fmtMiB(b[2]), "n"], [b[1]], [b[0]], [b[3]]]);
  rows("groups", D.groups, (g) => [[fmtMiB(g[2]), "n"], [g[1]], [g[0]], [String(g[3]), "n"]]);
  document.body.setAttribute("data-ready", "1");
})();
