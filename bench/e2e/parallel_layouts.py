#!/usr/bin/env python3
"""Tensor and pipeline layouts measured (issue 42 and 43, "Measure"): for each layout, every
rank's pool peak by category as `mpirun -n R memfit train` measures it (the run's log) against
`memfit plan --json` (per_rank), and the median step time, against the one-process run of the
same global batch. Speed from an oversubscribed machine says nothing: the timed suites run one
thread a rank and no more ranks than cores.

    python3 bench/e2e/parallel_layouts.py peaks_gpt2     # gpt2-medium 1 x 1024 at tp 1, 2, 4 (+ --sp)
    python3 bench/e2e/parallel_layouts.py peaks_llama    # tinyllama-1.1b 1 x 512 at tp 1, 2, 4 (+ --sp)
    python3 bench/e2e/parallel_layouts.py tp_speed       # tp 2 (1 thread a rank) against tp 1 (1 and 2 threads)
    python3 bench/e2e/parallel_layouts.py bubble         # pp 2 (GPipe, 1F1B) with m = 2, 4, 8 against pp 1
    python3 bench/e2e/parallel_layouts.py stage_peaks    # each stage's peak at pp 2 and 4, m = 8, both schedules
    python3 bench/e2e/parallel_layouts.py bubble_interleaved  # pp 2 interleaved V 2 vs 1F1B and pp 1, m = 2, 4, 8
    python3 bench/e2e/parallel_layouts.py tp_overlap     # tp 2 (+ --sp) with --tp-overlap off and on, interleaved rounds

`tp_overlap` (issue 42, "Overlap"): gpt2-medium 1 x 1024 at --tp 2, one thread a rank, with and
without --sp, --tp-overlap off and on run in alternating order for --rounds rounds (the order
flips each round, so a machine's drift falls on both alike); per variant the median over rounds
of each run's median step, rank 0's tensor_comm_s (the wall time inside the tensor collectives)
and tensor_comm_exposed_s (of those, what the step waited for: with the option on the rest ran
on the communication thread beside the weight-gradient GEMMs), and per round the ratio on / off.
`--synthetic` trains on random tokens (no data/brown needed; the step time does not depend on
the tokens); `--n-layer N` cuts the model's depth to time fewer blocks of the same shape.

`bubble_interleaved` times the runner itself (build/pipeline_bubble_tool: the model's forwards and
backwards through the schedule, no optimizer) until `memfit train` runs the interleaved schedule:
beside each step, the busiest rank's compute, the measured bubble (step - that) / that, and the
model's (p - 1)/(v m).

Prints a table per suite and writes JSON (--out, default out/parallel_layouts/SUITE.json).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from bench_common import ROOT, cpu_model, run_json

MEMFIT = os.path.join(ROOT, "build", "memfit")

GPT2_MEDIUM = ["--model", "gpt2-medium", "--seq-len", "1024", "--batch", "1",
               "--data", "data/brown"]
TINYLLAMA = ["--model", "tinyllama-1.1b", "--seq-len", "512", "--batch", "1",
             "--data", "data/brown_llama2", "--optim", "sgd"]
# An untied LLaMA for the pipeline bubble: 8 blocks of width 1024, whose LM head (32,000 x 1024)
# costs about 2.5 blocks at 128 tokens; the split 5,3 balances the stages (the embeddings and 5
# blocks, 3 blocks and the head), so the step shows the schedule's bubble, not an imbalance.
LLAMA_SMALL = ["--model", "tinyllama-1.1b", "--n-layer", "8", "--d-model", "1024", "--n-head",
               "16", "--n-kv-head", "8", "--ffn-dim", "2816", "--seq-len", "128", "--batch", "1",
               "--data", "data/brown_llama2"]

# suite: (steps, common args, [(name, ranks, threads a rank, layout args)])
SUITES = {
    "peaks_gpt2": (2, GPT2_MEDIUM, [
        ("tp1", 1, 1, []),
        ("tp2", 2, 1, ["--tp", "2"]),
        ("tp2 sp", 2, 1, ["--tp", "2", "--sp"]),
        ("tp4", 4, 1, ["--tp", "4"]),
        ("tp4 sp", 4, 1, ["--tp", "4", "--sp"]),
    ]),
    "peaks_llama": (2, TINYLLAMA, [
        ("tp1", 1, 1, []),
        ("tp2", 2, 1, ["--tp", "2"]),
        ("tp2 sp", 2, 1, ["--tp", "2", "--sp"]),
        ("tp4", 4, 1, ["--tp", "4"]),
        ("tp4 sp", 4, 1, ["--tp", "4", "--sp"]),
    ]),
    "tp_speed": (6, GPT2_MEDIUM, [
        ("tp1 1 thread", 1, 1, []),
        ("tp1 2 threads", 1, 2, []),
        ("tp2", 2, 1, ["--tp", "2"]),
        ("tp2 sp", 2, 1, ["--tp", "2", "--sp"]),
    ]),
    "bubble": (6, LLAMA_SMALL, [
        (f"{name} m{m}", ranks, 1, layout + ["--grad-accum", str(m)])
        for m in (2, 4, 8)
        for name, ranks, layout in (("pp1", 1, []),
                                    ("pp2 gpipe", 2, ["--pp", "2", "--pp-layers", "5,3",
                                                   "--pp-schedule", "gpipe"]),
                                    ("pp2 1f1b", 2, ["--pp", "2", "--pp-layers", "5,3",
                                                  "--pp-schedule", "1f1b"]))
    ]),
    # Each stage's peak at pp 2 and 4 under both schedules (memory: oversubscribed is fine).
    "stage_peaks": (2, LLAMA_SMALL + ["--grad-accum", "8"], [
        (f"pp{p} {sched}", p, 1, ["--pp", str(p), "--pp-schedule", sched])
        for p in (2, 4) for sched in ("gpipe", "1f1b")
    ]),
}


# bubble_interleaved: (name, ranks, tool args) for m = 2, 4, 8; LLAMA_SMALL's shape.
TOOL = os.path.join(ROOT, "build", "pipeline_bubble_tool")
TOOL_SHAPE = ["--n-layer", "8", "--d-model", "1024", "--n-head", "16", "--n-kv-head", "8",
              "--ffn-dim", "2816", "--vocab", "32000", "--seq-len", "128", "--batch", "1"]
TOOL_RUNS = [(f"{name} m{m}", ranks, args + ["--grad-accum", str(m)])
             for m in (2, 4, 8)
             for name, ranks, args in (("pp1", 1, []),
                                       ("pp2 1f1b", 2, ["--pp-schedule", "1f1b"]),
                                       ("pp2 interleaved v2", 2, ["--pp-virtual", "2"]))]


def bubble_interleaved(steps, out, shape=TOOL_SHAPE):
    rows = []
    for name, ranks, args in TOOL_RUNS:
        cmd = [TOOL, *shape, *args, "--steps", str(steps), "--threads", "1"]
        if ranks > 1:
            cmd = ["mpirun", "-n", str(ranks), "--allow-run-as-root", "--oversubscribe",
                   "--bind-to", "none"] + cmd
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if r.returncode != 0:
            sys.exit(f"exit {r.returncode}: {' '.join(cmd)}\n{r.stderr[-3000:]}")
        row = json.loads(r.stdout.strip().splitlines()[-1])
        row["layout"] = name
        rows.append(row)
        print(f"{name}: done ({row['median_step_s']:.3f} s a step)", file=sys.stderr)
    print(f"bubble_interleaved on {cpu_model()}, {steps} steps; " + " ".join(shape))
    print(f"{'layout':<22} {'step s':>8} {'busiest s':>9} {'bubble':>8} {'(p-1)/(vm)':>10}")
    for r in rows:
        print(f"{r['layout']:<22} {r['median_step_s']:>8.3f} {r['busiest_compute_s']:>9.3f} "
              f"{r['measured_bubble']:>8.3f} {r['model_bubble']:>10.3f}")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"suite": "bubble_interleaved", "cpu": cpu_model(), "steps": steps,
                   "shape": shape, "rows": rows}, f, indent=1)


def synthetic_data(tmp):
    """A train and a val shard of random GPT-2 tokens (llm.c's format: a 256-int32 header, magic
    20240520, version 1, the token count; then uint16 tokens) in tmp/data."""
    import random
    import struct
    d = os.path.join(tmp, "data")
    os.makedirs(d, exist_ok=True)
    rng = random.Random(42)
    for name, n in (("train_000000.bin", 1 << 16), ("val_000000.bin", 1 << 14)):
        header = [20240520, 1, n] + [0] * 253
        with open(os.path.join(d, name), "wb") as f:
            f.write(struct.pack("<256i", *header))
            f.write(struct.pack(f"<{n}H", *(rng.randrange(50257) for _ in range(n))))
    return d


def tp_overlap(rounds, steps, out, common):
    variants = [("tp2", ["--tp", "2"]), ("tp2 sp", ["--tp", "2", "--sp"])]
    runs = {}  # (variant, on) -> list of per-run dicts
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for name, layout in variants:
                order = (False, True) if r % 2 == 0 else (True, False)
                for on in order:
                    opt = ["--tp-overlap", "on" if on else "off"]
                    log = os.path.join(tmp, f"{name.replace(' ', '_')}_{int(on)}_{r}.jsonl")
                    st, _ = train(steps, common, 2, 1, layout + opt, log)
                    timed = st[1:] or st
                    med = lambda key: statistics.median(s[key] for s in timed) if key in timed[0] \
                        else None
                    row = {"round": r, "step_s": med("step_seconds"),
                           "tensor_comm_s": med("tensor_comm_s"),
                           "exposed_s": med("tensor_comm_exposed_s") if on
                           else med("tensor_comm_s"),
                           "overlapped_s": med("tensor_comm_overlapped_s") if on else 0.0,
                           "last_loss": st[-1]["loss"]}
                    runs.setdefault((name, on), []).append(row)
                    print(f"round {r} {name} overlap {'on' if on else 'off'}: "
                          f"{row['step_s']:.3f} s a step", file=sys.stderr)
    rows = []
    for name, layout in variants:
        off, on = runs[(name, False)], runs[(name, True)]
        ratios = [b["step_s"] / a["step_s"] for a, b in zip(off, on)]
        for flag, rs in (("off", off), ("on", on)):
            planned = run_json([MEMFIT, "plan", *common, *layout, "--tp-overlap", flag,
                                "--threads", "1", "--world-size", "2", "--json"])
            tc = planned.get("tensor_comm_per_step", {})
            med = lambda k: statistics.median(x[k] for x in rs)
            rows.append({"variant": name, "overlap": flag, "rounds": len(rs),
                         "median_step_s": med("step_s"), "median_tensor_comm_s":
                         med("tensor_comm_s"), "median_exposed_s": med("exposed_s"),
                         "median_overlapped_s": med("overlapped_s"),
                         "planned_step_s": planned.get("est_step_seconds"),
                         "planned_tensor_comm_s": tc.get("seconds"),
                         "planned_hidden_s": tc.get("hidden_seconds"),
                         "ratio_on_off": ratios if flag == "on" else None,
                         "losses_equal": [a["last_loss"] == b["last_loss"]
                                          for a, b in zip(off, on)],
                         "runs": rs})
    print(f"tp_overlap on {cpu_model()}, {rounds} rounds of {steps} steps (median of steps 2-); "
          + " ".join(common))
    print(f"{'variant':<8} {'overlap':>7} {'step s':>8} {'comm s':>8} {'share':>6} "
          f"{'exposed s':>9} {'plan s':>8} {'plan comm':>9} {'hidden':>7} {'on/off':>22}")
    for r in rows:
        rat = r["ratio_on_off"]
        rs = (f"{statistics.median(rat):.3f} ({min(rat):.3f}-{max(rat):.3f})" if rat else "")
        print(f"{r['variant']:<8} {r['overlap']:>7} {r['median_step_s']:>8.3f} "
              f"{r['median_tensor_comm_s']:>8.3f} "
              f"{r['median_tensor_comm_s'] / r['median_step_s']:>6.1%} "
              f"{r['median_exposed_s']:>9.3f} {r['planned_step_s'] or float('nan'):>8.3f} "
              f"{r['planned_tensor_comm_s'] or 0:>9.3f} {r['planned_hidden_s'] or 0:>7.3f} "
              f"{rs:>22}")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"suite": "tp_overlap", "cpu": cpu_model(), "rounds": rounds, "steps": steps,
                   "common": common, "rows": rows}, f, indent=1)


def train(steps, common, ranks, threads, layout, log):
    base = [MEMFIT, "train", *common, *layout, "--steps", str(steps), "--threads", str(threads),
            "--log", log, "--eval-batches", "1", "--repeat-batch"]
    cmd = base if ranks == 1 else ["mpirun", "-n", str(ranks), "--allow-run-as-root",
                                   "--oversubscribe", "--bind-to", "none"] + base
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        sys.exit(f"exit {r.returncode}: {' '.join(cmd)}\n{r.stderr[-3000:]}")
    lines = [json.loads(l) for l in open(log)]
    steps_ = [l for l in lines if "loss" in l]
    ranks_line = next((l["ranks"] for l in lines if "ranks" in l), None)
    if ranks_line is None:  # one process: its own peak
        ranks_line = [{"rank": 0, "peak_bytes": max(l["peak_bytes"] for l in steps_),
                       "mem": steps_[-1]["mem"]}]
    return steps_, ranks_line


def plan(common, ranks, threads, layout):
    cmd = [MEMFIT, "plan", *common, *layout, "--threads", str(threads), "--json"]
    if ranks > 1:
        cmd += ["--world-size", str(ranks)]
    j = run_json(cmd)
    per_rank = j.get("per_rank") or [{"rank": 0, "peak_bytes": j["peak_bytes"],
                                      "by_category": j.get("by_category", {})}]
    return j, per_rank


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("suite", choices=sorted(SUITES) + ["bubble_interleaved", "tp_overlap"])
    ap.add_argument("--steps", type=int, help="override the suite's steps")
    ap.add_argument("--out")
    ap.add_argument("--tiny", action="store_true",
                    help="bubble_interleaved at a tiny shape (checks the script, times nothing)")
    ap.add_argument("--rounds", type=int, default=3, help="tp_overlap: interleaved rounds")
    ap.add_argument("--n-layer", type=int, help="tp_overlap: the model's depth (default 24)")
    ap.add_argument("--seq-len", type=int, help="tp_overlap: tokens a row (default 1024)")
    ap.add_argument("--synthetic", action="store_true",
                    help="tp_overlap: random tokens instead of data/brown")
    args = ap.parse_args()
    if args.suite == "tp_overlap":
        out = args.out or os.path.join(ROOT, "out", "parallel_layouts", args.suite + ".json")
        common = list(GPT2_MEDIUM)
        if args.n_layer:
            common += ["--n-layer", str(args.n_layer)]
        if args.seq_len:
            common[common.index("--seq-len") + 1] = str(args.seq_len)
        with tempfile.TemporaryDirectory() as tmp:
            if args.synthetic:
                common[common.index("--data") + 1] = synthetic_data(tmp)
            tp_overlap(args.rounds, args.steps or 6, out, common)
        return
    if args.suite == "bubble_interleaved":
        out = args.out or os.path.join(ROOT, "out", "parallel_layouts", args.suite + ".json")
        tiny = ["--n-layer", "4", "--d-model", "32", "--n-head", "2", "--n-kv-head", "1",
                "--ffn-dim", "48", "--vocab", "90", "--seq-len", "16", "--batch", "1"]
        bubble_interleaved(args.steps or 6, out, tiny if args.tiny else TOOL_SHAPE)
        return
    steps, common, runs = SUITES[args.suite]
    steps = args.steps or steps
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, ranks, threads, layout in runs:
            log = os.path.join(tmp, name.replace(" ", "_") + ".jsonl")
            measured_steps, measured = train(steps, common, ranks, threads, layout, log)
            planned_json, planned = plan(common, ranks, threads, layout)
            # The first step pays the pool's first touch: the median of the rest.
            times = [s["step_seconds"] for s in measured_steps[1:]] or \
                    [s["step_seconds"] for s in measured_steps]
            # --tp: rank 0's wall time inside the tensor group's collectives a step.
            tcomm = [s["tensor_comm_s"] for s in measured_steps[1:] if "tensor_comm_s" in s]
            for m in measured:
                p = next((p for p in planned if p["rank"] == m["rank"]), planned[0])
                rows.append({"layout": name, "ranks": ranks, "threads": threads,
                             "rank": m["rank"], "measured_peak": m["peak_bytes"],
                             "planned_peak": p["peak_bytes"], "mem": m.get("mem", {}),
                             "median_step_s": statistics.median(times),
                             "median_tensor_comm_s":
                                 statistics.median(tcomm) if tcomm else None,
                             "planned_step_s": planned_json.get("est_step_seconds"),
                             "last_loss": measured_steps[-1]["loss"]})
            print(f"{name}: done ({statistics.median(times):.3f} s a step)", file=sys.stderr)
    mib = lambda b: b / 2**20
    print(f"{args.suite} on {cpu_model()}, {steps} steps; " + " ".join(common))
    print(f"{'layout':<16} {'rank':>4} {'peak MiB':>10} {'plan MiB':>10} {'act MiB':>9} "
          f"{'step s':>8} {'plan s':>8} {'tp comm s':>9} {'loss':>8}")
    for r in rows:
        ok = "" if r["measured_peak"] == r["planned_peak"] else "  <- differs"
        ps = r["planned_step_s"]
        tc = r["median_tensor_comm_s"]
        print(f"{r['layout']:<16} {r['rank']:>4} {mib(r['measured_peak']):>10.1f} "
              f"{mib(r['planned_peak']):>10.1f} {mib(r['mem'].get('activations', 0)):>9.1f} "
              f"{r['median_step_s']:>8.3f} {(ps if ps else float('nan')):>8.3f} "
              f"{(tc if tc is not None else float('nan')):>9.3f} "
              f"{r['last_loss']:>8.4f}{ok}")
    out = args.out or os.path.join(ROOT, "out", "parallel_layouts", args.suite + ".json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"cpu": cpu_model(), "suite": args.suite, "steps": steps, "rows": rows}, f,
                  indent=1)


if __name__ == "__main__":
    main()
