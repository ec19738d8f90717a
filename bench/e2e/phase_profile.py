#!/usr/bin/env python3
"""Where a training step's time goes, phase by phase, at several precisions, ISA caps and thread
counts: runs `memfit train --profile` for each configuration and sums its trace's phases by kind
(the embedding, the blocks' forward, the LM head, the blocks' backward, the optimizer, the rest of
the step), over the profiled steps after the first (whose first touches of the pool's pages are
not a step's cost). A phase that does not shrink as threads are added is what stops a step from
scaling with cores; a phase far above its FLOPs at the bare GEMM rate is what keeps a step below
the GEMM's efficiency (issue 12). Under the table, each configuration's slowest kernels per step
with the GEMMs' rates (Note [Kernel times]), to hold against the bare GEMM rate.

    /usr/bin/python3 bench/e2e/phase_profile.py --precisions fp32,bf16 --isas native,avx2 \
        --threads 0 [--model gpt2 --batch 8 --seq 256] [--out FILE]

Needs data/brown (`memfit prepare --input brown --out data/brown`) and build/memfit.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import ROOT, cpu_model, isa_env  # noqa: E402

MEMFIT = os.path.join(ROOT, "build", "memfit")
KINDS = ("embedding", "blocks forward", "LM head", "blocks backward", "optimizer", "other")


def kind_of(name):
    """The phase kind of a trace event's name ("forward of block 3" -> "blocks forward")."""
    if name.startswith("forward of block") or name.startswith("recompute"):
        return "blocks forward"
    if name.startswith("backward of block"):
        return "blocks backward"
    if name.startswith("LM head"):
        return "LM head"
    if name.startswith("embedding"):
        return "embedding"
    return "other"


def phases_from_trace(path):
    """Per step (after the first): the step's length and its phases' milliseconds by kind."""
    with open(path) as f:
        d = json.load(f)
    events = d["traceEvents"] if isinstance(d, dict) else d
    spans = [e for e in events if e.get("ph") == "X"]
    steps = sorted((e for e in spans if e.get("cat") == "step"), key=lambda e: e["ts"])[1:]
    out = []
    for s in steps:
        t0, t1 = s["ts"], s["ts"] + s["dur"]
        ms = dict.fromkeys(KINDS, 0.0)
        step_ms = s["dur"] / 1e3  # less the evaluation that the run's last step ends with
        for e in spans:
            if not (t0 <= e["ts"] and e["ts"] + e["dur"] <= t1):
                continue
            if e.get("cat") == "phase" and e.get("args", {}).get("training", True):
                ms[kind_of(e["name"])] += e["dur"] / 1e3
            elif e.get("cat") == "optimizer":
                ms["optimizer"] += e["dur"] / 1e3
            elif e.get("cat") == "evaluation":
                step_ms -= e["dur"] / 1e3
        ms["other"] += step_ms - sum(ms.values())
        out.append({"step_ms": step_ms, "phases_ms": ms})
    return out


def run(args, precision, isa, threads):
    with tempfile.TemporaryDirectory() as tmp:
        prof = os.path.join(tmp, "profile")
        cmd = [MEMFIT, "train", "--model", args.model, "--data", args.data,
               "--batch", str(args.batch), "--seq-len", str(args.seq),
               # One step more than the window, so that the run's closing evaluation is not in it.
               "--precision", precision, "--steps", str(args.steps + 1),
               "--profile", prof, "--profile-steps", str(args.steps), "--eval-batches", "1",
               "--threads", str(threads)] + args.extra.split()
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp,
                           env=isa_env("" if isa == "native" else isa))
        if r.returncode != 0:
            sys.exit(f"exit {r.returncode}: {' '.join(cmd)}\n{r.stderr[-2000:]}")
        steps = phases_from_trace(os.path.join(prof, "trace.json"))
        with open(os.path.join(prof, "summary.json")) as f:
            kernels = json.load(f).get("kernels", [])
    med = {k: statistics.median(s["phases_ms"][k] for s in steps) for k in KINDS}
    # The kernel times cover the whole window, the first step too: per step, over all of them.
    per_step = [dict(k, ms=k["ms"] / args.steps, calls=k["calls"] / args.steps) for k in kernels]
    return {"precision": precision, "isa": isa, "threads": threads,
            "step_ms": [s["step_ms"] for s in steps],
            "median_step_ms": statistics.median(s["step_ms"] for s in steps),
            "median_phases_ms": med, "kernels_per_step": per_step}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "brown"))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3, help="profiled steps; the first is dropped")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--isas", default="native", help="comma-separated: native, avx2, ...")
    ap.add_argument("--threads", default="0", help="comma-separated thread counts (0: all)")
    ap.add_argument("--extra", default="", help="more memfit train options, space-separated")
    ap.add_argument("--top", type=int, default=20, help="kernels listed per configuration")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.steps < 2:
        sys.exit("--steps must be at least 2: the first profiled step is dropped")
    rows = []
    for isa in args.isas.split(","):
        for threads in (int(t) for t in args.threads.split(",")):
            for precision in args.precisions.split(","):
                rows.append(run(args, precision, isa, threads))
                print(f"{precision} {isa} threads {threads}: {rows[-1]['median_step_ms']:.0f} ms",
                      file=sys.stderr, flush=True)
    print(f"CPU: {cpu_model('unknown')}, {os.cpu_count()} logical CPUs; {args.model} "
          f"{args.batch}x{args.seq}; median over {args.steps - 1} steps (the first dropped); ms\n")
    print("| precision | ISA | threads | step | " + " | ".join(KINDS) + " |")
    print("|---|---|---|---|" + "---|" * len(KINDS))
    for r in rows:
        cells = " | ".join(f"{r['median_phases_ms'][k]:.0f}" for k in KINDS)
        print(f"| {r['precision']} | {r['isa']} | {r['threads'] or 'all'} | "
              f"{r['median_step_ms']:.0f} | {cells} |")
    for r in rows:
        ks = r["kernels_per_step"]
        gemm = sum(k["ms"] for k in ks if k["name"].startswith("gemm"))
        print(f"\n{r['precision']}, {r['isa']}, threads {r['threads'] or 'all'}: kernels per step "
              f"(self time, mean over the profiled steps): GEMMs {gemm:.0f} ms, the rest "
              f"{sum(k['ms'] for k in ks) - gemm:.0f} ms; the {min(args.top, len(ks))} slowest:")
        for k in ks[:args.top]:
            rate = f"{k['gflops_per_s']:.0f} GFLOP/s" if "gflops_per_s" in k else ""
            print(f"  {k['ms']:8.1f} ms  {k['calls']:6.1f} calls  {rate:>14}  {k['name']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"cpu": cpu_model("unknown"), "cpus": os.cpu_count(), "model": args.model,
                       "batch": args.batch, "seq": args.seq, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
