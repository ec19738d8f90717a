#!/usr/bin/env python3
"""Mixed precision, side by side in one run: memfit's training step in fp32, bf16, fp16 and pure
bf16 (--master-weights none), PyTorch 1.13 in fp32 and with torch.autocast("cpu", bfloat16), and
the bare oneDNN bf16/f32 GEMM rate measured in the same run (the FLOP-rate target is half the
bf16 GEMM rate). Each configuration runs `--repeats` times, interleaved, and the table quotes the
median of the per-run medians: this machine is noisy.

    /usr/bin/python3 bench/e2e/precision_vs_pytorch.py [--shapes gpt2-small-test:8x256,gpt2:8x256]

Needs scripts/setup_bench.sh and a build with bench tools (build/train_step_tool,
build/gemm_rate_tool). Writes docs/bench/precision_vs_pytorch.json. --isa avx2 runs both sides
as on an AVX2-only CPU (bench_common.isa_env): memfit's bf16 then widens its matmuls through the
f32 GEMM, so its efficiency is against the f32 GEMM rate.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import cpu_model, isa_env  # noqa: E402
from step_vs_pytorch import ROOT, TOOL, run_torch  # noqa: E402

MEMFIT = [  # name, train_step_tool options
    ("fp32", ["--precision", "fp32"]),
    ("bf16", ["--precision", "bf16"]),
    ("fp16", ["--precision", "fp16", "--attention", "plain"]),
    ("pure-bf16", ["--precision", "bf16", "--master-weights", "none"]),
]
CATS = ("params", "master", "grads", "optimizer", "activations", "workspace")


def run_memfit(model, B, T, steps, warmup, extra, isa):
    out = subprocess.run([TOOL, "--model", model, "--batch", str(B), "--seq", str(T),
                          "--steps", str(steps), "--warmup", str(warmup)] + extra,
                         check=True, capture_output=True, text=True, env=isa_env(isa))
    return json.loads(out.stdout)


def gemm_rate(isa):
    out = subprocess.run([os.path.join(ROOT, "build", "gemm_rate_tool"), "2048", "5"],
                         check=True, capture_output=True, text=True, env=isa_env(isa))
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="gpt2-small-test:8x256,gpt2:8x256")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", default="3,1", help="repeats per shape, comma-separated")
    ap.add_argument("--torch-fp32-steps", type=int, default=2,
                    help="PyTorch fp32 is slow at gpt2 size; fewer steps for it")
    ap.add_argument("--isa", default="", help="run both sides capped, e.g. avx2 (bench_common)")
    ap.add_argument("--runs", default="", help="comma-separated subset of the runs, e.g. fp32,bf16")
    ap.add_argument("--no-torch", action="store_true", help="memfit only")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "bench",
                                                  "precision_vs_pytorch.json"))
    args = ap.parse_args()
    shapes = args.shapes.split(",")
    repeats = [int(r) for r in args.repeats.split(",")]
    repeats += [repeats[-1]] * (len(shapes) - len(repeats))
    results = {"gemm": [], "shapes": {}, "cpu": cpu_model(), "isa_cap": args.isa or None}
    memfit_runs = [(n, e) for n, e in MEMFIT if not args.runs or n in args.runs.split(",")]
    for spec, reps in zip(shapes, repeats):
        model, bt = spec.split(":")
        B, T = (int(x) for x in bt.split("x"))
        runs = {name: [] for name, _ in memfit_runs}
        if not args.no_torch:
            runs["pytorch-fp32"], runs["pytorch-autocast-bf16"] = [], []
        for r in range(reps):
            results["gemm"].append(gemm_rate(args.isa))
            for name, extra in memfit_runs:
                runs[name].append(run_memfit(model, B, T, args.steps, args.warmup, extra,
                                             args.isa))
                print(f"{spec} {name} {runs[name][-1]['median_ms']:.0f} ms", file=sys.stderr)
            if args.no_torch:
                continue
            runs["pytorch-autocast-bf16"].append(run_torch(model, B, T, args.steps, args.warmup,
                                                           autocast=True, isa=args.isa))
            runs["pytorch-fp32"].append(run_torch(model, B, T, args.torch_fp32_steps,
                                                  args.warmup, isa=args.isa))
            print(f"{spec} pytorch {runs['pytorch-fp32'][-1]['median_ms']:.0f} / "
                  f"{runs['pytorch-autocast-bf16'][-1]['median_ms']:.0f} ms", file=sys.stderr)
        results["shapes"][spec] = runs

    f32_rate = statistics.median(g["f32_tflops"] for g in results["gemm"])
    native = all(g["bf16_tflops"] is not None for g in results["gemm"])
    # Where oneDNN has no bf16 matmul, bf16 matmuls run on the f32 GEMM: that is their rate.
    bf16_rate = (statistics.median(g["bf16_tflops"] for g in results["gemm"]) if native
                 else f32_rate)
    print(f"CPU: {results['cpu']}" + (f", capped to {args.isa}" if args.isa else "") +
          f"; oneDNN ISA {results['gemm'][0]['onednn_isa']}")
    print(f"bare oneDNN 2048^3 GEMM in this run: bf16 " +
          (f"{bf16_rate:.2f} TFLOP/s" if native else "none (widened: the f32 rate)") +
          f", f32 {f32_rate:.3f} TFLOP/s (median of {len(results['gemm'])})\n")
    print("| shape | run | ms/step | tokens/s | TFLOP/s | of its GEMM rate | vs memfit fp32 | "
          "vs PyTorch autocast | pool peak MiB | "
          "params/master/grads/optimizer/activations/workspace MiB | RSS MiB |")
    print("|" + "---|" * 11)
    summary = {}
    for spec, runs in results["shapes"].items():
        med = {k: statistics.median(r["median_ms"] for r in v) for k, v in runs.items()}
        summary[spec] = med
        for name, v in runs.items():
            d = v[-1]
            tok = d["batch"] * d["seq"] / (med[name] / 1e3)
            tflops = d["flops_per_step"] / (med[name] / 1e3) / 1e12
            pool = cats = ""
            if "pool_peak_bytes" in d:
                pool = f"{d['pool_peak_bytes'] / 2**20:.0f}"
                c = d["pool_peak_by_category"]
                cats = "/".join(f"{c.get(k, 0) / 2**20:.0f}" for k in CATS)
            rate = f32_rate if name in ("fp32", "fp16", "pytorch-fp32") else bf16_rate
            vs32 = f"{med['fp32'] / med[name]:.2f}x" if "fp32" in med else ""
            vsac = (f"{med['pytorch-autocast-bf16'] / med[name]:.2f}x"
                    if "pytorch-autocast-bf16" in med else "")
            print(f"| {spec} | {name} | {med[name]:.0f} | {tok:.0f} | {tflops:.3f} | "
                  f"{100 * tflops / rate:.0f}% | {vs32} | {vsac}"
                  f" | {pool} | {cats} | {d['peak_rss_bytes'] / 2**20:.0f} |")
    results["summary_median_ms"] = summary
    results["gemm_bf16_tflops"], results["gemm_f32_tflops"] = bf16_rate, f32_rate
    with open(args.out + ".tmp", "w") as f:
        json.dump(results, f, indent=1)
    os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
