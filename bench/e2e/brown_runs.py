#!/usr/bin/env python3
"""Training runs on the Brown corpus that compare settings from the same initial weights and
the same data order (same seed): precisions (issue 4's fidelity check), optimizers (issue 7's
convergence check) or activation compression (issue 17's). Each run is `memfit train --config configs/brown-6x384.toml` plus its own
options; the script reads the JSON-lines logs and prints a Markdown table of the final
validation loss, its gap to the first run, the loss curve at a few steps, tokens/s and peak
memory, and writes everything to docs/bench/brown_<suite>.json.

  python3 bench/e2e/brown_runs.py precision     # 300 steps: fp32, bf16, fp16, pure bf16
  python3 bench/e2e/brown_runs.py optimizers    # 600 steps in bf16: adamw, adamw8bit, lion, ...
  python3 bench/e2e/brown_runs.py act_compress  # 600 steps in bf16: --act-compress none, int8, fp8
  python3 bench/e2e/brown_runs.py low_state     # 600 steps in bf16: adamw4bit, apollo, ...
  python3 bench/e2e/brown_runs.py low_state_124m  # 300 steps of GPT-2 124M: adamw, apollo-mini,
                                                  # galore, galore8bit, adamw8bit (issue 44's 100M+ runs)
  python3 bench/e2e/brown_runs.py fp8           # 600 steps: --precision bf16 against fp8 (issue 44
                                                # item 3: the final val loss within 1% of bf16's)

Long (minutes per run): a benchmark, not a test. Expects build/memfit and data/brown
(scripts/train_brown.sh prepares it). --steps N shortens the runs for a smoke test.
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SUITES = {
    # fp16 runs plain attention (flash has no f16 path); fp32 and flash agree to 1e-5.
    "precision": (300, [
        ("fp32", ["--precision", "fp32"]),
        ("bf16", ["--precision", "bf16"]),
        ("fp16", ["--precision", "fp16", "--attention", "plain"]),
        ("pure-bf16", ["--precision", "bf16", "--master-weights", "none"]),
    ]),
    # Lion: the usual 10x smaller learning rate and 10x larger weight decay (lr * wd unchanged).
    "optimizers": (600, [
        ("adamw", ["--optim", "adamw"]),
        ("adamw8bit", ["--optim", "adamw8bit"]),
        ("lion", ["--optim", "lion", "--lr", "1e-4", "--min-lr", "1e-5", "--weight-decay", "1.0"]),
        ("lion8bit", ["--optim", "lion8bit", "--lr", "1e-4", "--min-lr", "1e-5",
                      "--weight-decay", "1.0"]),
        ("adam-mini", ["--optim", "adam-mini"]),
    ]),
    # Issue 44's optimizers with less state (and the update fused into the backward), beside
    # AdamW at the same learning rate; the fused update clips each unit by its own norm.
    "low_state": (600, [
        ("adamw", ["--optim", "adamw"]),
        ("adamw8bit", ["--optim", "adamw8bit"]),
        ("adamw4bit", ["--optim", "adamw4bit"]),
        ("adamw-bf16-state", ["--optim", "adamw", "--optim-state-dtype", "bf16"]),
        ("apollo", ["--optim", "apollo"]),
        ("apollo-mini", ["--optim", "apollo-mini"]),
        ("galore", ["--optim", "galore"]),
        ("galore8bit", ["--optim", "galore8bit"]),
        ("adamw-uib-unit-clip", ["--optim", "adamw", "--update-in-backward",
                                 "--clip-mode", "unit"]),
    ]),
    # The best two of low_state at GPT-2 small's size (124M), where the low-rank methods'
    # papers report them closer to AdamW than at 30M: GaLore at its paper's 130M rank (256),
    # APOLLO-Mini at rank 1, AdamW beside them; GPT-2's usual 6e-4 for all three.
    "low_state_124m": (300, [
        ("adamw", ["--optim", "adamw"]),
        ("apollo-mini", ["--optim", "apollo-mini"]),
        ("galore", ["--optim", "galore", "--optim-rank", "256"]),
        ("galore8bit", ["--optim", "galore8bit", "--optim-rank", "256"]),
        ("adamw8bit", ["--optim", "adamw8bit"]),
    ]),
    # The saved activations in 8 bits (Note [Activation compression]), from the same start.
    "act_compress": (600, [
        ("none", ["--act-compress", "none"]),
        ("int8", ["--act-compress", "int8"]),
        ("fp8", ["--act-compress", "fp8"]),
    ]),
    # --precision fp8 (Note [FP8]): the blocks' linears on E4M3/E5M2 operands against bf16, from
    # the same start; the aim is a final validation loss within 1% of bf16's.
    "fp8": (600, [
        ("bf16", ["--precision", "bf16"]),
        ("fp8", ["--precision", "fp8"]),
    ]),
}
# The optimizer and compression runs take micro-batches of 4 x 256 to keep 600-step runs within
# minutes each on two cores.
SUITE_COMMON = {"precision": [], "optimizers": ["--precision", "bf16", "--batch", "4"],
                "act_compress": ["--precision", "bf16", "--batch", "4"],
                # No budget, no checkpointing, no profile: the optimizers alone differ (the
                # config's --ckpt auto under 630 MiB would choose per optimizer).
                "low_state": ["--precision", "bf16", "--batch", "4", "--ckpt", "none",
                              "--mem-limit", "8GiB", "--profile", ""],
                "low_state_124m": ["--model", "gpt2", "--precision", "bf16", "--batch", "4",
                                   "--ckpt", "none", "--mem-limit", "8GiB", "--profile", "",
                                   "--lr", "6e-4", "--min-lr", "6e-5"],
                # As low_state: the config's --ckpt auto would choose per precision (fp8's cast
                # buffers are larger), and two runs at once would share its profile directory.
                "fp8": ["--batch", "4", "--ckpt", "none", "--mem-limit", "8GiB", "--profile", ""]}
# Suites with a stated aim: the largest |gap| to the first run's final validation loss, in %.
SUITE_AIM = {"fp8": 1.0}


def read_log(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run(suite, name, extra, steps, out_dir, memfit, common=()):
    log = os.path.join(out_dir, name + ".jsonl")
    cmd = [memfit, "train", "--config",
           os.path.join(ROOT, "configs", "brown-6x384.toml"), "--steps", str(steps),
           "--eval-every", str(max(1, steps // 6)), "--log", log,
           "--save", os.path.join(out_dir, name)] + SUITE_COMMON[suite] + list(common) + extra
    print("$", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    lines = read_log(log)
    train = [l for l in lines if "loss" in l]
    val = [l for l in lines if "val_loss" in l]
    rates = sorted(l["tokens_per_s"] for l in train)
    return {
        "name": name, "args": extra, "steps": steps,
        "train_loss": [l["loss"] for l in train],
        "val": [[l["step"], l["val_loss"]] for l in val],
        "final_val_loss": val[-1]["val_loss"],
        "median_tokens_per_s": rates[len(rates) // 2],
        "peak_bytes": max(l["peak_bytes"] for l in train),
        "skipped": sum(1 for l in train if l.get("skipped")),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("suite", choices=sorted(SUITES))
    ap.add_argument("--steps", type=int, default=0, help="override the suite's steps")
    ap.add_argument("--only", default="", help="comma-separated run names")
    ap.add_argument("--out", default="")
    ap.add_argument("--memfit", default=os.path.join(ROOT, "build", "memfit"),
                    help="the binary (a copy keeps a rebuild from changing it mid-suite)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="runs at once (on a shared machine under nice, give each --threads 1)")
    ap.add_argument("--threads", type=int, default=0,
                    help="--threads for every run (0: memfit's default, all cores); the same "
                         "for all, so the runs stay comparable")
    args = ap.parse_args()
    steps, runs = SUITES[args.suite]
    steps = args.steps or steps
    if args.only:
        keep = args.only.split(",")
        runs = [r for r in runs if r[0] in keep]
    out_dir = os.path.join(ROOT, "out", "brown_" + args.suite)
    os.makedirs(out_dir, exist_ok=True)
    common = ["--threads", str(args.threads)] if args.threads else []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(
            lambda r: run(args.suite, r[0], r[1], steps, out_dir, args.memfit, common), runs))

    ref = results[0]["final_val_loss"]
    marks = sorted({s for r in results for s, _ in r["val"]})
    batch = "4" if "--batch" in SUITE_COMMON[args.suite] else "8"
    shape = "GPT-2 124M" if "--model" in SUITE_COMMON[args.suite] else "6x384 GPT-2"
    print(f"\n{args.suite}: {steps} steps, {shape}, {batch} x 256 tokens, Brown corpus, "
          f"{' '.join(SUITE_COMMON[args.suite]) or 'fp32'}\n")
    print("| run | final val loss | gap to " + results[0]["name"] + " | " +
          " | ".join(f"val @{m}" for m in marks) + " | tokens/s | peak MiB | skipped |")
    print("|---" * (6 + len(marks)) + "|")
    for r in results:
        v = dict((s, x) for s, x in r["val"])
        gap = (r["final_val_loss"] - ref) / ref * 100
        print(f"| {r['name']} | {r['final_val_loss']:.4f} | {gap:+.2f}% | " +
              " | ".join(f"{v[m]:.3f}" if m in v else "" for m in marks) +
              f" | {r['median_tokens_per_s']:.0f} | {r['peak_bytes'] / 2**20:.0f} | {r['skipped']} |")
    aim = SUITE_AIM.get(args.suite)
    if aim is not None:
        worst = max(abs(r["final_val_loss"] - ref) / ref * 100 for r in results)
        print(f"\naim: every run within {aim}% of {results[0]['name']}'s final val loss: "
              f"{'met' if worst <= aim else 'NOT met'} (worst {worst:.2f}%)")
    out = args.out or os.path.join(ROOT, "docs", "bench", f"brown_{args.suite}.json")
    if not args.steps:
        with open(out, "w") as f:
            json.dump({"suite": args.suite, "steps": steps, "common": SUITE_COMMON[args.suite] +
                       common, "runs": results}, f, indent=1)
        print(f"\nwrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
