#!/usr/bin/env python3
"""Activation compression's trade-off (issue 17, "Measure"): the activation bytes and step time
of `--act-compress int8` and `fp8` against none, next to what `--ckpt full` and `selective` save
and cost, at gpt2 (12 x 768) and 6 x 384 (gpt2-small-test), 8 x 256 tokens, bf16. Targets:
activations at most 0.6x of none with flash attention, step time at most 1.10x.

Bytes come from `memfit plan --json` (exact: the plan equals the measured peak, which each timed
run checks against its own pool); times from `build/train_step_tool` (forward, backward, AdamW
update), each configuration's time the median over --repeats runs of each run's median of
--steps steps, the runs interleaved (each repeat walks the configurations from a different
start) so a busy stretch of a shared machine falls on all alike. Flash attention saves no
probabilities, so `selective` is `none` there and appears only with `--attention plain`.

    python3 bench/e2e/act_compress_tradeoff.py                    # the doc's table (quiet machine)
    python3 bench/e2e/act_compress_tradeoff.py --no-time          # bytes only, in seconds
    python3 bench/e2e/act_compress_tradeoff.py --repeats 1 --steps 1 --models gpt2-small-test

Writes docs/bench/act_compress.json and the section between the act_compress markers in
docs/benchmarks.md.
"""
import argparse
import datetime
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import ROOT, cpu_model, run_json  # noqa: E402

MIB = 1024.0 * 1024.0
BYTES_TARGET, TIME_TARGET = 0.6, 1.10
BEGIN, END = "<!-- act_compress:begin -->", "<!-- act_compress:end -->"
LABELS = {"gpt2": "gpt2 (12 x 768)", "gpt2-small-test": "6 x 384"}


def rows_for(attention):
    """(name, --ckpt, --act-compress) of the table, none first."""
    rows = [("none", "none", "none"), ("int8", "none", "int8"), ("fp8", "none", "fp8"),
            ("ckpt full", "full", "none")]
    if attention == "plain":
        rows.append(("ckpt selective", "selective", "none"))
    return rows


def plan(args, model, attention, ckpt, compress):
    return run_json([args.memfit, "plan", "--json", "--model", model, "--batch", str(args.batch),
                     "--seq-len", str(args.seq), "--precision", args.precision, "--attention",
                     attention, "--ckpt", ckpt, "--act-compress", compress])


def step(args, model, attention, ckpt, compress):
    return run_json([args.tool, "--model", model, "--batch", str(args.batch), "--seq",
                     str(args.seq), "--context", str(args.seq), "--steps", str(args.steps),
                     "--warmup", str(args.warmup), "--precision", args.precision, "--attention",
                     attention, "--ckpt", ckpt, "--act-compress", compress])


def measure(args):
    groups = [(m, a) for m in args.models.split(",") for a in args.attention.split(",")]
    out = []
    for model, attention in groups:
        for name, ckpt, compress in rows_for(attention):
            p = plan(args, model, attention, ckpt, compress)
            cat = p["by_category"]
            out.append({"model": model, "attention": attention, "run": name, "ckpt": ckpt,
                        "act_compress": compress, "activation_bytes": cat["activations"],
                        "workspace_bytes": cat["workspace"], "peak_bytes": p["peak_bytes"],
                        "est_step_seconds": p["est_step_seconds"],
                        "est_compression_seconds": p["step_time"]["compression"],
                        "recompute_flops": p["recompute_flops"], "run_medians_ms": []})
    if args.no_time:
        return out
    loads = []
    for rep in range(args.repeats):
        for model, attention in groups:
            mine = [r for r in out if r["model"] == model and r["attention"] == attention]
            k = rep % len(mine)
            for r in mine[k:] + mine[:k]:
                j = step(args, model, attention, r["ckpt"], r["act_compress"])
                r["run_medians_ms"].append(j["median_ms"])
                measured = j["pool_peak_by_category"].get("activations", 0)
                if measured != r["activation_bytes"]:
                    sys.exit(f"{model} {attention} {r['run']}: measured activations {measured} "
                             f"!= planned {r['activation_bytes']}")
                loads.append(os.getloadavg()[0])
                print(f"repeat {rep + 1}/{args.repeats} {model} {attention} {r['run']:15} "
                      f"{j['median_ms']:8.0f} ms (load {loads[-1]:.1f})", file=sys.stderr,
                      flush=True)
    for r in out:
        r["median_ms"] = statistics.median(r["run_medians_ms"])
    args.loads = loads
    return out


def table(data):
    timed = "median_ms" in data["rows"][0]
    L = [BEGIN, "## Activation compression: bytes and step time against checkpointing", "",
         "```sh", data["command"], "```", "",
         f"{data['precision']}, {data['batch']} x {data['seq']} tokens, AdamW; {data['cpu']}, "
         f"{data['cores']} cores, {data['date']}. Activations are Category::activations (what "
         "the step keeps for the backward); workspace holds, among the rest, one block's exact "
         "copy of the compressed values (`ws.act.*`). Bytes are the planner's, equal to the "
         "pool's measured peak (each timed run checks it). Raw data: "
         "`docs/bench/act_compress.json`.", ""]
    if timed:
        load = data.get("load_avg_1min", {})
        L += [f"Times: median over {data['repeats']} interleaved runs of each run's median of "
              f"{data['steps']} steps after {data['warmup']} warm-up"
              + (f"; 1-minute load average {load['min']:.1f}-{load['max']:.1f}" if load else "")
              + ".", ""]
    else:
        L += ["Not timed (`--no-time`, for a machine shared with other jobs, where step times "
              "mean nothing): run the command without it on a quiet machine for the times. "
              "`est s/step` is the planner's step-time model (Note [Step-time model]) with its "
              "term for the (de)quantisation passes, from this machine's calibration (so only "
              "its ratios carry over).", ""]
    head = ("| model | attention | run | activations MiB | vs none | + workspace MiB | vs none "
            "| peak MiB | est s/step |")
    L += [head + (" median ms/step | vs none |" if timed else ""),
          "|---" * (9 + (2 if timed else 0)) + "|"]
    for r in data["rows"]:
        base = next(b for b in data["rows"] if b["model"] == r["model"] and
                    b["attention"] == r["attention"] and b["run"] == "none")
        act = r["activation_bytes"] / base["activation_bytes"]
        both = ((r["activation_bytes"] + r["workspace_bytes"]) /
                (base["activation_bytes"] + base["workspace_bytes"]))
        mark = ""
        if r["act_compress"] != "none" and r["attention"] == "flash":
            mark = " (target <= 0.6x: " + ("met)" if act <= BYTES_TARGET else "**missed**)")
        line = (f"| {LABELS.get(r['model'], r['model'])} | {r['attention']} | {r['run']} | "
                f"{r['activation_bytes'] / MIB:.1f} | {act:.3f}x{mark} | "
                f"{(r['activation_bytes'] + r['workspace_bytes']) / MIB:.1f} | {both:.3f}x | "
                f"{r['peak_bytes'] / MIB:.1f} | {r['est_step_seconds']:.3f} |")
        if timed:
            t = r["median_ms"] / base["median_ms"]
            tmark = ""
            if r["act_compress"] != "none":
                tmark = " (target <= 1.10x: " + ("met)" if t <= TIME_TARGET else "**missed**)")
            line += f" {r['median_ms']:.0f} | {t:.3f}x{tmark} |"
        L.append(line)
    L += ["",
          "- int8 and fp8 keep the same bytes (one byte a value, an f32 scale per 64): the "
          "kept blocks' compressible activations go from 2 bytes a value (4 for the saved "
          "residual) to 1.0625; block outputs, statistics and log-sum-exps stay as they are, "
          "hence 0.57x rather than 0.5x. The workspace grows by one block's exact copy of the "
          "compressed values (`ws.act.*`).",
          "- `ckpt full` keeps far less (each block's output only) but recomputes every block's "
          "forward; compression's cost is two streaming passes over the kept values. `--ckpt "
          "auto` weighs both per budget (Note [Fit a budget]).",
          "- With flash attention `selective` is `none` (no probabilities to drop); with plain "
          "attention compression also stores the probabilities in 8 bits."]
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
    ap.add_argument("--models", default="gpt2,gpt2-small-test")
    ap.add_argument("--attention", default="flash,plain")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--no-time", action="store_true", help="bytes and estimates only")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "bench", "act_compress.json"))
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "benchmarks.md"),
                    help="the Markdown file whose act_compress section is rewritten ('': none)")
    args = ap.parse_args()
    args.loads = []
    rows = measure(args)
    cmd = "python3 bench/e2e/act_compress_tradeoff.py"
    for k in ("models", "attention", "precision", "batch", "seq", "repeats", "steps", "warmup"):
        if getattr(args, k) != ap.get_default(k):
            cmd += f" --{k} {getattr(args, k)}"
    if args.no_time:
        cmd += " --no-time"
    data = {"command": cmd, "date": datetime.date.today().isoformat(), "cpu": cpu_model("?"),
            "cores": os.cpu_count(), "precision": args.precision, "batch": args.batch,
            "seq": args.seq, "repeats": args.repeats, "steps": args.steps,
            "warmup": args.warmup, "rows": rows}
    if args.loads:
        data["load_avg_1min"] = {"min": min(args.loads), "max": max(args.loads)}
    text = table(data)
    print(text)
    with open(args.out, "w") as f:
        json.dump(data, f, indent=1)
    if args.doc:
        write_section(args.doc, text)


if __name__ == "__main__":
    main()
