#!/usr/bin/env python3
"""Mixed precision, side by side in one run: memfit's training step in fp32, bf16, fp16 and pure
bf16 (--master-weights none), PyTorch 1.13 in fp32 and with torch.autocast("cpu", bfloat16), and
the bare oneDNN bf16/f32 GEMM rate measured in the same run (the FLOP-rate target is half the
bf16 GEMM rate). Each configuration runs `--repeats` times, interleaved, and the table quotes the
median of the per-run medians: this machine is noisy.

    /usr/bin/python3 bench/e2e/precision_vs_pytorch.py [--shapes gpt2-small-test:8x256,gpt2:8x256]

Needs scripts/setup_bench.sh and a build with bench tools (build/train_step_tool,
build/gemm_rate_tool). Writes docs/bench/precision_vs_pytorch.json.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_vs_pytorch import ROOT, TOOL, run_torch  # noqa: E402

MEMFIT = [  # name, train_step_tool options
    ("fp32", ["--precision", "fp32"]),
    ("bf16", ["--precision", "bf16"]),
    ("fp16", ["--precision", "fp16", "--attention", "plain"]),
    ("pure-bf16", ["--precision", "bf16", "--master-weights", "none"]),
]
CATS = ("params", "master", "grads", "optimizer", "activations", "workspace")


def run_memfit(model, B, T, steps, warmup, extra):
    out = subprocess.run([TOOL, "--model", model, "--batch", str(B), "--seq", str(T),
                          "--steps", str(steps), "--warmup", str(warmup)] + extra,
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def gemm_rate():
    out = subprocess.run([os.path.join(ROOT, "build", "gemm_rate_tool"), "2048", "5"],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="gpt2-small-test:8x256,gpt2:8x256")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", default="3,1", help="repeats per shape, comma-separated")
    ap.add_argument("--torch-fp32-steps", type=int, default=2,
                    help="PyTorch fp32 is slow at gpt2 size; fewer steps for it")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "bench",
                                                  "precision_vs_pytorch.json"))
    args = ap.parse_args()
    shapes = args.shapes.split(",")
    repeats = [int(r) for r in args.repeats.split(",")]
    repeats += [repeats[-1]] * (len(shapes) - len(repeats))
    results = {"gemm": [], "shapes": {}}
    for spec, reps in zip(shapes, repeats):
        model, bt = spec.split(":")
        B, T = (int(x) for x in bt.split("x"))
        runs = {name: [] for name, _ in MEMFIT}
        runs["pytorch-fp32"], runs["pytorch-autocast-bf16"] = [], []
        for r in range(reps):
            results["gemm"].append(gemm_rate())
            for name, extra in MEMFIT:
                runs[name].append(run_memfit(model, B, T, args.steps, args.warmup, extra))
                print(f"{spec} {name} {runs[name][-1]['median_ms']:.0f} ms", file=sys.stderr)
            runs["pytorch-autocast-bf16"].append(run_torch(model, B, T, args.steps, args.warmup,
                                                           autocast=True))
            runs["pytorch-fp32"].append(run_torch(model, B, T, args.torch_fp32_steps,
                                                  args.warmup))
            print(f"{spec} pytorch {runs['pytorch-fp32'][-1]['median_ms']:.0f} / "
                  f"{runs['pytorch-autocast-bf16'][-1]['median_ms']:.0f} ms", file=sys.stderr)
        results["shapes"][spec] = runs

    bf16_rate = statistics.median(g["bf16_tflops"] for g in results["gemm"])
    f32_rate = statistics.median(g["f32_tflops"] for g in results["gemm"])
    print(f"bare oneDNN 2048^3 GEMM in this run: bf16 {bf16_rate:.2f} TFLOP/s, "
          f"f32 {f32_rate:.3f} TFLOP/s (median of {len(results['gemm'])})\n")
    print("| shape | run | ms/step | tokens/s | TFLOP/s | vs memfit fp32 | vs PyTorch autocast | "
          "pool peak MiB | params/master/grads/optimizer/activations/workspace MiB | RSS MiB |")
    print("|" + "---|" * 10)
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
            print(f"| {spec} | {name} | {med[name]:.0f} | {tok:.0f} | {tflops:.3f} | "
                  f"{med['fp32'] / med[name]:.2f}x | {med['pytorch-autocast-bf16'] / med[name]:.2f}x"
                  f" | {pool} | {cats} | {d['peak_rss_bytes'] / 2**20:.0f} |")
    results["summary_median_ms"] = summary
    results["gemm_bf16_tflops"], results["gemm_f32_tflops"] = bf16_rate, f32_rate
    with open(args.out + ".tmp", "w") as f:
        json.dump(results, f, indent=1)
    os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
