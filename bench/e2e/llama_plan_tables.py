#!/usr/bin/env python3
"""The planner's tables for the seeds' practical LLaMA configurations (issue 13): what
`memfit plan` predicts, byte for byte and by category, for llama2-7b on a 24 GiB device with
bf16, full checkpointing, batch 1 x 4096, accumulation 16, 8-bit AdamW and flash attention
(does it fit; if not, the smallest footprint the search finds and what dominates it), and for
llama2-7b and llama3-8b under every precision and optimizer at batch 1 x 4096 with full
checkpointing. Nothing is allocated: these are predictions, as exact as the planner is for the
models it can run (docs/plan-accuracy.md).

    python3 bench/e2e/llama_plan_tables.py            # prints the Markdown of docs/llama.md's tables
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import ROOT  # noqa: E402

MEMFIT = os.path.join(ROOT, "build", "memfit")
GIB = 1024.0 ** 3
CATS = ("params", "master", "grads", "optimizer", "activations", "workspace")


def plan(*args):
    # Exit 3: the run does not fit --mem-limit (the JSON is printed all the same).
    r = subprocess.run([MEMFIT, "plan", "--json", "--seq-len", "4096", "--batch", "1", *args],
                       capture_output=True, text=True)
    if r.returncode not in (0, 3):
        raise subprocess.CalledProcessError(r.returncode, r.args, r.stdout, r.stderr)
    return json.loads(r.stdout)


def gib(b):
    return f"{b / GIB:.1f}"


def seeds_table():
    base = ["--model", "llama2-7b", "--precision", "bf16", "--grad-accum", "16",
            "--optim", "adamw8bit", "--attention", "flash", "--mem-limit", "24GiB"]
    full = plan(*base, "--ckpt", "full")
    auto = plan(*base, "--ckpt", "auto")
    rows = ["| plan | " + " | ".join(CATS) + " | total GiB | fits 24 GiB |",
            "| --- |" + " ---: |" * (len(CATS) + 1) + " --- |"]
    for name, j in (("--ckpt full", full), ("--ckpt auto (smallest found)", auto)):
        cats = j["by_category"]
        rows.append(f"| {name} ({j['ckpt']}) | " + " | ".join(gib(cats[c]) for c in CATS) +
                    f" | {gib(j['peak_bytes'])} | {'yes' if j['fits'] else 'no'} |")
    top = max(CATS, key=lambda c: full["by_category"][c])
    return "\n".join(rows), top, full


def grid_table(model):
    rows = ["| precision | optimizer | " + " | ".join(CATS) + " | total GiB |",
            "| --- | --- |" + " ---: |" * (len(CATS) + 1)]
    precisions = (("fp32", []), ("bf16", []), ("fp16", ["--attention", "plain"]),
                  ("pure bf16", ["--master-weights", "none"]))
    for pname, extra in precisions:
        precision = "bf16" if pname == "pure bf16" else pname
        optims = ("adamw",) if pname == "pure bf16" else (
            "adamw", "adamw8bit", "adam-mini", "lion", "lion8bit", "sgd")
        for optim in optims:
            j = plan("--model", model, "--precision", precision, "--optim", optim,
                     "--ckpt", "full", *extra)
            cats = j["by_category"]
            rows.append(f"| {pname} | {optim} | " + " | ".join(gib(cats[c]) for c in CATS) +
                        f" | {gib(j['peak_bytes'])} |")
    return "\n".join(rows)


def main():
    table, top, full = seeds_table()
    print("### llama2-7b on a 24 GiB device: bf16, batch 1 x 4096, accumulation 16, 8-bit AdamW, "
          "flash attention\n")
    print(table)
    print(f"\nLargest part with --ckpt full: {top} ({gib(full['by_category'][top])} GiB).\n")
    for model in ("llama2-7b", "llama3-8b"):
        print(f"### {model}, batch 1 x 4096, --ckpt full (GiB)\n")
        print(grid_table(model))
        print()


if __name__ == "__main__":
    main()
