#!/usr/bin/env python3
"""The seeds' build-along (issue 5, item 8): a gpt2-medium-sized model (24 layers x 1024,
355M parameters) under a memory budget at which plain FP32 training runs out of memory, then
the same run with activation checkpointing, then BF16, then 8-bit AdamW, each stage adding to
the one before. For each stage: the planner's predicted peak (`memfit plan --json`), what
`memfit train --mem-limit` measured (the pool's peak over real steps on the Brown corpus, or
the out-of-memory report's numbers), and the step time.

The budget, unless given, is the largest multiple of 256 MiB below plain FP32's predicted peak,
provided every later stage's predicted peak fits under it (else the script says so and stops).

    python3 bench/e2e/build_along.py                        # writes the two files below
    python3 bench/e2e/build_along.py --model gpt2-tiny --batch 2 --seq 64 --steps 2 \\
        --out /tmp/b.json --doc /tmp/b.md                    # a smoke test

Needs the tokenized Brown corpus in data/brown (bash scripts/setup.sh). Writes
docs/bench/build_along.json and docs/build-along.md (generated: edit this script, not the
Markdown).
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import ROOT, cpu_model, run_json  # noqa: E402
MIB = 1024.0 * 1024.0
STEP = 256 * 1024 * 1024  # budgets are picked in multiples of this

# Each stage adds its options to the previous stage's.
STAGES = [
    ("plain FP32", "fp32, no checkpointing, AdamW", {}),
    ("+ checkpointing", "--ckpt full", {"--ckpt": "full"}),
    ("+ BF16", "--precision bf16 (FP32 master weights)", {"--precision": "bf16"}),
    ("+ 8-bit AdamW", "--optim adamw8bit", {"--optim": "adamw8bit"}),
]
WHY = {
    "+ checkpointing": "Only each block's input is kept; the blocks' other saved tensors live in "
                       "one block's worth of shared buffers that backward refills by running "
                       "the block's forward again.",
    "+ BF16": "Saved activations and the matmul operands halve, but the BF16 working copy of "
              "the weights comes on top of the FP32 master weights (the optimizer updates "
              "those), and gradients stay FP32: with checkpointing on, BF16 buys speed (AMX "
              "matmuls), not memory.",
    "+ 8-bit AdamW": "Both moments are stored as 8-bit codes in blocks with one scale each: "
                     "about 2 bytes per parameter instead of 8.",
}
BASE = {"--precision": "fp32", "--ckpt": "none", "--optim": "adamw"}
OOM_RE = re.compile(
    r"out of memory: ([\d.]+) MiB requested for (\w+) \(([^)]*)\) with ([\d.]+) MiB budget; "
    r"live ([\d.]+) MiB \(([^)]*)\); at most ([\d.]+) MiB more would fit")


def stage_options():
    opts, out = dict(BASE), []
    for name, what, add in STAGES:
        opts.update(add)
        out.append((name, what, dict(opts)))
    return out


def common(args):
    return ["--model", args.model, "--batch", str(args.batch), "--seq-len", str(args.seq),
            "--attention", args.attention, "--data", args.data]


def flat(opts):
    return [x for kv in opts.items() for x in kv]


def plan(args, opts):
    cmd = [args.memfit, "plan", "--json", "--steps", str(args.steps)] + common(args) + flat(opts)
    return run_json(cmd)


def train(args, opts, budget):
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "log.jsonl")
        cmd = ([args.memfit, "train", "--steps", str(args.steps), "--eval-batches", "1",
                "--mem-limit", str(budget), "--log", log] + common(args) + flat(opts))
        t0 = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True)
        out = {"exit": r.returncode, "seconds": time.time() - t0}
        if r.returncode == 3:
            m = OOM_RE.search(r.stderr)
            if not m:
                sys.exit(f"exit 3 without an out-of-memory report:\n{r.stderr}")
            out["oom"] = {"message": next(l for l in r.stderr.splitlines() if m[0] in l),
                          "stderr": r.stderr,
                          "requested_mib": float(m[1]), "category": m[2], "tag": m[3],
                          "budget_mib": float(m[4]), "live_mib": float(m[5]),
                          "live_breakdown": m[6], "would_fit_mib": float(m[7])}
            return out
        if r.returncode != 0:
            sys.exit(f"exit {r.returncode}: {' '.join(cmd)}\n{r.stderr}")
        with open(log) as f:
            steps = [j for j in map(json.loads, f) if "step_seconds" in j]
    secs = [s["step_seconds"] for s in steps]
    timed = secs[1:] if len(secs) > 1 else secs  # the first step also warms oneDNN up
    out["step_seconds"] = secs
    out["median_step_seconds"] = statistics.median(timed)
    out["tokens_per_s"] = args.batch * args.seq / out["median_step_seconds"]
    out["peak_bytes"] = max(s["peak_bytes"] for s in steps)
    # The summary table's peak by category (MiB, one decimal).
    cats = {}
    table = r.stdout[r.stdout.index("peak memory"):].splitlines()[1:]
    for line in table:
        parts = line.split()
        if len(parts) == 2:
            cats[parts[0]] = float(parts[1])
    out["summary_peak_mib"] = cats.pop("total")
    out["peak_mib_by_category"] = cats
    # The log's peak is taken after each step; the summary's also covers the final evaluation.
    if abs(out["summary_peak_mib"] - out["peak_bytes"] / MIB) > 0.05:
        sys.exit(f"the run's peak ({out['summary_peak_mib']} MiB) exceeds the steps' "
                 f"({out['peak_bytes'] / MIB:.1f} MiB): the evaluation allocated more")
    out["last_loss"] = steps[-1]["loss"]
    return out


def parse_bytes(text):
    """'6GiB', '512MiB', '1000' (bytes), as memfit's --mem-limit reads them."""
    m = re.fullmatch(r"([\d.]+)\s*([kmgt]?)(i?b?)", text.strip().lower())
    if not m:
        raise argparse.ArgumentTypeError(f"cannot read '{text}' as a size, e.g. 6GiB")
    return int(float(m[1]) * 1024 ** " kmgt".index(m[2] or " "))


def pick_budget(plans):
    plain, rest = plans[0]["peak_bytes"], max(p["peak_bytes"] for p in plans[1:])
    budget = (plain - 1) // STEP * STEP
    if budget < rest:
        sys.exit(f"no multiple of {STEP // 2**20} MiB lies between the later stages' peak "
                 f"({rest / MIB:.1f} MiB) and plain FP32's ({plain / MIB:.1f} MiB); give "
                 "--mem-limit")
    return budget


def mib_text(b):
    return f"{b // 2**20}MiB" if b % 2**20 == 0 else str(b)


def machine():
    return f"{cpu_model()}, {os.cpu_count()} cores"


def table(data):
    L = ["| stage | adds | predicted peak MiB | measured peak MiB | under the budget | "
         "step s | tokens/s |", "|---|---|---|---|---|---|---|"]
    for s in data["stages"]:
        r = s["run"]
        pred = s["plan"]["peak_bytes"] / MIB
        if "oom" in r:
            o = r["oom"]
            meas = (f"out of memory: {o['requested_mib']:.1f} MiB of {o['category']} requested "
                    f"with {o['live_mib']:.1f} MiB live")
            fits, step, tps = f"no ({pred - data['budget_bytes'] / MIB:.1f} MiB over)", "-", "-"
        else:
            same = "= predicted" if r["peak_bytes"] == s["plan"]["peak_bytes"] else (
                f"{100 * (s['plan']['peak_bytes'] - r['peak_bytes']) / r['peak_bytes']:+.3f}% "
                "error")
            meas = f"{r['peak_bytes'] / MIB:.1f} ({same})"
            fits = f"yes ({(data['budget_bytes'] - r['peak_bytes']) / MIB:.1f} MiB spare)"
            step, tps = f"{r['median_step_seconds']:.2f}", f"{r['tokens_per_s']:.0f}"
        L.append(f"| {s['name']} | {s['adds']} | {pred:.1f} | {meas} | {fits} | {step} | "
                 f"{tps} |")
    return "\n".join(L)


def breakdown(data):
    cats = ["params", "master", "grads", "optimizer", "activations", "workspace", "staging"]
    L = ["| stage | " + " | ".join(cats) + " |", "|---|" + "---|" * len(cats)]
    for s in data["stages"]:
        by = s["plan"]["by_category"]
        L.append(f"| {s['name']} | " + " | ".join(f"{by.get(c, 0) / MIB:.1f}" for c in cats) +
                 " |")
    return "\n".join(L)


def write_doc(path, data):
    cmd = data["command"]
    load = data["load_avg_1min"]
    # A run keeps about `cores` threads busy; more than a core's worth beyond that is others.
    if load["max"] > data["cores"] + 1:
        timing = ("**the machine was busy** (other builds running), so the step times are "
                  "provisional: rerun the command on a quiet machine for numbers of record")
    else:
        timing = "the machine was otherwise idle"
    p0 = data["stages"][0]["plan"]["model"]
    L = [f"# The build-along: fitting {data['model']} into a budget, one technique at a time",
         "",
         f"<!-- Generated by bench/e2e/build_along.py on {data['date']}; rerun it, do not "
         "edit. -->", "",
         "```sh", cmd, "```", "",
         f"Model: `{data['model']}`, {p0['n_layer']} layers x {p0['d_model']} wide, "
         f"{p0['params'] / 1e6:.0f}M parameters; {data['batch']} x {data['seq']} tokens of the "
         f"Brown corpus per step, `--attention {data['attention']}`, {data['steps']} steps per "
         f"stage (step time: median of the steps after the first). Budget: "
         f"**`--mem-limit {mib_text(data['budget_bytes'])}`**"
         + (", the largest multiple of 256 MiB below plain FP32's predicted peak" if
            data["budget_picked"] else "") + ". Each stage keeps the "
         "options of the one before and adds one. Machine: "
         f"{data['machine']}; 1-minute load average {load['min']:.1f}-{load['max']:.1f} during "
         f"the runs: {timing}. Raw data: `docs/bench/build_along.json`.", "",
         table(data), "",
         "The measured peak is the memory pool's peak over the whole run (`memfit train`'s "
         "`--log`), data loaders included; the prediction is `memfit plan --json` with the "
         "same options. A stage over the budget stops while allocating, before its first "
         "step, with exit status 3, the pool's report and the planner's advice (what would "
         "fit, fastest first; Note [Out-of-memory advice] in docs/notes/planner.md):", ""]
    for s in data["stages"]:
        if "oom" in s["run"]:
            L += [f"{s['name']}:", "", "```", s["run"]["oom"]["stderr"].rstrip(), "```", ""]
    L += ["## Where the memory goes (predicted, MiB)", "",
          "With one micro-batch a step the f32 gradients live in the activations arena, each "
          "block's from its backward on (Note [Gradients by lifetime] in docs/notes/planner.md): "
          "`grads` is 0 and `activations` is that arena, the gradient slab included.", "",
          breakdown(data), ""]
    for prev, s in zip(data["stages"], data["stages"][1:]):
        a, b = prev["plan"]["by_category"], s["plan"]["by_category"]
        moved = [f"{c} {a.get(c, 0) / MIB:.1f} -> {b.get(c, 0) / MIB:.1f}"
                 for c in sorted(set(a) | set(b)) if a.get(c, 0) != b.get(c, 0)]
        L.append(f"- **{s['name']}** ({s['adds']}): {', '.join(moved)}; total "
                 f"{prev['plan']['peak_bytes'] / MIB:.1f} -> {s['plan']['peak_bytes'] / MIB:.1f}. "
                 + WHY.get(s["name"], ""))
    L.append("")
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(L))
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memfit", default=os.path.join(ROOT, "build", "memfit"))
    ap.add_argument("--model", default="gpt2-medium")
    # 8 x 512: with one micro-batch a step the gradients share the activations arena (Note
    # [Gradients by lifetime]), which at 4 x 256 absorbs nearly all of plain FP32's activations,
    # leaving checkpointing nothing to save; at 8 x 512 they are three times the slab.
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--attention", default="flash")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--mem-limit", type=parse_bytes, default=0,
                    help="budget, e.g. 6GiB (default: picked from the plans, see above)")
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "brown"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "bench", "build_along.json"))
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "build-along.md"))
    ap.add_argument("--doc-only", action="store_true",
                    help="rewrite --doc from the JSON in --out without running anything")
    args = ap.parse_args()
    if args.doc_only:
        with open(args.out) as f:
            write_doc(args.doc, json.load(f))
        return
    if not os.path.exists(os.path.join(args.data, "train_000000.bin")):
        sys.exit(f"no token shards in {args.data}: run bash scripts/setup.sh first")

    stages = stage_options()
    plans = [plan(args, opts) for _, _, opts in stages]
    if not all(p["data_included"] for p in plans):
        sys.exit("the plan did not include the data loaders")
    budget = args.mem_limit or pick_budget(plans)
    print(f"budget {budget} bytes ({budget / MIB:.0f} MiB)", file=sys.stderr)
    loads = [os.getloadavg()[0]]
    rows = []
    for (name, what, opts), p in zip(stages, plans):
        r = train(args, opts, budget)
        loads.append(os.getloadavg()[0])
        rows.append({"name": name, "adds": what, "options": opts, "plan": p, "run": r})
        got = (f"OOM ({r['oom']['requested_mib']:.1f} MiB {r['oom']['category']})" if "oom" in r
               else f"{r['peak_bytes'] / MIB:.1f} MiB, {r['median_step_seconds']:.2f} s/step")
        print(f"{name:18} predicted {p['peak_bytes'] / MIB:8.1f} MiB  measured {got}  "
              f"({r['seconds']:.0f} s)", file=sys.stderr, flush=True)
    cmd = "python3 bench/e2e/build_along.py"
    for k in ("model", "batch", "seq", "attention", "steps", "mem_limit"):
        if getattr(args, k) != ap.get_default(k):
            cmd += f" --{k.replace('_', '-')} {getattr(args, k)}"
    data = {"command": cmd, "date": datetime.date.today().isoformat(), "machine": machine(),
            "cores": os.cpu_count(),
            "model": args.model, "batch": args.batch, "seq": args.seq,
            "attention": args.attention, "steps": args.steps, "budget_bytes": budget,
            "budget_picked": not args.mem_limit,
            "load_avg_1min": {"min": min(loads), "max": max(loads)}, "stages": rows}
    print("\n" + table(data))
    for path in (args.out, args.doc):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(args.out + ".tmp", "w") as f:
        json.dump(data, f, indent=1)
    os.replace(args.out + ".tmp", args.out)
    write_doc(args.doc, data)

if __name__ == "__main__":
    main()
