#!/usr/bin/env python3
"""ZeRO per rank (issue 14, "Measure"): for W ranks and each stage, every rank's pool peak by
category as `mpirun -n W memfit train` measures it (the run's last log line) against `memfit
plan --world-size W --zero K --json` (per_rank), the bytes each step's collectives cover against
the plan's comm_per_step and the paper's 2Ψ (3Ψ at stage 3), and the median step time against W = 1 at the same
global batch. Numbers from a shared or oversubscribed machine say nothing about speed: run it on
a quiet one, cores >= W x --threads.

    python3 bench/e2e/zero_memory.py --model gpt2 --data data/brown          # gpt2 124M
    python3 bench/e2e/zero_memory.py --model gpt2 --n-layer 24 --d-model 1024 --n-head 16  # 350M
    python3 bench/e2e/zero_memory.py --model gpt2-tiny --n-layer 2 --steps 3 --quick  # smoke

Prints a table and writes JSON (--out).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from bench_common import ROOT, cpu_model, run_json

MODEL_STATE = ("params", "master", "grads", "optimizer")


def train(args, ranks, zero, batch, log):
    base = [os.path.join(ROOT, "build", "memfit"), "train", "--model", args.model,
            "--seq-len", str(args.seq_len), "--batch", str(batch), "--steps", str(args.steps),
            "--precision", args.precision, "--grad-dtype", args.grad_dtype, "--threads",
            str(args.threads), "--data", args.data,
            "--zero", str(zero), "--log", log, "--eval-batches", "1"]
    if args.n_layer:
        base += ["--n-layer", str(args.n_layer)]
    if args.vocab:
        base += ["--vocab", str(args.vocab)]
    for opt in ("d_model", "n_head"):
        if getattr(args, opt):
            base += ["--" + opt.replace("_", "-"), str(getattr(args, opt))]
    cmd = base if ranks == 1 else ["mpirun", "-n", str(ranks), "--allow-run-as-root",
                                   "--oversubscribe"] + base
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"exit {r.returncode}: {' '.join(cmd)}\n{r.stderr[-3000:]}")
    lines = [json.loads(l) for l in open(log)]
    steps = [l for l in lines if "loss" in l]
    ranks_line = next((l["ranks"] for l in lines if "ranks" in l), None)
    if ranks_line is None:  # one process: its own peak
        peak = max(l["peak_bytes"] for l in steps)
        ranks_line = [{"rank": 0, "peak_bytes": peak, "mem": steps[-1]["mem"]}]
    return steps, ranks_line


def plan(args, ranks, zero, batch):
    cmd = [os.path.join(ROOT, "build", "memfit"), "plan", "--model", args.model, "--seq-len",
           str(args.seq_len), "--batch", str(batch), "--steps", str(args.steps), "--precision",
           args.precision, "--grad-dtype", args.grad_dtype, "--threads", str(args.threads),
           "--data", args.data, "--world-size", str(ranks), "--zero", str(zero), "--json"]
    if args.n_layer:
        cmd += ["--n-layer", str(args.n_layer)]
    if args.vocab:
        cmd += ["--vocab", str(args.vocab)]
    for opt in ("d_model", "n_head"):
        if getattr(args, opt):
            cmd += ["--" + opt.replace("_", "-"), str(getattr(args, opt))]
    return run_json(cmd)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="gpt2")
    p.add_argument("--n-layer", type=int, default=0)
    p.add_argument("--vocab", type=int, default=0)
    p.add_argument("--d-model", type=int, default=0)
    p.add_argument("--n-head", type=int, default=0)
    p.add_argument("--data", default=os.path.join(ROOT, "data", "brown"))
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--precision", default="bf16")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--ranks", default="1,2,4")
    p.add_argument("--grad-dtype", default="fp32", help="fp32 | bf16 (Note [Gradients in bf16])")
    p.add_argument("--stages", default="0,1,2,3",
                   help="the stages to run over several ranks (a model whose W whole copies do "
                        "not fit the machine: leave out 0)")
    p.add_argument("--quick", action="store_true", help="W = 2 only")
    p.add_argument("--out", default="")
    args = p.parse_args()
    worlds = [2] if args.quick else [int(w) for w in args.ranks.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base_time = None
        for w in worlds:
            batch = max(1, args.global_batch // w)
            for zero in ([0] if w == 1 else [int(k) for k in args.stages.split(",")]):
                log = os.path.join(tmp, f"w{w}z{zero}.jsonl")
                steps, measured = train(args, w, zero, batch, log)
                planned = plan(args, w, zero, batch)
                per_rank = planned.get("per_rank", [{"rank": 0, "peak_bytes": planned["peak_bytes"],
                                                     "by_category": planned["by_category"]}])
                t = statistics.median(s["step_seconds"] for s in steps[1:] or steps)
                if w == 1:
                    base_time = t
                for m, pr in zip(measured, per_rank):
                    rows.append({
                        "world": w, "zero": zero, "rank": m["rank"], "batch": batch,
                        "measured_peak": m["peak_bytes"], "planned_peak": pr["peak_bytes"],
                        "measured_model_state": sum(m["mem"].get(c, 0) for c in MODEL_STATE),
                        "planned_model_state": sum(pr["by_category"].get(c, 0) for c in MODEL_STATE),
                        "comm": m["mem"].get("comm", 0),
                        "comm_per_step": steps[-1].get("comm_bytes"),
                        "psi_multiple": planned.get("comm_per_step", {}).get("psi_multiple", 0),
                        "step_seconds": t,
                        "speedup_vs_w1": (base_time / t) if base_time else None})
    mib = lambda b: b / 1048576
    print(f"{args.model}, {args.precision}, global batch {args.global_batch} x {args.seq_len}; "
          f"{cpu_model('unknown CPU')}")
    print(f"{'W':>2} {'K':>2} {'rank':>4} {'peak MiB':>10} {'plan MiB':>10} {'state MiB':>10} "
          f"{'comm MiB':>9} {'xPsi':>5} {'step s':>7}")
    for r in rows:
        ok = "" if r["measured_peak"] == r["planned_peak"] else "  <- differs"
        print(f"{r['world']:>2} {r['zero']:>2} {r['rank']:>4} {mib(r['measured_peak']):>10.1f} "
              f"{mib(r['planned_peak']):>10.1f} {mib(r['measured_model_state']):>10.1f} "
              f"{mib(r['comm']):>9.1f} {r['psi_multiple']:>5.2g} {r['step_seconds']:>7.3f}{ok}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"cpu": cpu_model(), "args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
