#!/usr/bin/env python3
"""Issue 45's sampling headline: `memfit sample` tokens per second with the KV cache against
without it (--no-kv-cache recomputes the whole window for every token), at GPT-2 (124M) and
llama2-7b sizes, greedy, from randomly initialised checkpoints (the issue allows it: the timing
does not depend on the weights' values). Prints one Markdown table and writes
docs/bench/sample_speed.json (unless --out says otherwise).

For each model: `memfit train --steps 0 --save DIR` writes the initial weights once (bf16
without masters at 7B: 13.5 GB on disk, and 24 GiB of RAM would not hold f32's 27 GB), then the
two samplers run one after the other on the same prompt; their greedy texts must be the same
(the cache's test asserts it token for token; here it is checked again at full size).
Long at 7B (minutes): a benchmark, not a test; run it on a quiet machine. Expects build/memfit.
"""
import argparse
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import ROOT, cpu_model  # noqa: E402

PROMPT = ("The committee said that the city's new budget would be presented to the council "
          "next week, after the mayor returns from his trip to the state capital, where he "
          "met with the governor and members of the legislature to discuss")
MODELS = {
    "gpt2": ["--precision", "fp32"],
    "llama2-7b": ["--precision", "bf16", "--master-weights", "none"],
}
SAMPLE_PRECISION = {"gpt2": "fp32", "llama2-7b": "bf16"}
TOKENS = {"gpt2": 128, "llama2-7b": 24}  # the cache-less 7B takes seconds a token
LINE = re.compile(r"\[sample\] (\d+) tokens \((.*?)\): first after ([\d.]+) s \((\d+) prompt "
                  r"tokens\), then ([\d.]+) tokens/s; pool peak ([\d.]+ \w+)")


def checkpoint(memfit, model, out):
    d = os.path.join(out, model)
    if not any(os.path.isfile(os.path.join(d, f))
               for f in ("model.safetensors", "model.safetensors.index.json")):
        cmd = [memfit, "train", "--model", model, "--steps", "0", "--seq-len", "256", "--batch",
               "1", "--save", d, "--repeat-batch"] + MODELS[model]
        print("$", " ".join(cmd), file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return d


def sample(memfit, model, ckpt, tokens, kv):
    cmd = [memfit, "sample", "--checkpoint", ckpt, "--prompt", PROMPT, "--tokens", str(tokens),
           "--temperature", "0", "--tokenizer", "gpt2" if model == "gpt2" else "llama2",
           "--precision", SAMPLE_PRECISION[model]] + ([] if kv else ["--no-kv-cache"])
    print("$", " ".join(cmd), file=sys.stderr, flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        sys.exit(f"exit {r.returncode}: {' '.join(cmd)}\n{r.stderr}")
    m = LINE.search(r.stderr)
    if not m:
        sys.exit(f"no [sample] line in:\n{r.stderr}")
    return {"text": r.stdout, "tokens": int(m.group(1)), "first_s": float(m.group(3)),
            "prompt_tokens": int(m.group(4)), "tokens_per_s": float(m.group(5)),
            "pool_peak": m.group(6)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="gpt2,llama2-7b")
    ap.add_argument("--tokens", type=int, default=0,
                    help="tokens generated a run (default: 128 at gpt2, 24 at llama2-7b)")
    ap.add_argument("--memfit", default=os.path.join(ROOT, "build", "memfit"))
    ap.add_argument("--ckpt-dir", default=os.path.join(ROOT, "out", "sample_speed"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "bench", "sample_speed.json"))
    a = ap.parse_args()
    rows = []
    for model in a.models.split(","):
        ckpt = checkpoint(a.memfit, model, a.ckpt_dir)
        n = a.tokens or TOKENS[model]
        kv = sample(a.memfit, model, ckpt, n, True)
        full = sample(a.memfit, model, ckpt, n, False)
        rows.append({"model": model, "tokens": n, "kv": kv, "no_kv": full,
                     "same_text": kv["text"] == full["text"],
                     "speedup": kv["tokens_per_s"] / max(full["tokens_per_s"], 1e-9)})
    print(f"CPU: {cpu_model()}; greedy, after a {rows[0]['kv']['prompt_tokens']}-token prompt\n")
    print("| model | tokens | kv cache tokens/s | without tokens/s | ratio | first token s (kv / without)"
          " | pool peak (kv / without) | same greedy text |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['tokens']} | {r['kv']['tokens_per_s']:.1f} | {r['no_kv']['tokens_per_s']:.2f} "
              f"| {r['speedup']:.1f}x | {r['kv']['first_s']:.2f} / {r['no_kv']['first_s']:.2f} | "
              f"{r['kv']['pool_peak']} / {r['no_kv']['pool_peak']} | {r['same_text']} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"cpu": cpu_model(), "rows": rows}, f, indent=1)
    if not all(r["same_text"] for r in rows):
        sys.exit("the greedy texts differ between the cached and the cache-less sampler")


if __name__ == "__main__":
    main()
