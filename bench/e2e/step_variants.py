#!/usr/bin/env python3
"""Variants of one training step side by side: each variant is train_step_tool with its own
options and environment (an ISA cap, OpenMP's thread placement, a switch of memfit's), run
`--repeats` times interleaved so that a machine's drift falls on every variant alike; the table
gives each variant's median step (the median of its runs' medians), its ratio to the first, and
where --kernel-times is on the kernels whose time differs most from the first variant's.

    python3 bench/e2e/step_variants.py --model gpt2 --batch 8 --seq 256 \\
        --variant 'fp32 capped|MEMFIT_MAX_ISA=avx2|--precision fp32' \\
        --variant 'bf16 capped|MEMFIT_MAX_ISA=avx2|--precision bf16' [--repeats 2] [--out F]

A variant is "name|ENV=V ENV2=V2|train_step_tool options" (either part may be empty). Needs
build/train_step_tool.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import ROOT, cpu_model  # noqa: E402

TOOL = os.path.join(ROOT, "build", "train_step_tool")


def parse_variant(text):
    parts = text.split("|")
    if len(parts) != 3:
        sys.exit(f"--variant '{text}': expected 'name|ENV=V ...|options'")
    name, env, opts = parts
    env_pairs = dict(kv.split("=", 1) for kv in env.split())
    return {"name": name.strip(), "env": env_pairs, "args": opts.split()}


def run(v, args):
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    env.update(v["env"])
    cmd = [TOOL, "--model", args.model, "--batch", str(args.batch), "--seq", str(args.seq),
           "--steps", str(args.steps), "--warmup", str(args.warmup)]
    if args.kernel_times:
        cmd += ["--kernel-times", "1"]
    out = subprocess.run(cmd + v["args"], check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout)


def kernel_ms(run_json):
    return {k["name"]: k["ms"] for k in run_json.get("kernels", [])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--kernel-times", action="store_true")
    ap.add_argument("--variant", action="append", required=True)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    variants = [parse_variant(t) for t in args.variant]
    runs = {v["name"]: [] for v in variants}
    for r in range(args.repeats):
        for v in variants:
            j = run(v, args)
            runs[v["name"]].append(j)
            print(f"{v['name']}: {j['median_ms']:.1f} ms (round {r + 1})", file=sys.stderr)
    first = variants[0]["name"]
    med = {n: statistics.median(j["median_ms"] for j in js) for n, js in runs.items()}
    print(f"\nCPU: {cpu_model()}; {args.model} {args.batch}x{args.seq}; median of "
          f"{args.repeats} runs' medians over {args.steps} steps; ms")
    print("\n| variant | env | options | step ms | vs first | TFLOP/s | pool peak MiB | loss |")
    print("|---|---|---|---|---|---|---|---|")
    for v in variants:
        n = v["name"]
        j = runs[n][-1]
        env = " ".join(f"{k}={x}" for k, x in v["env"].items())
        tflops = j["flops_per_step"] / (med[n] / 1e3) / 1e12
        print(f"| {n} | {env} | {' '.join(v['args'])} | {med[n]:.0f} | {med[n] / med[first]:.3f} "
              f"| {tflops:.3f} | {j['pool_peak_bytes'] / 2**20:.1f} | {j['losses'][-1]:.5f} |")
    if args.kernel_times:
        base = kernel_ms(runs[first][-1])
        for v in variants[1:]:
            k = kernel_ms(runs[v["name"]][-1])
            diffs = sorted(set(base) | set(k), key=lambda n: -abs(k.get(n, 0) - base.get(n, 0)))
            print(f"\n{v['name']} against {first}, the kernels that moved most (ms a step):")
            for n in diffs[:8]:
                print(f"  {base.get(n, 0):8.1f} -> {k.get(n, 0):8.1f}  {n}")
        for v in variants:
            k = kernel_ms(runs[v["name"]][-1])
            gemm = sum(x for n, x in k.items() if n.startswith("gemm"))
            rest = sorted(((x, n) for n, x in k.items() if not n.startswith("gemm")), reverse=True)
            print(f"\n{v['name']}: GEMMs {gemm:.1f} ms, the rest {sum(x for x, _ in rest):.1f}: " +
                  ", ".join(f"{n} {x:.1f}" for x, n in rest[:10]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"cpu": cpu_model(), "model": args.model, "batch": args.batch,
                       "seq": args.seq, "variants": variants, "median_ms": med, "runs": runs},
                      f, indent=1)


if __name__ == "__main__":
    main()
