// curves.html's drawing (memfit train --log, memfit curves): reads the runs from the page's
// JSON and draws each series over the steps as SVG, several runs overlaid, with no library and
// nothing fetched. See docs/notes/training-curves.md.
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("data").textContent);
  const NS = "http://www.w3.org/2000/svg";
  const RUN_COLORS = ["#4e79a7", "#e15759", "#59a14f", "#f28e2b", "#b07aa1", "#76b7b2",
                      "#edc948", "#9c755f", "#ff9da7", "#bab0ac"];
  const CATEGORY_COLORS = {
    params: "#4e79a7", master: "#a0cbe8", grads: "#f28e2b", optimizer: "#e15759",
    activations: "#59a14f", workspace: "#edc948", comm: "#b07aa1", staging: "#9c755f",
  };
  const MiB = 1024 * 1024;
  const runColor = (i) => RUN_COLORS[i % RUN_COLORS.length];
  const fmtMiB = (b) => (b / MiB).toFixed(1) + " MiB";
  function fmtNum(v) {
    if (v === null || v === undefined) return "-";
    const a = Math.abs(v);
    if (a !== 0 && (a < 1e-2 || a >= 1e6)) return v.toExponential(2);
    if (a >= 1000) return v.toFixed(0);
    return v.toPrecision(4);
  }
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
  function niceStep(raw) {
    const p = Math.pow(10, Math.floor(Math.log10(raw || 1)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= raw) return m * p;
    return 10 * p;
  }
  const finite = (v) => typeof v === "number" && isFinite(v);
  // The index of the last x at or before `x` (xs ascending), or -1.
  function before(xs, x) {
    let lo = 0, hi = xs.length - 1, at = -1;
    while (lo <= hi) {
      const m = (lo + hi) >> 1;
      if (xs[m] <= x) { at = m; lo = m + 1; } else hi = m - 1;
    }
    return at;
  }

  document.getElementById("title").textContent = D.title;
  const runs = D.runs;

  // Legend and the table of runs.
  const legend = document.getElementById("legend");
  function key(cls, color, label, id) {
    const k = document.createElement("span");
    k.className = "key";
    if (id) k.id = id;
    const sw = document.createElement("span");
    sw.className = "sw " + cls;
    if (color) sw.style.background = color;
    k.appendChild(sw);
    k.appendChild(document.createTextNode(label));
    legend.appendChild(k);
  }
  runs.forEach((r, i) => key("", runColor(i), r.name, "run-" + i));
  key("line", null, "validation loss (dashed, dots), peak memory (dashed)");
  key("dot", null, "resident memory");

  const tbody = document.querySelector("#runs tbody");
  function lastFinite(a) {
    for (let i = a.length - 1; i >= 0; i--) if (finite(a[i])) return a[i];
    return null;
  }
  function median(a) {
    const v = a.filter(finite).sort((x, y) => x - y);
    return v.length ? v[v.length >> 1] : null;
  }
  runs.forEach((r, i) => {
    const tr = document.createElement("tr");
    const cells = [[r.name], [String(r.step[r.step.length - 1]), "n"],
                   [fmtNum(lastFinite(r.loss)), "n"], [fmtNum(lastFinite(r.val_loss)), "n"],
                   [fmtNum(median(r.tokens_per_s)), "n"],
                   [lastFinite(r.peak_bytes) === null ? "-"
                     : (lastFinite(r.peak_bytes) / MiB).toFixed(1), "n"],
                   [r.path]];
    for (const [v, cls] of cells) {
      const td = document.createElement("td");
      td.textContent = v;
      if (cls) td.className = cls;
      tr.appendChild(td);
    }
    tr.firstChild.style.color = runColor(i);
    tbody.appendChild(tr);
  });

  const W = 560, H = 240, ml = 64, mr = 14, mt = 8, mb = 22;
  const tip = document.getElementById("tip");
  const panels = document.getElementById("panels");

  // A tick's label: as many decimals as the ticks' spacing needs (exponents below 0.01).
  function fmtTick(v, step) {
    if (step < 1e-2) return v === 0 ? "0" : v.toExponential(1);
    return v.toFixed(Math.max(0, Math.ceil(-Math.log10(step) - 1e-9)));
  }
  const fmtLogTick = (v) => (v < 1e-3 || v >= 1e5 ? v.toExponential(0) : String(+v.toPrecision(3)));

  // A panel: a title and an SVG with axes for steps [x0, x1] and values [y0, y1] (log10 when
  // `log`), returning the scales. `unit` follows the y axis' labels.
  function panel(id, heading, x0, x1, y0, y1, log, unit) {
    unit = unit || "";
    const div = document.createElement("div");
    div.className = "panel";
    div.id = "panel-" + id;
    const h = document.createElement("h2");
    h.textContent = heading;
    div.appendChild(h);
    panels.appendChild(div);
    const svg = el("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H,
                            "data-panel": id }, div);
    const ph = H - mt - mb;
    const f = log ? (v) => Math.log10(v) : (v) => v;
    const fy0 = f(y0), fy1 = f(y1);
    const X = (x) => ml + ((x - x0) / (x1 - x0 || 1)) * (W - ml - mr);
    const Y = (v) => mt + ph - ((f(v) - fy0) / (fy1 - fy0 || 1)) * ph;
    if (log) {
      for (let e = Math.floor(fy0); e <= Math.ceil(fy1); e++)
        for (const m of [1, 2, 5]) {
          const v = m * Math.pow(10, e);
          if (v < y0 || v > y1) continue;
          el("line", { x1: ml, x2: W - mr, y1: Y(v), y2: Y(v), class: "grid" }, svg);
          text(svg, ml - 6, Y(v) + 4, fmtLogTick(v) + unit, "end");
        }
    } else {
      const step = niceStep((y1 - y0) / 5);
      for (let v = Math.ceil(y0 / step) * step; v <= y1 + step * 1e-9; v += step) {
        el("line", { x1: ml, x2: W - mr, y1: Y(v), y2: Y(v), class: "grid" }, svg);
        text(svg, ml - 6, Y(v) + 4, fmtTick(v, step) + unit, "end");
      }
    }
    const xstep = Math.max(1, niceStep((x1 - x0) / 8));
    for (let x = Math.ceil(x0 / xstep) * xstep; x <= x1; x += xstep)
      text(svg, X(x), H - 6, String(x), "middle");
    el("line", { x1: ml, x2: ml, y1: mt, y2: mt + ph, class: "axis" }, svg);
    el("line", { x1: ml, x2: W - mr, y1: mt + ph, y2: mt + ph, class: "axis" }, svg);
    const cursor = el("line", { x1: 0, x2: 0, y1: mt, y2: mt + ph, class: "cursor",
                                visibility: "hidden" }, svg);
    return { svg: svg, X: X, Y: Y, x0: x0, x1: x1, cursor: cursor };
  }

  // The path through (xs, ys), broken where a value is missing (null, or not positive on a log
  // axis).
  function pathOf(p, xs, ys, log) {
    let d = "", pen = false;
    for (let i = 0; i < xs.length; i++) {
      const v = ys[i];
      if (!finite(v) || (log && v <= 0)) { pen = false; continue; }
      d += (pen ? "L" : "M") + p.X(xs[i]).toFixed(1) + "," + p.Y(v).toFixed(1);
      pen = true;
    }
    return d;
  }

  // Hovering a panel: a cursor at the step and the values there in the tooltip.
  function hover(p, describe) {
    p.svg.addEventListener("mousemove", (ev) => {
      const r = p.svg.getBoundingClientRect();
      const step = Math.round(p.x0 + ((ev.clientX - r.left - ml) / (W - ml - mr)) * (p.x1 - p.x0));
      if (step < p.x0 || step > p.x1) { tip.style.display = "none"; return; }
      p.cursor.setAttribute("x1", p.X(step));
      p.cursor.setAttribute("x2", p.X(step));
      p.cursor.setAttribute("visibility", "visible");
      tip.textContent = "step " + step + "\n" + describe(step);
      tip.style.display = "block";
      tip.style.left = ev.pageX + 14 + "px";
      tip.style.top = ev.pageY + 14 + "px";
    });
    p.svg.addEventListener("mouseleave", () => {
      tip.style.display = "none";
      p.cursor.setAttribute("visibility", "hidden");
    });
  }

  // One line per run of series `key` (and for the loss, the validation loss dashed with dots).
  function seriesPanel(key, heading, options) {
    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    const lists = [];
    runs.forEach((r, i) => {
      lists.push([i, key, r.step, r[key]]);
      if (key === "loss") lists.push([i, "val_loss", r.val_step, r.val_loss]);
    });
    for (const [, , xs, ys] of lists)
      xs.forEach((x, k) => {
        if (!finite(ys[k])) return;
        if (options.log && ys[k] <= 0) return;
        x0 = Math.min(x0, x); x1 = Math.max(x1, x);
        y0 = Math.min(y0, ys[k]); y1 = Math.max(y1, ys[k]);
      });
    if (x0 > x1) {  // nothing to draw: say so in the panel
      const p = panel(key, heading + " (not in the log)", 0, 1, 0, 1, false);
      return p;
    }
    let log = false;
    if (options.log && y1 / y0 > 30) log = true;
    else {
      if (options.zero) y0 = Math.min(0, y0);
      const pad = (y1 - y0) * 0.05 || Math.abs(y1) * 0.05 || 1;
      y1 += pad;
      if (!options.zero) y0 -= pad;
    }
    const p = panel(key, heading + (log ? " (log scale)" : ""), x0, x1, y0, y1, log);
    for (const [i, name, xs, ys] of lists) {
      const val = name === "val_loss";
      el("path", { d: pathOf(p, xs, ys, log), class: val ? "val" : "series",
                   stroke: runColor(i), "data-run": i, "data-series": name }, p.svg);
      // A run of one step has no line: a dot shows its value.
      if (!val && xs.length === 1 && finite(ys[0]) && !(log && ys[0] <= 0))
        el("circle", { cx: p.X(xs[0]), cy: p.Y(ys[0]), r: 3, fill: runColor(i), class: "point",
                       "data-run": i }, p.svg);
      if (val)
        xs.forEach((x, k) => {
          if (finite(ys[k]))
            el("circle", { cx: p.X(x), cy: p.Y(ys[k]), r: 2.5, fill: runColor(i),
                           class: "val-point", "data-run": i }, p.svg);
        });
    }
    hover(p, (step) => lists.map(([i, name, xs, ys]) => {
      const k = before(xs, step);
      return k < 0 ? "" : runs[i].name + (name === "val_loss" ? " (val, step " + xs[k] + ")" : "") +
                          ": " + fmtNum(ys[k]);
    }).filter((s) => s).join("\n"));
    return p;
  }

  seriesPanel("loss", "Loss (validation loss dashed)", {});
  seriesPanel("lr", "Learning rate", { zero: true });
  seriesPanel("grad_norm", "Gradient norm (before clipping)", { zero: true, log: true });
  seriesPanel("tokens_per_s", "Tokens per second", { zero: true });

  // Each run's memory: the pool's bytes by category at the end of each step, stacked, with its
  // peak so far and the process's resident memory.
  runs.forEach((r, i) => {
    const n = r.step.length;
    const total = new Array(n).fill(0);
    for (const c of r.categories) r.mem[c].forEach((b, k) => { total[k] += b; });
    let ymax = 0;
    for (let k = 0; k < n; k++)
      ymax = Math.max(ymax, total[k], finite(r.peak_bytes[k]) ? r.peak_bytes[k] : 0,
                      finite(r.rss_bytes[k]) ? r.rss_bytes[k] : 0);
    // The axis in GiB from 10 GiB up, else in MiB.
    const unit = ymax >= 10 * 1024 * MiB ? 1024 * MiB : MiB;
    const q = panel("memory-" + i, "Memory by category: " + r.name, r.step[0], r.step[n - 1], 0,
                    ((ymax || MiB) * 1.06) / unit, false, unit === MiB ? " MiB" : " GiB");
    // Bytes in, the panel's unit out.
    const p = { svg: q.svg, X: q.X, Y: (b) => q.Y(b / unit), x0: q.x0, x1: q.x1, cursor: q.cursor };
    p.svg.setAttribute("data-run", i);
    const base = new Array(n).fill(0);
    for (const c of r.categories) {
      const v = r.mem[c];
      let top = "", bottom = "";
      for (let k = 0; k < n; k++)
        top += (k ? "L" : "M") + p.X(r.step[k]).toFixed(1) + "," + p.Y(base[k] + v[k]).toFixed(1);
      for (let k = n - 1; k >= 0; k--)
        bottom += "L" + p.X(r.step[k]).toFixed(1) + "," + p.Y(base[k]).toFixed(1);
      // One step alone is a bar a few pixels wide, not a line of no width.
      const d = n > 1 ? top + bottom + "Z"
                      : "M" + (p.X(r.step[0]) - 4) + "," + p.Y(base[0] + v[0]) + "h8V" +
                        p.Y(base[0]) + "h-8Z";
      el("path", { d: d, fill: CATEGORY_COLORS[c] || "#999", class: "area", "data-run": i,
                   "data-category": c }, p.svg).appendChild(titleOf(c));
      for (let k = 0; k < n; k++) base[k] += v[k];
    }
    el("path", { d: pathOf(p, r.step, r.peak_bytes, false), class: "peak", "data-run": i,
                 "data-series": "peak_bytes" }, p.svg);
    el("path", { d: pathOf(p, r.step, r.rss_bytes, false), class: "rss", "data-run": i,
                 "data-series": "rss_bytes" }, p.svg);
    hover(p, (step) => {
      const k = before(r.step, step);
      if (k < 0) return "";
      let s = "";
      for (const c of r.categories.slice().reverse())
        s += c.padEnd(12) + fmtMiB(r.mem[c][k]).padStart(12) + "\n";
      s += "pool".padEnd(12) + fmtMiB(total[k]).padStart(12) + "\n";
      if (finite(r.peak_bytes[k])) s += "peak so far".padEnd(12) + fmtMiB(r.peak_bytes[k]).padStart(12) + "\n";
      if (finite(r.rss_bytes[k])) s += "resident".padEnd(12) + fmtMiB(r.rss_bytes[k]).padStart(12);
      return s;
    });
  });
  function titleOf(s) {
    const t = document.createElementNS(NS, "title");
    t.textContent = s;
    return t;
  }

  // The categories' colours, once for every run.
  const seen = [];
  for (const r of runs) for (const c of r.categories) if (!seen.includes(c)) seen.push(c);
  for (const c of seen) key("", CATEGORY_COLORS[c] || "#999", c);
  document.body.setAttribute("data-ready", "1");
})();
