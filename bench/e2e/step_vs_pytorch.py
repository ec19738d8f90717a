#!/usr/bin/env python3
"""One training step (forward, backward, AdamW), memfit against PyTorch, side by side.

For each shape it runs memfit's train_step_tool and a PyTorch GPT-2 written below (the
baseline, not a dependency), each in its own process so that peak RSS is each one's own,
and prints a table of median step time, tokens/s, achieved TFLOP/s and peak memory, with the
ratios. Results go to a JSON file too.

    /usr/bin/python3 bench/e2e/step_vs_pytorch.py [--steps 5] [--out docs/bench/step.json]

Needs scripts/setup_bench.sh (Debian python3-torch with OpenBLAS). OPENBLAS_CORETYPE is unset
for PyTorch so it runs at its best. --isa avx2 makes an AVX-512 machine stand in for an AVX2-only
one on both sides (bench_common.isa_env).
"""
import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import cpu_model, isa_env  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "build", "train_step_tool")
PRESETS = {  # name: (layers, heads, width, context, vocab)
    "gpt2-small-test": (6, 6, 384, 256, 50257),
    "gpt2": (12, 12, 768, 1024, 50257),
}
SHAPES = [("gpt2-small-test", 8, 256), ("gpt2", 4, 64), ("gpt2", 4, 256), ("gpt2", 8, 256)]


def torch_worker(model, B, T, steps, warmup, autocast=False):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(os.cpu_count())
    torch.set_flush_denormal(True)  # denormal gradients and moments are slow on x86
    torch.manual_seed(1337)
    L, NH, C, ctx, V = PRESETS[model]
    Vp = (V + 63) // 64 * 64  # padded like nanoGPT, PyTorch's fastest form

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
            self.register_buffer("mask", torch.ones(ctx, ctx, dtype=torch.bool).tril())

        def forward(self, x):
            Bn, Tn, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(Bn, Tn, NH, C // NH).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // NH))
            att = att.masked_fill(~self.mask[:Tn, :Tn], float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).contiguous().view(Bn, Tn, C)
            x = x + self.c_proj(y)
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(Vp, C), nn.Embedding(ctx, C)
            self.h = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C)
            self.lm_head = nn.Linear(C, Vp, bias=False)
            self.lm_head.weight = self.wte.weight

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for b in self.h:
                x = b(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, Vp), targets.view(-1))

    model_ = GPT()
    decay = [p for p in model_.parameters() if p.dim() >= 2]
    no_decay = [p for p in model_.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    idx = torch.randint(0, V, (B, T))
    tgt = torch.randint(0, V, (B, T))
    ms = []
    for s in range(warmup + steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if autocast:  # bf16 matmuls, fp32 weights and optimizer: PyTorch's mixed precision
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model_(idx, tgt)
        else:
            loss = model_(idx, tgt)
        loss.backward()
        opt.step()
        t1 = time.perf_counter()
        if s >= warmup:
            ms.append((t1 - t0) * 1e3)
    n = sum(p.numel() for p in model_.parameters()) - ctx * C
    flops = 6.0 * n * B * T + 12.0 * L * C * T * B * T
    med = statistics.median(ms)
    return {"impl": "pytorch", "torch": torch.__version__, "model": model, "batch": B, "seq": T,
            "autocast": autocast,
            "step_ms": ms, "median_ms": med, "tokens_per_s": B * T / (med / 1e3),
            "flops_per_step": flops, "tflops": flops / (med / 1e3) / 1e12,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def run_memfit(model, B, T, steps, warmup, attention, isa=""):
    out = subprocess.run([TOOL, "--model", model, "--batch", str(B), "--seq", str(T),
                          "--steps", str(steps), "--warmup", str(warmup),
                          "--attention", attention],
                         check=True, capture_output=True, text=True, env=isa_env(isa))
    return json.loads(out.stdout)


def run_torch(model, B, T, steps, warmup, autocast=False, isa=""):
    env = isa_env(isa, torch=True)
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--torch-worker", model,
                          str(B), str(T), str(steps), str(warmup), str(int(autocast))],
                         check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def mib(b):
    return b / 2**20


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--shapes", default=",".join(f"{m}:{b}x{t}" for m, b, t in SHAPES),
                    help="comma-separated model:BxT")
    ap.add_argument("--attention", default="flash", choices=["flash", "plain"],
                    help="memfit's attention kernel")
    ap.add_argument("--isa", default="", help="run both sides capped, e.g. avx2 (bench_common)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="interleaved memfit/PyTorch runs per shape; the median of their medians")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "bench", "step_vs_pytorch.json"))
    ap.add_argument("--torch-worker", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_worker:
        m, b, t, s, w, a = args.torch_worker
        print(json.dumps(torch_worker(m, int(b), int(t), int(s), int(w), bool(int(a)))))
        return
    rows = []
    for spec in args.shapes.split(","):
        model, bt = spec.split(":")
        B, T = (int(x) for x in bt.split("x"))
        mfs, pts = [], []
        for _ in range(args.repeats):
            mfs.append(run_memfit(model, B, T, args.steps, args.warmup, args.attention, args.isa))
            pts.append(run_torch(model, B, T, args.steps, args.warmup, isa=args.isa))
        mf, pt = mfs[-1], pts[-1]
        for d, runs in ((mf, mfs), (pt, pts)):
            d["runs_median_ms"] = [r["median_ms"] for r in runs]
            d["median_ms"] = statistics.median(d["runs_median_ms"])
            d["tokens_per_s"] = B * T / (d["median_ms"] / 1e3)
            d["tflops"] = d["flops_per_step"] / (d["median_ms"] / 1e3) / 1e12
        rows.append({"shape": spec, "cpu": cpu_model(), "isa_cap": args.isa or None,
                     "memfit": mf, "pytorch": pt,
                     "speedup": pt["median_ms"] / mf["median_ms"],
                     "memory_ratio": mf["peak_rss_bytes"] / pt["peak_rss_bytes"]})
        print(f"{spec}: done", file=sys.stderr)
    print(f"CPU: {cpu_model()}" + (f", capped to {args.isa} on both sides" if args.isa else ""))
    hdr = (f"| shape | impl | median ms/step | tokens/s | TFLOP/s | peak RSS MiB | "
           f"pool peak MiB (params/grads/optimizer/activations/workspace) |")
    print(hdr)
    print("|" + "---|" * 7)
    for r in rows:
        for impl in ("memfit", "pytorch"):
            d = r[impl]
            pool = ""
            if impl == "memfit":
                c = d["pool_peak_by_category"]
                pool = f"{mib(d['pool_peak_bytes']):.0f} (" + "/".join(
                    f"{mib(c.get(k, 0)):.0f}" for k in
                    ("params", "grads", "optimizer", "activations", "workspace")) + ")"
            print(f"| {r['shape']} | {impl} | {d['median_ms']:.0f} | {d['tokens_per_s']:.0f} | "
                  f"{d['tflops']:.3f} | {mib(d['peak_rss_bytes']):.0f} | {pool} |")
    print()
    print("| shape | speedup (PyTorch ms / memfit ms) | memory (memfit RSS / PyTorch RSS) |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['speedup']:.2f}x | {r['memory_ratio']:.2f}x |")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".tmp", "w") as f:
        json.dump(rows, f, indent=1)
    os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
