#!/usr/bin/env python3
"""What activation checkpointing costs in step time: `--ckpt full` and `--ckpt selective`
against `--ckpt none` at gpt2 (124M), 8 x 256 tokens, FP32 and BF16 (issue 5, "Measure";
targets: full <= 1.35x, selective <= 1.10x).

Each run is one `train_step_tool` process (forward, backward, AdamW) that times --steps steps
after --warmup; a configuration's time is the median over --repeats runs of each run's median.
Runs are interleaved: each repeat runs none, full and selective back to back for each precision
and attention kind, starting from a different policy each repeat, so that a slow stretch of a
shared machine falls on all three alike. Ratios are taken against `none` at the same precision
and attention.

`selective` recomputes only plain attention's (T, T) probabilities. Flash attention saves none
to begin with, so with flash `selective` is `none` by construction (the same plan, the same
kernels): the script checks that with `memfit plan` instead of timing it, and times selective
with `--attention plain`.

    python3 bench/e2e/ckpt_overhead.py                  # the doc's numbers (quiet machine)
    python3 bench/e2e/ckpt_overhead.py --repeats 1 --steps 1   # a quicker check

Writes docs/bench/ckpt_overhead.json and the section between the ckpt_overhead markers in
docs/benchmarks.md.
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import ROOT, run_json  # noqa: E402
MIB = 1024.0 * 1024.0
TARGETS = {"full": 1.35, "selective": 1.10}
BEGIN, END = "<!-- ckpt_overhead:begin -->", "<!-- ckpt_overhead:end -->"


def plan(args, precision, attention, ckpt):
    return run_json([args.memfit, "plan", "--json", "--model", args.model, "--batch",
                     str(args.batch), "--seq-len", str(args.seq), "--precision", precision,
                     "--attention", attention, "--ckpt", ckpt])


def configs(args):
    """(precision, attention, policies timed) groups; flash's selective is not timed."""
    out = []
    for precision in args.precisions.split(","):
        for attention in args.attention.split(","):
            out.append((precision, attention,
                        ["none", "full"] + (["selective"] if attention == "plain" else [])))
    return out


def busy(load, cores):
    # Our own run keeps about `cores` threads busy; more than one core's worth beyond that is
    # someone else.
    return load > cores + 1


def section(data):
    cmd = data["command"]
    cores = data["cores"]
    load = data["load_avg_1min"]
    provisional = busy(load["max"], cores)
    L = [BEGIN, "## Checkpointing overhead: step time against `--ckpt none`", "",
         "```sh", "python3 bench/e2e/ckpt_overhead.py", "```", ""]
    if cmd != "python3 bench/e2e/ckpt_overhead.py":
        L += [f"The table below was made with `{cmd}`.", ""]
    L += [
         f"`build/train_step_tool`, {data['model']} ({data['params'] / 1e6:.3g}M parameters), "
         f"{data['batch']} x {data['seq']} "
         f"tokens, AdamW, {cores} cores. Each cell is the median over {data['repeats']} "
         f"interleaved runs of each run's median of {data['steps']} steps after "
         f"{data['warmup']} warm-up. Raw data: `docs/bench/ckpt_overhead.json`.", ""]
    if provisional:
        L += [f"**Provisional:** measured {data['date']} while the machine was busy (1-minute "
              f"load average {load['min']:.1f}-{load['max']:.1f} on {cores} cores, other "
              "builds running)" + (", at reduced repeats" if data["repeats"] < 3 else "") +
              ". Rerun the command on a quiet machine for "
              "the numbers of record.", ""]
    else:
        L += [f"Measured {data['date']}; 1-minute load average {load['min']:.1f}-"
              f"{load['max']:.1f} on {cores} cores.", ""]
    L += ["| precision | attention | ckpt | median ms/step | vs none | target | planned FLOPs vs "
          "none | runs (ms) | activations MiB measured / predicted |",
          "|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        target = TARGETS.get(r["ckpt"])
        ok = ("" if target is None else
              f"<= {target:.2f}x {'met' if r['ratio'] <= target else '**missed**'}")
        L.append(f"| {r['precision']} | {r['attention']} | {r['ckpt']} | "
                 f"{r['median_ms']:.0f} | {r['ratio']:.3f}x | {ok} | {r['flops_ratio']:.3f}x | "
                 f"{', '.join(f'{m:.0f}' for m in r['run_medians_ms'])} | "
                 f"{r['measured_activation_bytes'] / MIB:.1f} / "
                 f"{r['planned_activation_bytes'] / MIB:.1f} |")
        if r["ckpt"] == "full" and r["attention"] == "flash":
            L.append(f"| {r['precision']} | flash | selective | = none | 1.000x (by "
                     "construction) | <= 1.10x met | 1.000x | not timed | = none |")
    L += ["",
          "- `full` keeps each block's input and runs the block's forward again in backward. "
          "\"planned FLOPs vs none\" is `memfit plan`'s count with the recomputation: the "
          "blocks' forward once more, diluted by the LM head, which is not recomputed; "
          "elementwise work is not counted.",
          "- `selective` drops only plain attention's (T, T) probabilities and recomputes them "
          "from q and k in backward. Flash attention saves no probabilities, so with flash "
          "`selective` is `none`: the plan (buffers, bytes and FLOPs) is checked identical "
          "and it is not timed."]
    if data["repeats"] < 3:
        L.append(f"- Only {data['repeats']} run(s) per cell: the ratios carry the noise of few "
                 "runs, so one can fall below its planned FLOPs ratio.")
    if "flash" not in {r["attention"] for r in data["rows"]}:
        L.append("- This run timed plain attention only; the default command also times "
                 "`--attention flash` (the default attention) with none and full.")
    L.append(END)
    return "\n".join(L)


def write_section(path, text):
    with open(path) as f:
        doc = f.read()
    if BEGIN in doc and END in doc:
        doc = doc[:doc.index(BEGIN)] + text + doc[doc.index(END) + len(END):]
    else:
        doc = doc.rstrip("\n") + "\n\n" + text + "\n"
    with open(path + ".tmp", "w") as f:
        f.write(doc)
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memfit", default=os.path.join(ROOT, "build", "memfit"))
    ap.add_argument("--tool", default=os.path.join(ROOT, "build", "train_step_tool"))
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--attention", default="flash,plain")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "bench", "ckpt_overhead.json"))
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "benchmarks.md"),
                    help="the Markdown file whose ckpt_overhead section is rewritten ('' : none)")
    ap.add_argument("--doc-only", action="store_true",
                    help="rewrite --doc's section from the JSON in --out without timing anything")
    args = ap.parse_args()
    if args.doc_only:
        with open(args.out) as f:
            write_section(args.doc, section(json.load(f)))
        return

    for precision in args.precisions.split(","):
        a, b = plan(args, precision, "flash", "none"), plan(args, precision, "flash", "selective")
        if (a["by_category"], a["flops"]) != (b["by_category"], b["flops"]):
            sys.exit(f"{precision}: flash selective plans differently from none")

    groups = configs(args)
    runs = {}  # (precision, attention, ckpt) -> [per-run median ms]
    pools = {}  # (precision, attention, ckpt) -> the pool's peak by category after the steps
    loads = [os.getloadavg()[0]]
    t_start = time.time()
    for rep in range(args.repeats):
        for precision, attention, pols in groups:
            order = pols[rep % len(pols):] + pols[:rep % len(pols)]
            for ckpt in order:
                j = run_json([args.tool, "--model", args.model, "--batch", str(args.batch),
                              "--seq", str(args.seq), "--steps", str(args.steps), "--warmup",
                              str(args.warmup), "--precision", precision, "--attention",
                              attention, "--ckpt", ckpt])
                runs.setdefault((precision, attention, ckpt), []).append(j["median_ms"])
                pools[(precision, attention, ckpt)] = j["pool_peak_by_category"]
                params = j["params"]
                loads.append(os.getloadavg()[0])
                print(f"repeat {rep + 1}/{args.repeats} {precision} {attention:5} {ckpt:9} "
                      f"{j['median_ms']:8.0f} ms  (load {loads[-1]:.1f})",
                      file=sys.stderr, flush=True)
    rows = []
    for precision, attention, pols in groups:
        base = statistics.median(runs[(precision, attention, "none")])
        base_flops = plan(args, precision, attention, "none")["flops"]
        for ckpt in pols:
            med = statistics.median(runs[(precision, attention, ckpt)])
            p = plan(args, precision, attention, ckpt)
            rows.append({"precision": precision, "attention": attention, "ckpt": ckpt,
                         "median_ms": med, "ratio": med / base,
                         "run_medians_ms": runs[(precision, attention, ckpt)],
                         "planned_flops": p["flops"], "flops_ratio": p["flops"] / base_flops,
                         "planned_recompute_flops": p["recompute_flops"],
                         "planned_activation_bytes": p["by_category"]["activations"],
                         "measured_activation_bytes":
                             pools[(precision, attention, ckpt)].get("activations", 0),
                         "pool_peak_by_category": pools[(precision, attention, ckpt)]})
    cores = os.cpu_count()
    cmd = "python3 bench/e2e/ckpt_overhead.py"
    for k in ("model", "batch", "seq", "precisions", "attention", "repeats", "steps", "warmup"):
        if getattr(args, k) != ap.get_default(k):
            cmd += f" --{k} {getattr(args, k)}"
    data = {"command": cmd, "date": datetime.date.today().isoformat(), "model": args.model,
            "params": params,
            "batch": args.batch,
            "seq": args.seq, "repeats": args.repeats, "steps": args.steps,
            "warmup": args.warmup, "cores": cores, "seconds": time.time() - t_start,
            "load_avg_1min": {"min": min(loads), "max": max(loads)},
            "provisional": busy(max(loads), cores), "rows": rows}

    print(f"\n{args.model} {args.batch}x{args.seq}, median of {args.repeats} runs "
          f"(load {min(loads):.1f}-{max(loads):.1f} on {cores} cores)\n")
    print("| precision | attention | ckpt | median ms/step | vs none |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['precision']} | {r['attention']} | {r['ckpt']} | {r['median_ms']:.0f} | "
              f"{r['ratio']:.3f}x |")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".tmp", "w") as f:
        json.dump(data, f, indent=1)
    os.replace(args.out + ".tmp", args.out)
    if args.doc:
        write_section(args.doc, section(data))

if __name__ == "__main__":
    main()
