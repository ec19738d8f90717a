#!/usr/bin/env python3
"""One training step (forward, backward, AdamW), memfit against PyTorch, side by side.

For each shape it runs memfit's train_step_tool and a PyTorch GPT-2 or LLaMA written below (the
baseline, not a dependency), each in its own process so that peak RSS is each one's own,
and prints a table of median step time, tokens/s, achieved TFLOP/s and peak memory, with the
ratios. Results go to a JSON file too.

    /usr/bin/python3 bench/e2e/step_vs_pytorch.py [--steps 5] [--out docs/bench/step.json]
    /usr/bin/python3 bench/e2e/step_vs_pytorch.py --family llama

A shape's name says its family. --family llama picks the LLaMA defaults: llama-small-test at
8x256, fp32 and bf16 (memfit --precision bf16 against torch.autocast("cpu", bfloat16)), 3
interleaved repeats; --precisions adds bf16 to any run. The LLaMA shapes are memfit's llama-tiny
preset with memfit train's overrides; vocabulary 50257 like GPT-2's shapes (random tokens, so
the Llama 3 vocabulary would only widen the head).

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
from bench_common import cpu_model, isa_env, native_bf16  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "build", "train_step_tool")
PRESETS = {  # name: (layers, heads, width, context, vocab)
    "gpt2-small-test": (6, 6, 384, 256, 50257),
    "gpt2": (12, 12, 768, 1024, 50257),
}
SHAPES = [("gpt2-small-test", 8, 256), ("gpt2", 4, 64), ("gpt2", 4, 256), ("gpt2", 8, 256)]
# name: (layers, heads, key/value heads, width, MLP width, context, vocab); untied head, RoPE
# base 10000. llama-small-test is gpt2-small-test's shape as a LLaMA (MLP 8/3 x 384 rounded up to
# 256, Meta's rule); llama-tiny is memfit's preset of that name, for a quick check.
LLAMA = {
    "llama-small-test": (6, 6, 2, 384, 1024, 256, 50257),
    "llama-tiny": (2, 4, 2, 96, 256, 64, 512),
}
LLAMA_SHAPES = [("llama-small-test", 8, 256)]
# --family: its default shapes, precisions, repeats and JSON file (under docs/bench/).
FAMILY_DEFAULTS = {"gpt2": (SHAPES, "fp32", 1, "step_vs_pytorch.json"),
                   "llama": (LLAMA_SHAPES, "fp32,bf16", 3, "step_vs_pytorch_llama.json")}


def memfit_model_args(model):
    """train_step_tool's options for a shape: a GPT-2 preset by name, a LLaMA shape as the
    llama-tiny preset with memfit train's overrides."""
    if model not in LLAMA:
        return ["--model", model]
    L, NH, NKV, C, FF, ctx, V = LLAMA[model]
    return ["--model", "llama-tiny", "--n-layer", str(L), "--n-head", str(NH),
            "--n-kv-head", str(NKV), "--d-model", str(C), "--ffn-dim", str(FF),
            "--vocab", str(V), "--context", str(ctx), "--tie-embeddings", "false"]


def gpt2_module(model):
    """PyTorch's GPT-2 at a PRESETS shape (nanoGPT's form). Returns (module, rows of the
    looked-up position embedding, which step FLOPs leave out)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

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

    return GPT(), ctx


def llama_module(model):
    """PyTorch's LLaMA at a LLAMA shape, written as Hugging Face's LlamaForCausalLM computes it
    (RMSNorm, rotate-half RoPE, grouped-query attention by repeating key/value heads, SwiGLU,
    untied head, no biases) in the GPT-2 baseline's form: fused q|k|v and gate|up projections,
    the same manual causal attention, vocabulary padded to 64. Returns (module, rows of the
    looked-up token embedding, which step FLOPs leave out)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    L, NH, NKV, C, FF, ctx, V = LLAMA[model]
    Vp, hs = (V + 63) // 64 * 64, C // NH

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(C))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight

    def rotate_half(x):
        return torch.cat((-x[..., hs // 2:], x[..., :hs // 2]), dim=-1)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn_norm, self.mlp_norm = RMSNorm(), RMSNorm()
            self.qkv = nn.Linear(C, (NH + 2 * NKV) * hs, bias=False)
            self.o_proj = nn.Linear(NH * hs, C, bias=False)
            self.gate_up = nn.Linear(C, 2 * FF, bias=False)
            self.down = nn.Linear(FF, C, bias=False)

        def forward(self, x, cos, sin, mask):
            Bn, Tn, _ = x.shape
            q, k, v = self.qkv(self.attn_norm(x)).split([NH * hs, NKV * hs, NKV * hs], dim=2)
            q = q.view(Bn, Tn, NH, hs).transpose(1, 2)
            k, v = (t.view(Bn, Tn, NKV, hs).transpose(1, 2) for t in (k, v))
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            k, v = (t.repeat_interleave(NH // NKV, dim=1) for t in (k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).contiguous().view(Bn, Tn, NH * hs)
            x = x + self.o_proj(y)
            gate, up = self.gate_up(self.mlp_norm(x)).split(FF, dim=2)
            return x + self.down(F.silu(gate) * up)

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(Vp, C)
            self.h = nn.ModuleList(Block() for _ in range(L))
            self.norm = RMSNorm()
            self.lm_head = nn.Linear(C, Vp, bias=False)
            inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hs, 2).float() / hs))
            angles = torch.outer(torch.arange(ctx).float(), inv_freq)
            self.register_buffer("cos", torch.cat((angles, angles), dim=-1).cos())
            self.register_buffer("sin", torch.cat((angles, angles), dim=-1).sin())
            self.register_buffer("mask", torch.ones(ctx, ctx, dtype=torch.bool).tril())

        def forward(self, idx, targets):
            Tn = idx.shape[1]
            cos, sin, mask = self.cos[:Tn], self.sin[:Tn], self.mask[:Tn, :Tn]
            x = self.wte(idx)
            for b in self.h:
                x = b(x, cos, sin, mask)
            logits = self.lm_head(self.norm(x))
            return F.cross_entropy(logits.view(-1, Vp), targets.view(-1))

    return Llama(), Vp


def torch_worker(model, B, T, steps, warmup, autocast=False):
    import torch

    torch.set_num_threads(os.cpu_count())
    torch.set_flush_denormal(True)  # denormal gradients and moments are slow on x86
    torch.manual_seed(1337)
    if model in LLAMA:
        model_, lookup_rows = llama_module(model)
        L, _, _, C, _, _, V = LLAMA[model]
    else:
        model_, lookup_rows = gpt2_module(model)
        L, _, C, _, V = PRESETS[model]
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
    # The same count as train_step_tool's: parameters that multiply (not looked-up rows) and
    # the attention scores and mixing.
    n = sum(p.numel() for p in model_.parameters()) - lookup_rows * C
    flops = 6.0 * n * B * T + 12.0 * L * C * T * B * T
    med = statistics.median(ms)
    return {"impl": "pytorch", "torch": torch.__version__, "model": model, "batch": B, "seq": T,
            "autocast": autocast,
            "step_ms": ms, "median_ms": med, "tokens_per_s": B * T / (med / 1e3),
            "flops_per_step": flops, "tflops": flops / (med / 1e3) / 1e12,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def run_memfit(model, B, T, steps, warmup, attention, isa="", precision="fp32"):
    out = subprocess.run([TOOL] + memfit_model_args(model) +
                         ["--batch", str(B), "--seq", str(T),
                          "--steps", str(steps), "--warmup", str(warmup),
                          "--attention", attention, "--precision", precision],
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
    ap.add_argument("--family", default="gpt2", choices=sorted(FAMILY_DEFAULTS),
                    help="the family whose default shapes, precisions, repeats and --out apply")
    ap.add_argument("--shapes", help="comma-separated model:BxT (GPT-2: " +
                    ",".join(f"{m}:{b}x{t}" for m, b, t in SHAPES) + "; LLaMA: " +
                    ",".join(f"{m}:{b}x{t}" for m, b, t in LLAMA_SHAPES) + ")")
    ap.add_argument("--precisions", help="comma-separated fp32, bf16 (memfit --precision bf16 "
                    "against PyTorch autocast); GPT-2: fp32, LLaMA: fp32,bf16")
    ap.add_argument("--attention", default="flash", choices=["flash", "plain"],
                    help="memfit's attention kernel")
    ap.add_argument("--isa", default="", help="run both sides capped, e.g. avx2 (bench_common)")
    ap.add_argument("--repeats", type=int,
                    help="interleaved memfit/PyTorch runs per shape; the median of their medians "
                    "(GPT-2: 1, LLaMA: 3)")
    ap.add_argument("--out", help="JSON results (GPT-2: docs/bench/step_vs_pytorch.json, LLaMA: "
                    "docs/bench/step_vs_pytorch_llama.json)")
    ap.add_argument("--torch-worker", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_worker:
        m, b, t, s, w, a = args.torch_worker
        print(json.dumps(torch_worker(m, int(b), int(t), int(s), int(w), bool(int(a)))))
        return
    shapes, precisions, repeats, out = FAMILY_DEFAULTS[args.family]
    shapes = args.shapes or ",".join(f"{m}:{b}x{t}" for m, b, t in shapes)
    precisions = (args.precisions or precisions).split(",")
    repeats = args.repeats or repeats
    out = args.out or os.path.join(ROOT, "docs", "bench", out)
    for p in precisions:
        if p not in ("fp32", "bf16"):
            sys.exit(f"--precisions: {p} is not fp32 or bf16")
    bf16 = "bf16" in precisions
    rows = []
    for spec in shapes.split(","):
        model, bt = spec.split(":")
        if model not in PRESETS and model not in LLAMA:
            sys.exit(f"{spec}: unknown shape; known: {', '.join(list(PRESETS) + list(LLAMA))}")
        B, T = (int(x) for x in bt.split("x"))
        mfs, pts = {p: [] for p in precisions}, {p: [] for p in precisions}
        for _ in range(repeats):  # interleaved: each repeat runs every precision on both sides
            for p in precisions:
                mfs[p].append(run_memfit(model, B, T, args.steps, args.warmup, args.attention,
                                         args.isa, precision=p))
                pts[p].append(run_torch(model, B, T, args.steps, args.warmup,
                                        autocast=p == "bf16", isa=args.isa))
        for p in precisions:
            mf, pt = mfs[p][-1], pts[p][-1]
            for d, runs in ((mf, mfs[p]), (pt, pts[p])):
                d["runs_median_ms"] = [r["median_ms"] for r in runs]
                d["median_ms"] = statistics.median(d["runs_median_ms"])
                d["tokens_per_s"] = B * T / (d["median_ms"] / 1e3)
                d["tflops"] = d["flops_per_step"] / (d["median_ms"] / 1e3) / 1e12
            rows.append({"shape": spec, "precision": p, "cpu": cpu_model(),
                         "isa_cap": args.isa or None, "native_bf16": native_bf16(),
                         "memfit": mf, "pytorch": pt,
                         "speedup": pt["median_ms"] / mf["median_ms"],
                         "memory_ratio": mf["peak_rss_bytes"] / pt["peak_rss_bytes"]})
        print(f"{spec}: done", file=sys.stderr)
    print(f"CPU: {cpu_model()}" + (f", capped to {args.isa} on both sides" if args.isa else ""))
    if bf16:  # the bf16 target (3x PyTorch autocast) is set where the CPU has native bf16
        print(f"native bf16 (AVX512_BF16 or AMX): {'yes' if native_bf16() else 'no'}")
    cats = ("params", "master", "grads", "optimizer", "activations", "workspace") if bf16 else (
        "params", "grads", "optimizer", "activations", "workspace")
    hdr = (f"| shape | impl | median ms/step | tokens/s | TFLOP/s | peak RSS MiB | "
           f"pool peak MiB ({'/'.join(cats)}) |")
    print(hdr)
    print("|" + "---|" * 7)
    for r in rows:
        for impl in ("memfit", "pytorch"):
            d = r[impl]
            pool = ""
            if impl == "memfit":
                c = d["pool_peak_by_category"]
                pool = f"{mib(d['pool_peak_bytes']):.0f} (" + "/".join(
                    f"{mib(c.get(k, 0)):.0f}" for k in cats) + ")"
            name = impl if r["precision"] == "fp32" else (
                "memfit bf16" if impl == "memfit" else "pytorch autocast bf16")
            print(f"| {r['shape']} | {name} | {d['median_ms']:.0f} | {d['tokens_per_s']:.0f} | "
                  f"{d['tflops']:.3f} | {mib(d['peak_rss_bytes']):.0f} | {pool} |")
    print()
    print("| shape | speedup (PyTorch ms / memfit ms) | memory (memfit RSS / PyTorch RSS) |")
    print("|---|---|---|")
    for r in rows:
        label = r["shape"] + (" bf16 vs autocast" if r["precision"] == "bf16" else "")
        print(f"| {label} | {r['speedup']:.2f}x | {r['memory_ratio']:.2f}x |")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out + ".tmp", "w") as f:
        json.dump(rows, f, indent=1)
    os.replace(out + ".tmp", out)


if __name__ == "__main__":
    main()
