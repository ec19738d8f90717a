#!/usr/bin/python3
"""Activation compression's block size (Note [Activation compression]): the round-trip error of
int8 and FP8 E4M3 with one scale per 16, 32, 64, 128 or 256 values, on the activations a trained
GPT-2 saves for its backward: each compressible buffer of each layer (ln_1, qkv, atty,
residual_2, ln_2, fch) on a batch of the validation split. The error of a buffer is
||x - x'|| / ||x|| over the buffer (relative RMS; the worst of the model's layers), the
quantisation as kernels/cpu/act_quant.h does it (absmax scale per block of consecutive values,
round to nearest even).

    /usr/bin/python3 bench/e2e/act_block_size.py out/brown_act_compress/none

Needs Debian's python3-torch and python3-numpy, a memfit checkpoint of a GPT-2
(model.safetensors, config.json) and data/brown/val_000000.bin. Prints a Markdown table and writes
docs/bench/act_block_size.json. A forward in FP32 only, a few seconds.
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BLOCKS = [16, 32, 64, 128, 256]
NAMES = ["ln_1", "qkv", "atty", "residual_2", "ln_2", "fch"]


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        lo, hi = e["data_offsets"]
        raw = np.frombuffer(data[lo:hi], dtype={"F32": np.float32, "BF16": np.uint16}[e["dtype"]])
        if e["dtype"] == "BF16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        # Hugging Face's GPT2LMHeadModel names: "transformer.h.0...." -> "h.0...."
        out[name.removeprefix("transformer.")] = torch.from_numpy(raw.reshape(e["shape"]).copy())
    return out


def read_tokens(path, n):
    with open(path, "rb") as f:
        f.seek(1024)
        return np.frombuffer(f.read(2 * n), dtype=np.uint16).astype(np.int64)


def fp8_round(y):
    """E4M3 nearest value of y (|y| <= 448), ties to even, as fp8_e4m3_from_f32."""
    a = y.abs()
    e = torch.floor(torch.log2(a.clamp_min(2.0 ** -6)))  # exponent, subnormals at -6
    step = torch.pow(2.0, e - 3)
    return torch.sign(y) * torch.round(a / step) * step  # torch.round: ties to even


def roundtrip(x, block, fmt):
    flat = x.reshape(-1).float()
    pad = (-flat.numel()) % block
    b = F.pad(flat, (0, pad)).view(-1, block)
    qmax = 448.0 if fmt == "fp8" else 127.0
    absmax = b.abs().amax(dim=1, keepdim=True)
    scale = absmax / qmax
    inv = torch.where(absmax > 0, qmax / absmax, torch.zeros_like(absmax))
    y = (b * inv).clamp(-qmax, qmax)
    q = fp8_round(y) if fmt == "fp8" else torch.round(y)
    return (q * scale).view(-1)[: flat.numel()].view_as(x)


def activations(ckpt, tokens, B, T):
    cfg = json.load(open(os.path.join(ckpt, "config.json")))
    p = read_safetensors(os.path.join(ckpt, "model.safetensors"))
    C, NH, L = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
    hs = C // NH
    x = p["wte.weight"][tokens] + p["wpe.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    saved = []
    for l in range(L):
        h = f"h.{l}."
        a = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], eps=1e-5)
        qkv = a @ p[h + "attn.c_attn.weight"] + p[h + "attn.c_attn.bias"]  # Conv1D: (in, out)
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in qkv.split(C, dim=-1))
        s = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        y = (s.masked_fill(~mask, float("-inf")).softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
        r2 = x + y @ p[h + "attn.c_proj.weight"] + p[h + "attn.c_proj.bias"]
        m = F.layer_norm(r2, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], eps=1e-5)
        fch = m @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"]
        x = r2 + F.gelu(fch, approximate="tanh") @ p[h + "mlp.c_proj.weight"]
        x = x + p[h + "mlp.c_proj.bias"]
        saved.append(dict(zip(NAMES, [a, qkv, y, r2, m, fch])))
    return saved


def main():
    ckpt = (sys.argv[1] if len(sys.argv) > 1
            else os.path.join(ROOT, "out", "brown_act_compress", "none"))
    B, T = 4, 256
    tokens = torch.from_numpy(read_tokens(os.path.join(ROOT, "data", "brown", "val_000000.bin"),
                                          B * T)).view(B, T)
    with torch.no_grad():
        saved = activations(ckpt, tokens, B, T)
    rows = []
    for fmt in ("int8", "fp8"):
        for name in NAMES:
            errs = []
            for block in BLOCKS:
                e = [float((roundtrip(s[name], block, fmt) - s[name]).norm() / s[name].norm())
                     for s in saved]
                errs.append(max(e))
            rows.append({"format": fmt, "buffer": name, "worst_layer_rel_rms": errs})
    print(f"Round-trip error ||x - x'|| / ||x|| of the saved activations, worst layer of the model,"
          f" {os.path.relpath(ckpt, ROOT)} on {B} x {T} validation tokens\n")
    print("| format | buffer | " + " | ".join(f"block {b}" for b in BLOCKS) + " |")
    print("|---|---|" + "---|" * len(BLOCKS))
    for r in rows:
        print(f"| {r['format']} | {r['buffer']} | " +
              " | ".join(f"{e:.2e}" for e in r["worst_layer_rel_rms"]) + " |")
    print("\nbytes a value: " + ", ".join(f"{b}: {1 + 4 / b:.4f}" for b in BLOCKS))
    with open(os.path.join(ROOT, "docs", "bench", "act_block_size.json"), "w") as f:
        json.dump({"checkpoint": os.path.relpath(ckpt, ROOT), "tokens": [B, T], "blocks": BLOCKS,
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
