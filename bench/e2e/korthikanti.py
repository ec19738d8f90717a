#!/usr/bin/env python3
"""Activation memory per layer, memfit's planner against Korthikanti et al. 2022 ("Reducing
Activation Recomputation in Large Transformer Models", Table 2's formulas) for the paper's GPT
configurations (Table 3: 22B, 175B, 530B, 1T at tensor-parallel size 8), issue 42 item 5.

memfit's figure is what `memfit plan --json` says one block keeps for its backward
("block_activations": the bytes of the block's own saved buffers, one rank's under --tp) in bf16,
the paper's 16-bit mixed precision (fp16 keeps the same bytes, but has no flash attention). The
paper's s = 2048, micro-batch b = 1, vocabulary 51,200. Rows:

  no parallelism            sbh(34 + 5as/h)            --ckpt none
  selective recomputation   34sbh                      --ckpt selective
  tensor parallel           sbh(10 + 24/t + 5as/(ht))  --tp t --ckpt none
  tensor + selective        sbh(10 + 24/t)             --tp t --ckpt selective
  tensor + sequence         (sbh/t)(34 + 5as/h)        --tp t --sp (where memfit has --sp)
  tensor + sequence + sel.  34sbh/t                    --tp t --sp --ckpt selective
  full recomputation        2sbh                       --ckpt full

each with flash attention (memfit's default: no (s, s) tensor is kept, with or without selective)
and plain attention (the probabilities kept per head, as the paper's softmax output is; its
selective recomputes them from one shared block's worth, as Megatron's does). Why each differs:
docs/notes/activation-memory.md, Note [Activation memory]. Nothing is allocated or run: these are
plans, which equal the measured bytes wherever memfit trains the configuration (--tp in fp32,
bf16 and fp16 with every policy; --sp in fp32 and bf16).

    python3 bench/e2e/korthikanti.py            # prints the Markdown table, writes the JSON
    python3 bench/e2e/korthikanti.py --json docs/bench/korthikanti.json
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import ROOT, run_json  # noqa: E402

MEMFIT = os.path.join(ROOT, "build", "memfit")
MIB = 1024.0 ** 2
S, B, VOCAB = 2048, 1, 51200
# Table 3: name, hidden size h, attention heads a, layers, tensor-parallel size t.
CONFIGS = (("22B", 6144, 64, 48, 8), ("175B", 12288, 96, 96, 8),
           ("530B", 20480, 128, 105, 8), ("1T", 25600, 160, 128, 8))


def has_sp():
    """Whether this memfit plans sequence parallelism in bf16, the paper's precision (`memfit
    plan --help` lists --sp, and a tiny bf16 --tp 2 --sp plan is not refused: an older memfit
    built --sp in fp32 alone, Note [Sequence parallel])."""
    r = subprocess.run([MEMFIT, "plan", "--help"], capture_output=True, text=True)
    if re.search(r"(^|[\s,])--sp(?![\w-])", r.stdout) is None:
        return False
    with tempfile.TemporaryDirectory() as data:
        r = subprocess.run([MEMFIT, "plan", "--model", "gpt2-tiny", "--seq-len", "32",
                            "--batch", "1", "--precision", "bf16", "--world-size", "2", "--tp",
                            "2", "--sp", "--data", data], capture_output=True, text=True)
    return r.returncode == 0


def formulas(h, a, t):
    """Table 2's bytes per layer for each setting (t: the tensor-parallel size)."""
    sbh = S * B * h
    quad = 5 * a * S / h  # the attention core's softmax, its dropout mask and output
    return {
        "none": sbh * (34 + quad),
        "selective": 34 * sbh,
        "tp": sbh * (10 + 24 / t + quad / t),
        "tp_selective": sbh * (10 + 24 / t),
        "tp_sp": sbh / t * (34 + quad),
        "tp_sp_selective": 34 * sbh / t,
        "full": 2 * sbh,
    }


def block_bytes(data, h, a, layers, t, ckpt, attention, sp=False):
    """One block's kept bytes (the largest block's) and its buffers by name, from the plan."""
    cmd = [MEMFIT, "plan", "--json", "--model", "gpt2", "--n-layer", str(layers),
           "--d-model", str(h), "--n-head", str(a), "--vocab", str(VOCAB), "--seq-len", str(S),
           "--batch", str(B), "--precision", "bf16", "--ckpt", ckpt, "--attention", attention,
           "--threads", "1", "--data", data]
    if t > 1:
        cmd += ["--world-size", str(t), "--tp", str(t)]
    if sp:
        cmd += ["--sp"]
    j = run_json(cmd)
    blocks = j["block_activations"]
    return max(blocks["per_block"]), blocks["buffers"]


SETTINGS = (  # key, label, t > 1, policy, sequence parallel
    ("none", "no parallelism", False, "none", False),
    ("selective", "selective recomputation", False, "selective", False),
    ("tp", "tensor parallel", True, "none", False),
    ("tp_selective", "tensor parallel + selective", True, "selective", False),
    ("tp_sp", "tensor + sequence parallel", True, "none", True),
    ("tp_sp_selective", "tensor + sequence parallel + selective", True, "selective", True),
    ("full", "full recomputation", False, "full", False),
)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=os.path.join(ROOT, "docs", "bench", "korthikanti.json"),
                    help="where to write the numbers")
    args = ap.parse_args()
    sp = has_sp()
    rows, record = [], []
    with tempfile.TemporaryDirectory() as data:  # no shards: plans count no data
        for name, h, a, layers, t in CONFIGS:
            f = formulas(h, a, t)
            for key, label, parallel, ckpt, seq in SETTINGS:
                if seq and not sp:
                    continue
                tt = t if parallel else 1
                flash, buffers = block_bytes(data, h, a, layers, tt, ckpt, "flash", seq)
                plain = (None if ckpt == "full" else
                         block_bytes(data, h, a, layers, tt, ckpt, "plain", seq)[0])
                record.append({"model": name, "h": h, "a": a, "layers": layers, "t": tt,
                               "setting": key, "ckpt": ckpt, "sp": seq,
                               "formula_bytes": f[key], "flash_bytes": flash,
                               "plain_bytes": plain, "flash_buffers": buffers})
                rows.append(
                    f"| {name} | {label}{f' (t = {tt})' if parallel else ''} | "
                    f"{f[key] / MIB:,.1f} | {flash / MIB:,.1f} ({flash / f[key]:.2f}) | "
                    + (f"{plain / MIB:,.1f} ({plain / f[key]:.2f})" if plain is not None
                       else "—") + " |")
    print(f"Activation bytes per layer (MiB; memfit / formula in brackets), s = {S}, b = {B}, "
          f"bf16, one rank's{'' if sp else '; this memfit plans no bf16 --sp, so no sequence-parallel rows'}:\n")
    print("| model | setting | Korthikanti et al. | memfit, flash attention | "
          "memfit, plain attention |")
    print("| --- | --- | ---: | ---: | ---: |")
    print("\n".join(rows))
    with open(args.json, "w") as out:
        json.dump({"s": S, "b": B, "vocab": VOCAB, "precision": "bf16", "sp": sp,
                   "rows": record}, out, indent=1)
        out.write("\n")
    print(f"\n(wrote {os.path.relpath(args.json, ROOT)})")


if __name__ == "__main__":
    main()
