#!/usr/bin/env python3
"""The longest sequence at which gpt2 (124M), batch 1, trains under a memory budget (8 GiB by
default), for plain and flash attention, with and without full checkpointing (issue 6).

Every buffer a step uses is allocated from the budgeted pool before the first step (the step
plan's arenas), and a step allocates nothing more (tests/model/gpt2_test.cpp,
PoolHoldsExactlyParamsGradsAndThePlan; checkpoint_test.cpp for every policy), so whether a
length fits is decided exactly by `memfit train --steps 0`, which builds the model, the
optimizer and the plan under --mem-limit and exits 3 if they do not fit. The script bisects
on T (multiples of 64) with that, then runs real training steps at the longest T found where
that is affordable on this CPU (--verify-max-tokens), to show that the step itself fits too.

    python3 bench/e2e/longest_seq.py [--mem-limit 8GiB] [--precision fp32]
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MEMFIT = os.path.join(ROOT, "build", "memfit")


def fits(T, args, attention, ckpt, steps=0):
    cmd = [MEMFIT, "train", "--model", "gpt2", "--batch", "1", "--seq-len", str(T),
           "--steps", str(steps), "--mem-limit", args.mem_limit, "--attention", attention,
           "--ckpt", ckpt, "--precision", args.precision, "--data", args.data,
           "--eval-batches", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode not in (0, 3):
        sys.exit(f"unexpected exit {r.returncode}: {' '.join(cmd)}\n{r.stderr}")
    return r.returncode == 0, r


def peak_line(out):
    for line in out.splitlines():
        if line.startswith("total"):
            return float(line.split()[-1])
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mem-limit", default="8GiB")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "brown"))
    ap.add_argument("--verify-max-tokens", type=int, default=4096,
                    help="run one real step at the longest T when T is at most this")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "bench", "longest_seq.json"))
    args = ap.parse_args()
    rows = []
    for attention in ("plain", "flash"):
        for ckpt in ("none", "full"):
            lo, hi = 64, 64  # lo fits; find an hi that does not
            while fits(hi, args, attention, ckpt)[0]:
                lo, hi = hi, hi * 2
            while hi - lo > 64:
                mid = (lo + hi) // 2 // 64 * 64
                if fits(mid, args, attention, ckpt)[0]:
                    lo = mid
                else:
                    hi = mid
            row = {"attention": attention, "ckpt": ckpt, "longest_T": lo,
                   "first_failing_T": hi}
            if lo <= args.verify_max_tokens:
                t0 = time.time()
                ok, r = fits(lo, args, attention, ckpt, steps=1)
                row["verified_step"] = ok
                row["step_peak_mib"] = peak_line(r.stdout)
                row["verify_seconds"] = time.time() - t0
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    print(f"\ngpt2 (124M), batch 1, {args.precision}, --mem-limit {args.mem_limit}\n")
    print("| attention | checkpointing | longest T (fits) | first T that does not | one real step |")
    print("|---|---|---|---|---|")
    for r in rows:
        v = (f"ran, peak {r['step_peak_mib']:.0f} MiB" if r.get("verified_step") else
             "not run (too slow on 2 cores)" if "verified_step" not in r else "FAILED")
        print(f"| {r['attention']} | {r['ckpt']} | {r['longest_T']} | {r['first_failing_T']} | {v} |")
    with open(args.out + ".tmp", "w") as f:
        json.dump({"mem_limit": args.mem_limit, "precision": args.precision, "rows": rows}, f,
                  indent=1)
    os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
