#!/usr/bin/env python3
"""What `memfit train --profile` costs: the same run with and without it, the median step time
of each (tokens/s from the --log lines), the profiler's own memory (the recorder's bytes and the
pool's event log, from summary.json) and the size of the three files. The losses must be the
same bits (the profile changes nothing the step computes): the script fails otherwise.

  python3 bench/e2e/profile_cost.py                  # gpt2-small-test (6 x 384), 8 x 256, 10 steps
  python3 bench/e2e/profile_cost.py --smoke          # gpt2-tiny, 3 steps: nothing written to docs/

Expects build/memfit and data/brown (scripts/train_brown.sh prepares it). Writes
docs/bench/profile_cost.json unless --smoke. Timings on a busy machine are noise: rerun on a
quiet one.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

from bench_common import ROOT, cpu_model

KIB = 1024.0


def run(memfit, args, log, profile=None):
    cmd = [memfit, "train", *args, "--log", log]
    if profile:
        cmd += ["--profile", profile, "--profile-steps", args[args.index("--steps") + 1]]
    print("$", " ".join(cmd), file=sys.stderr, flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"exit {r.returncode}: {' '.join(cmd)}\n{r.stderr}")
    with open(log) as f:
        lines = [json.loads(l) for l in f if l.strip()]
    return [l for l in lines if "loss" in l]


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="a tiny run; writes nothing to docs/")
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "brown"))
    ap.add_argument("--memfit", default=os.path.join(ROOT, "build", "memfit"))
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.data, "train_000000.bin")):
        sys.exit(f"{a.data}: no shards; `build/memfit prepare --input brown --out {a.data}`")
    model = ["--model", "gpt2-tiny", "--vocab", "50257", "--seq-len", "64", "--batch", "4"] \
        if a.smoke else ["--model", "gpt2-small-test", "--batch", "8", "--seq-len", "256"]
    steps = a.steps or (3 if a.smoke else 10)
    args = model + ["--data", a.data, "--steps", str(steps), "--eval-batches", "1",
                    "--threads", str(a.threads)]
    with tempfile.TemporaryDirectory() as tmp:
        plain = run(a.memfit, args, os.path.join(tmp, "plain.jsonl"))
        prof_dir = os.path.join(tmp, "profile")
        profiled = run(a.memfit, args, os.path.join(tmp, "profiled.jsonl"), prof_dir)
        with open(os.path.join(prof_dir, "summary.json")) as f:
            summary = json.load(f)
        sizes = {n: os.path.getsize(os.path.join(prof_dir, n))
                 for n in ("trace.json", "memory.html", "summary.json")}
    same = [p["loss"] for p in plain] == [p["loss"] for p in profiled]
    # The first step warms oneDNN's primitives up: left out of the medians.
    t_plain = median([p["step_seconds"] for p in plain[1:]] or [plain[0]["step_seconds"]])
    t_prof = median([p["step_seconds"] for p in profiled[1:]] or [profiled[0]["step_seconds"]])
    p = summary["profile"]
    print(f"\nprofile cost: {' '.join(model)}, {steps} steps; {cpu_model()}\n")
    print("| | without --profile | with --profile |")
    print("|---|---|---|")
    print(f"| median step (s) | {t_plain:.3f} | {t_prof:.3f} ({(t_prof / t_plain - 1) * 100:+.1f}%) |")
    print(f"| losses | | {'bit-identical' if same else 'DIFFERENT'} |")
    print(f"| recorder | | {p['recorder_bytes'] / KIB:.1f} KiB ({p['phase_runs']} phase runs, "
          f"{p['micro_batches']} micro-batches) |")
    print(f"| pool event log | | {p['pool_events']} events ({p['pool_events_dropped']} dropped) |")
    print("| files | | " + ", ".join(f"{n} {s / KIB:.0f} KiB" for n, s in sizes.items()) + " |")
    result = {"model": model, "steps": steps, "cpu": cpu_model(), "bit_identical": same,
              "median_step_seconds": {"plain": t_plain, "profiled": t_prof},
              "recorder_bytes": p["recorder_bytes"], "pool_events": p["pool_events"],
              "file_bytes": sizes}
    if not a.smoke:
        out = a.out or os.path.join(ROOT, "docs", "bench", "profile_cost.json")
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"\nwrote {out}", file=sys.stderr)
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
