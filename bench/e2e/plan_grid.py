#!/usr/bin/env python3
"""The planner's prediction against a real step's measured pool peak, over a grid (issue 5,
item 4): model sizes x every checkpoint policy x fp32/bf16 x two batch sizes (x attention
kinds), per category and in total.

For each point it runs `memfit plan --json` (the prediction) and `train_step_tool` for one real
step with no warm-up (the measurement: every buffer is allocated before the first step, and the
tool reports the pool's peak by category after the step). The tool feeds random tokens from
its own two (B, T) int32 buffers, which it allocates as `staging`; `memfit train`'s data
loaders stage differently, so the plan is asked for with --steps 0 (no loaders: staging 0) and the
tool's input buffers are taken out of the measured total. Everything the planner plans
(parameters, master weights, gradients, optimizer state, activations, workspace) is compared
as is. bench/e2e/build_along.py compares whole `memfit train` runs, data loaders included.

    python3 bench/e2e/plan_grid.py                 # the full grid, writes the two files below
    python3 bench/e2e/plan_grid.py --quick --out /tmp/g.json --doc /tmp/g.md  # a smoke test

Writes docs/bench/plan_grid.json and docs/plan-accuracy.md (generated: edit this script, not
the Markdown).
"""
import argparse
import datetime
import json
import math
import os
import platform
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import ROOT, cpu_model, run_json  # noqa: E402
MIB = 1024.0 * 1024.0
POOL_ALIGN = 64  # MemoryPool::round_up (src/memfit/memory/pool.h)
PLANNED = ("params", "master", "grads", "optimizer", "activations", "workspace")

# (preset, T, batch sizes). gpt2-tiny's context is 64. As with `memfit train --seq-len T`, the
# model's context is T (the tool's --context).
FULL_MODELS = [("gpt2-tiny", 64, (1, 4)), ("gpt2-small-test", 256, (1, 8)),
               ("gpt2", 256, (1, 8))]
QUICK_MODELS = [("gpt2-tiny", 64, (1, 4)), ("gpt2-small-test", 64, (2,))]
ACT_TABLE_SHAPE = ("gpt2", 8, 256)  # the "activation memory under each policy"


def policies(n_layer):
    """Every policy kind, with every:K at K = 2 and K = round(sqrt(layers)) (deduplicated) and
    layers:LIST on the first half of the blocks."""
    k = max(1, round(math.sqrt(n_layer)))
    out = ["none", "full", "selective", "every:2"]
    if f"every:{k}" not in out:
        out.append(f"every:{k}")
    out.append("layers:" + ",".join(str(i) for i in range(max(1, n_layer // 2))))
    return out


def plan(args, model, B, T, precision, attention, ckpt):
    return run_json([args.memfit, "plan", "--json", "--model", model, "--batch", str(B),
                     "--seq-len", str(T), "--precision", precision, "--attention", attention,
                     "--ckpt", ckpt, "--optim", args.optim, "--steps", "0",
                     "--data", args.empty_dir])


def measure(args, model, B, T, precision, attention, ckpt, steps):
    return run_json([args.tool, "--model", model, "--batch", str(B), "--seq", str(T),
                     "--context", str(T), "--steps", str(steps), "--warmup", "0",
                     "--precision", precision, "--attention", attention, "--ckpt", ckpt, "--optim", args.optim])


def rel(pred, meas):
    if meas == 0:
        return 0.0 if pred == 0 else math.inf
    return (pred - meas) / meas


def point(args, model, B, T, precision, attention, ckpt):
    p = plan(args, model, B, T, precision, attention, ckpt)
    if p["data_included"]:
        sys.exit("the plan counted data loaders; expected none (--data is an empty directory)")
    step = args.max_step_seconds is None or p["est_step_seconds"] <= args.max_step_seconds
    t0 = time.time()
    m = measure(args, model, B, T, precision, attention, ckpt, 1 if step else 0)
    seconds = time.time() - t0
    meas_cat = dict(m["pool_peak_by_category"])
    # The tool's random-token input: two (B, T) int32 tensors, each rounded up by the pool.
    harness = 2 * (-(-B * T * 4 // POOL_ALIGN) * POOL_ALIGN)
    if meas_cat.get("staging", 0) != harness:
        sys.exit(f"staging {meas_cat.get('staging')} != the tool's input {harness} bytes")
    pred_cat = {c: p["by_category"].get(c, 0) for c in PLANNED}
    meas_cat = {c: meas_cat.get(c, 0) for c in PLANNED}
    extra = set(m["pool_peak_by_category"]) - set(PLANNED) - {"staging"}
    if extra:
        sys.exit(f"measured categories the planner does not plan: {sorted(extra)}")
    pred_total = p["peak_bytes"]
    meas_total = m["pool_peak_bytes"] - harness
    return {
        "model": model, "n_layer": p["model"]["n_layer"], "d_model": p["model"]["d_model"],
        "params": p["model"]["params"], "batch": B, "seq": T, "precision": precision,
        "attention": attention, "ckpt": ckpt, "optim": args.optim,
        "predicted_bytes": pred_total, "measured_bytes": meas_total,
        "rel_error": rel(pred_total, meas_total),
        "predicted_by_category": pred_cat, "measured_by_category": meas_cat,
        "rel_error_by_category": {c: rel(pred_cat[c], meas_cat[c]) for c in PLANNED},
        "harness_staging_bytes": harness, "pool_peak_bytes": m["pool_peak_bytes"],
        "stepped": step, "step_ms": m["median_ms"], "run_seconds": seconds,
        "est_step_seconds": p["est_step_seconds"], "flops": p["flops"],
    }


def pct(x):
    return "inf" if math.isinf(x) else f"{100 * x:+.4f}%"


def step_ms(r):
    return "yes" if r["stepped"] else "not run"


def machine():
    return {"cpu": cpu_model(platform.processor() or ""), "cores": os.cpu_count(), "host": platform.node()}


def write_doc(path, data):
    cmd = data["command"]
    rows = data["rows"]
    worst = max(rows, key=lambda r: abs(r["rel_error"]))
    exact = sum(r["predicted_bytes"] == r["measured_bytes"] for r in rows)
    cat_worst = {c: max(abs(r["rel_error_by_category"][c]) for r in rows) for c in PLANNED}
    L = []
    w = L.append
    w("# Prediction accuracy of `memfit plan`\n")
    w(f"<!-- Generated by bench/e2e/plan_grid.py on {data['date']}; rerun it, do not edit. -->\n")
    if exact == len(rows) and all(r["predicted_by_category"] == r["measured_by_category"]
                                  for r in rows):
        w(f"**Worst total-peak error over the grid: 0. The predicted peak equals the measured "
          f"one to the byte, in every category, at all {len(rows)} points** (target: within "
          "1%).\n")
    else:
        w(f"**Worst total-peak error over the grid: {pct(worst['rel_error'])}** "
          f"({worst['model']} {worst['batch']}x{worst['seq']} {worst['precision']} "
          f"{worst['attention']} --ckpt {worst['ckpt']}); the prediction equals the measurement "
          f"byte for byte in {exact} of {len(rows)} points. Target: within 1%.\n")
        w("Worst error by category: " + ", ".join(f"{c} {pct(v)}" for c, v in cat_worst.items())
          + ".\n")
    w("```sh\n" + cmd + "\n```\n")
    shapes = {}
    for r in rows:
        shapes.setdefault((r["model"], r["n_layer"], r["d_model"], r["seq"]), set()).add(r["batch"])
    w("Grid: " + "; ".join(f"{m} ({L} layers x {C}) at "
                           + " and ".join(str(b) for b in sorted(bs)) + f" x {T} tokens"
                           for (m, L, C, T), bs in shapes.items())
      + f"; x {' and '.join(sorted({r['precision'] for r in rows}, reverse=True))}"
      + f" x `--attention {' and '.join(sorted({r['attention'] for r in rows}))}`"
      + " x every checkpoint policy (below).\n")
    load = data["load_avg_1min"]
    w(f"Machine: {data['machine']['cpu']}, {data['machine']['cores']} cores (1-minute load "
      f"average {load['min']:.1f}-{load['max']:.1f} during the run; memory does not depend on "
      "it). "
      f"`--optim {data['optim']}`. Each point is `memfit plan --json` against one real step of "
      "`build/train_step_tool` (no warm-up), which reports the pool's peak by category. "
      "The tool's own input buffers (two B x T int32 token tensors, in `staging`) are taken "
      "out of the measured total; the plan is asked for without a data directory, so it plans "
      "no data-loader staging. `memfit train` with its data loaders is compared in "
      "[build-along.md](build-along.md). Raw data: `docs/bench/plan_grid.json`.\n")
    skipped = [r for r in rows if not r["stepped"]]
    if skipped:
        w(f"{len(skipped)} of {len(rows)} points (the planned step longer than "
          f"{data['max_step_seconds']:g} s: "
          + ", ".join(sorted({f"{r['model']} {r['batch']}x{r['seq']}" for r in skipped}))
          + ") were measured after allocating, without running the step, to keep this run "
          "short on a shared machine (\"not run\" below). Every buffer a step uses is "
          "allocated before the first step and a step allocates nothing more "
          "(tests/model/gpt2_test.cpp and checkpoint_test.cpp test it, and the rows that ran a "
          "step agree), so the peak is the same. Without `--max-step-seconds` the script runs "
          "a step at every point.\n")
    w("Policies: `every:K` at K = 2 and K = round(sqrt(layers)) (once when they coincide), "
      "`layers:LIST` on the first half of the blocks. With flash attention `selective` plans "
      "and allocates exactly what `none` does: flash saves no probabilities to drop.\n")

    shape_model, sB, sT = ACT_TABLE_SHAPE
    act_rows = [r for r in rows if (r["model"], r["batch"], r["seq"]) == ACT_TABLE_SHAPE]
    if act_rows:
        w(f"## Activation memory under each policy: {shape_model} (124M), {sB} x {sT}\n")
        w("The activations arena (category `activations`) and the recompute/scratch "
          "`workspace`, MiB, measured and predicted. With one micro-batch a step the arena "
          "holds the f32 gradient slab's units too, each from the phase that first writes it "
          "(Note [Gradients by lifetime] in docs/notes/planner.md; 472.6 MiB at this shape), so "
          "a policy that saves little still has the slab there: the arena is at least the "
          "slab's size. The ratio is the measured arena against `none`'s at the same "
          "precision and attention. Real-step measurements at this shape, plain attention's "
          "`selective` included, are in the checkpointing-overhead section of "
          "[benchmarks.md](benchmarks.md).\n")
        w("| precision | attention | ckpt | activations measured | predicted | vs none | "
          "workspace measured | predicted | step run |")
        w("|---|---|---|---|---|---|---|---|---|")
        for r in act_rows:
            base = next(b for b in act_rows if b["precision"] == r["precision"] and
                        b["attention"] == r["attention"] and b["ckpt"] == "none")
            ma = r["measured_by_category"]["activations"]
            w(f"| {r['precision']} | {r['attention']} | {r['ckpt']} | {ma / MIB:.1f} | "
              f"{r['predicted_by_category']['activations'] / MIB:.1f} | "
              f"{ma / base['measured_by_category']['activations']:.3f}x | "
              f"{r['measured_by_category']['workspace'] / MIB:.1f} | "
              f"{r['predicted_by_category']['workspace'] / MIB:.1f} | {step_ms(r)} |")
        w("")

    w("## The grid\n")
    w("Totals in MiB (everything the planner plans; the tool's input excluded). "
      "\"exact\" means equal to the byte.\n")
    w("| model | B x T | precision | attention | ckpt | predicted MiB | measured MiB | error | "
      "activations pred / meas MiB | step run |")
    w("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        err = "exact" if r["predicted_bytes"] == r["measured_bytes"] else pct(r["rel_error"])
        w(f"| {r['model']} ({r['n_layer']}x{r['d_model']}) | {r['batch']}x{r['seq']} | "
          f"{r['precision']} | {r['attention']} | {r['ckpt']} | "
          f"{r['predicted_bytes'] / MIB:.2f} | {r['measured_bytes'] / MIB:.2f} | {err} | "
          f"{r['predicted_by_category']['activations'] / MIB:.2f} / "
          f"{r['measured_by_category']['activations'] / MIB:.2f} | {step_ms(r)} |")
    w("")
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(L))
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memfit", default=os.path.join(ROOT, "build", "memfit"))
    ap.add_argument("--tool", default=os.path.join(ROOT, "build", "train_step_tool"))
    ap.add_argument("--quick", action="store_true",
                    help="small models and batches only (a smoke test of the script)")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--attention", default="flash,plain",
                    help="attention kinds (selective differs from none only with plain)")
    ap.add_argument("--optim", default="adamw")
    ap.add_argument("--max-step-seconds", type=float, default=None,
                    help="measure points whose planned step time exceeds this after allocation "
                         "only, without running the step (default: every point runs a step)")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "bench", "plan_grid.json"))
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "plan-accuracy.md"))
    ap.add_argument("--doc-only", action="store_true",
                    help="rewrite --doc from the JSON in --out without measuring anything")
    args = ap.parse_args()
    if args.doc_only:
        with open(args.out) as f:
            write_doc(args.doc, json.load(f))
        return
    with tempfile.TemporaryDirectory() as empty:
        args.empty_dir = empty  # no token shards: the plan counts no data loaders
        run_grid(args)


def run_grid(args):
    models = QUICK_MODELS if args.quick else FULL_MODELS
    rows = []
    t_start = time.time()
    loads = [os.getloadavg()[0]]
    for model, T, batches in models:
        L = plan(args, model, 1, T, "fp32", "flash", "none")["model"]["n_layer"]
        for B in batches:
            for precision in args.precisions.split(","):
                for attention in args.attention.split(","):
                    for ckpt in policies(L):
                        r = point(args, model, B, T, precision, attention, ckpt)
                        rows.append(r)
                        loads.append(os.getloadavg()[0])
                        print(f"{model:16} {B}x{T:<4} {precision} {attention:5} {ckpt:16} "
                              f"pred {r['predicted_bytes'] / MIB:9.2f} MiB  meas "
                              f"{r['measured_bytes'] / MIB:9.2f} MiB  {pct(r['rel_error'])}  "
                              f"({r['run_seconds']:.1f} s)", file=sys.stderr, flush=True)
    worst = max(rows, key=lambda r: abs(r["rel_error"]))
    print(f"\n{len(rows)} points; worst total error {pct(worst['rel_error'])} "
          f"({worst['model']} {worst['batch']}x{worst['seq']} {worst['precision']} "
          f"{worst['attention']} {worst['ckpt']}); exact in "
          f"{sum(r['predicted_bytes'] == r['measured_bytes'] for r in rows)}")
    cmd = "python3 bench/e2e/plan_grid.py" + (" --quick" if args.quick else "")
    if args.attention != "flash,plain":
        cmd += f" --attention {args.attention}"
    if args.precisions != "fp32,bf16":
        cmd += f" --precisions {args.precisions}"
    if args.max_step_seconds is not None:
        cmd += f" --max-step-seconds {args.max_step_seconds:g}"
    data = {"command": cmd, "date": datetime.date.today().isoformat(), "machine": machine(),
            "optim": args.optim, "seconds": time.time() - t_start,
            "max_step_seconds": args.max_step_seconds,
            "load_avg_1min": {"min": min(loads), "max": max(loads)},
            "worst_rel_error": worst["rel_error"], "rows": rows}
    for path in (args.out, args.doc):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(args.out + ".tmp", "w") as f:
        json.dump(data, f, indent=1)
    os.replace(args.out + ".tmp", args.out)
    write_doc(args.doc, data)

if __name__ == "__main__":
    main()
