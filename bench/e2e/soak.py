#!/usr/bin/env python3
"""Soak: a long training run on the Brown corpus with evaluations and a checkpoint every 100
steps, watching memory for growth (issue 18). It reads `memfit train --log`: the line written
after each save carries the process's RSS (rss_bytes), the pool's live bytes (live_bytes) and
allocations, and the live bytes per category (mem). The script prints a Markdown table of them at
each save and the growth from the first save to the last, and writes docs/bench/soak.json.

  python3 bench/e2e/soak.py                 # 2,000 steps: tens of minutes on two cores
  python3 bench/e2e/soak.py --steps 200     # a smoke run (nothing written to docs/)

The model is small so the run is about memory, not arithmetic: gpt2-tiny's shape (2 layers,
96 wide) with GPT-2's vocabulary, 128 tokens a row. A leak in the pool fails the soak (exit 1);
RSS is reported, and judged against --rss-slack, since the heap and oneDNN's caches settle over
the first saves. The short form of the pool check is a test: tests/train/trainer_leak_test.cpp.
Expects build/memfit and data/brown (scripts/train_brown.sh prepares it).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

from bench_common import ROOT, cpu_model

MIB = 2**20


def read_log(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=0, help="fewer than 2,000 steps: a smoke run")
    ap.add_argument("--save-every", type=int, default=100)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--rss-slack", type=float, default=16.0,
                    help="MiB of RSS growth from the second save to the last that still passes")
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "brown"))
    ap.add_argument("--memfit", default=os.path.join(ROOT, "build", "memfit"))
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    steps = args.steps or 2000
    if not os.path.exists(os.path.join(args.data, "train_000000.bin")):
        sys.exit(f"{args.data}: no shards; run scripts/train_brown.sh once, or "
                 f"`build/memfit prepare --input brown --out {args.data}`")

    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "soak.jsonl")
        cmd = [args.memfit, "train", "--model", "gpt2-tiny", "--vocab", "50257",
               "--seq-len", "128", "--batch", "4", "--data", args.data, "--steps", str(steps),
               "--lr", "1e-3", "--warmup", "20", "--min-lr", "1e-4",
               "--eval-every", str(args.save_every), "--eval-batches", "4",
               "--save", os.path.join(tmp, "ck"), "--save-every", str(args.save_every),
               "--threads", str(args.threads), "--log", log, "--fail-on-leak"]
        print("$", " ".join(cmd), file=sys.stderr, flush=True)
        # memfit's own leak check (--fail-on-leak) exits with 4 and names what grew by tag.
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode not in (0, 4):
            sys.exit(f"exit {r.returncode}: {' '.join(cmd)}\n{r.stderr}")
        leak_check_failed = r.returncode == 4
        if leak_check_failed:
            print(r.stderr, file=sys.stderr)
        lines = read_log(log)

    saves = [l for l in lines if "saved" in l]
    train = [l for l in lines if "loss" in l]
    val = {l["step"]: l["val_loss"] for l in lines if "val_loss" in l}
    if not saves or "rss_bytes" not in saves[0]:
        sys.exit("the log has no save lines with rss_bytes: is build/memfit older than soak.py?")

    print(f"\nsoak: {steps} steps of gpt2-tiny (vocab 50257, 4 x 128 tokens) on Brown, "
          f"a save and an evaluation every {args.save_every}; {cpu_model()}\n")
    print("| step | RSS MiB | pool live MiB | live allocations | val loss |")
    print("|---|---|---|---|---|")
    for s in saves:
        v = val.get(s["step"])
        print(f"| {s['step']} | {s['rss_bytes'] / MIB:.1f} | {s['live_bytes'] / MIB:.3f} | "
              f"{s['live_allocations']} | {'' if v is None else f'{v:.3f}'} |")
    pool_growth = saves[-1]["live_bytes"] - saves[0]["live_bytes"]
    step_live = {l["live_bytes"] for l in train[1:]} if len(train) > 1 else set()
    # RSS from the second save on: the first save maps and writes files for the first time.
    base = saves[1] if len(saves) > 1 else saves[0]
    rss_growth = (saves[-1]["rss_bytes"] - base["rss_bytes"]) / MIB
    print(f"\npool live bytes: first save {saves[0]['live_bytes']}, last {saves[-1]['live_bytes']} "
          f"(growth {pool_growth} B); distinct live totals at step boundaries after step 1: "
          f"{len(step_live)}")
    print(f"RSS: {base['rss_bytes'] / MIB:.1f} MiB at step {base['step']}, "
          f"{saves[-1]['rss_bytes'] / MIB:.1f} MiB at step {saves[-1]['step']} "
          f"(growth {rss_growth:+.1f} MiB, slack {args.rss_slack} MiB)")

    result = {"steps": steps, "save_every": args.save_every, "cpu": cpu_model(),
              "saves": [{k: s[k] for k in ("step", "rss_bytes", "live_bytes", "live_allocations",
                                           "mem")} for s in saves],
              "val": sorted(val.items()), "pool_growth_bytes": pool_growth,
              "rss_growth_mib": rss_growth,
              "median_tokens_per_s": sorted(l["tokens_per_s"] for l in train)[len(train) // 2]}
    if not args.steps:
        out = args.out or os.path.join(ROOT, "docs", "bench", "soak.json")
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"\nwrote {out}", file=sys.stderr)
    failed = (pool_growth != 0 or len(step_live) > 1 or rss_growth > args.rss_slack or
              leak_check_failed)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
