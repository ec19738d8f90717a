#!/usr/bin/env python3
"""Writes tests/reference/gpt2_fixture.safetensors: a tiny GPT-2 computed by PyTorch in float64
(weights, one batch, logits, loss, every gradient, and the parameters after 3 AdamW steps with
weight decay on 2-D weights), which tests/model/gpt2_reference_test.cpp compares memfit against.

Run by hand, not by CI (the fixture is committed):
    /usr/bin/python3 tests/reference/make_gpt2_fixture.py
It needs Debian's python3-torch and python3-numpy. The model here is written out in full so the
reference depends on nothing of memfit's: parameter names and layouts follow memfit's
ParamLayout (linear weights (out, in); wte padded to a multiple of 64 rows with zero rows).
"""
import json
import math
import os
import struct

import numpy as np
import torch
import torch.nn.functional as F

CONFIG = dict(n_layer=2, n_head=4, d_model=32, max_seq_len=16, vocab_size=100)
B, T = 2, 12
ADAMW = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, steps=3)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt2_fixture.safetensors")


def padded_vocab(v):
    return (v + 63) // 64 * 64


def make_params(gen):
    c = CONFIG
    C, L, V, Vp = c["d_model"], c["n_layer"], c["vocab_size"], padded_vocab(c["vocab_size"])
    p = {}

    def normal(*shape, std=0.02):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * std

    wte = torch.zeros(Vp, C, dtype=torch.float64)
    wte[:V] = normal(V, C)
    p["wte.weight"] = wte
    p["wpe.weight"] = normal(c["max_seq_len"], C)
    for l in range(L):
        h = f"h.{l}."
        # Gains and biases are random too, so that every parameter's gradient is exercised.
        p[h + "ln_1.weight"] = 1 + normal(C, std=0.1)
        p[h + "ln_1.bias"] = normal(C, std=0.1)
        p[h + "attn.c_attn.weight"] = normal(3 * C, C)
        p[h + "attn.c_attn.bias"] = normal(3 * C)
        p[h + "attn.c_proj.weight"] = normal(C, C)
        p[h + "attn.c_proj.bias"] = normal(C)
        p[h + "ln_2.weight"] = 1 + normal(C, std=0.1)
        p[h + "ln_2.bias"] = normal(C, std=0.1)
        p[h + "mlp.c_fc.weight"] = normal(4 * C, C)
        p[h + "mlp.c_fc.bias"] = normal(4 * C)
        p[h + "mlp.c_proj.weight"] = normal(C, 4 * C)
        p[h + "mlp.c_proj.bias"] = normal(C)
    p["ln_f.weight"] = 1 + normal(C, std=0.1)
    p["ln_f.bias"] = normal(C, std=0.1)
    return p


def forward(p, tokens):
    c = CONFIG
    C, NH, V = c["d_model"], c["n_head"], c["vocab_size"]
    hs = C // NH
    Bn, Tn = tokens.shape
    x = p["wte.weight"][tokens] + p["wpe.weight"][:Tn]
    mask = torch.ones(Tn, Tn, dtype=torch.bool).tril()
    for l in range(c["n_layer"]):
        h = f"h.{l}."
        a = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], eps=1e-5)
        qkv = F.linear(a, p[h + "attn.c_attn.weight"], p[h + "attn.c_attn.bias"])
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.view(Bn, Tn, NH, hs).transpose(1, 2) for t in (q, k, v))
        s = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        s = s.masked_fill(~mask, float("-inf"))
        y = (s.softmax(-1) @ v).transpose(1, 2).reshape(Bn, Tn, C)
        x = x + F.linear(y, p[h + "attn.c_proj.weight"], p[h + "attn.c_proj.bias"])
        m = F.layer_norm(x, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], eps=1e-5)
        m = F.gelu(F.linear(m, p[h + "mlp.c_fc.weight"], p[h + "mlp.c_fc.bias"]), approximate="tanh")
        x = x + F.linear(m, p[h + "mlp.c_proj.weight"], p[h + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], eps=1e-5)
    return x @ p["wte.weight"][:V].T  # tied LM head over the real vocabulary only


def write_safetensors(path, tensors, metadata):
    header, offset, blobs = {"__metadata__": metadata}, 0, []
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        dtype = {np.float32: "F32", np.int32: "I32"}[arr.dtype.type]
        data = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def main():
    gen = torch.Generator().manual_seed(20240520)
    params = {k: v.requires_grad_() for k, v in make_params(gen).items()}
    V = CONFIG["vocab_size"]
    data = torch.randint(0, V, (B, T + 1), generator=gen)
    tokens, targets = data[:, :-1].contiguous(), data[:, 1:].contiguous()

    decay = [v for v in params.values() if v.dim() == 2]
    no_decay = [v for v in params.values() if v.dim() != 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": ADAMW["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"])

    out = {"tokens": tokens.numpy().astype(np.int32), "targets": targets.numpy().astype(np.int32)}
    for k, v in params.items():
        out["param." + k] = v.detach().numpy().astype(np.float32)
    losses = []
    for step in range(ADAMW["steps"]):
        opt.zero_grad()
        logits = forward(params, tokens)
        loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
        loss.backward()
        losses.append(loss.item())
        if step == 0:
            out["logits"] = logits.detach().numpy().astype(np.float32)
            for k, v in params.items():
                out["grad." + k] = v.grad.numpy().astype(np.float32)
        opt.step()
    out["losses"] = np.array(losses, dtype=np.float32)
    for k, v in params.items():
        out["after." + k] = v.detach().numpy().astype(np.float32)
    meta = {k: str(v) for k, v in {**CONFIG, **ADAMW, "B": B, "T": T}.items()}
    meta["torch"] = torch.__version__
    write_safetensors(OUT, out, meta)
    print(f"wrote {OUT}: loss {losses[0]:.6f}, {len(out)} tensors")


if __name__ == "__main__":
    torch.set_default_dtype(torch.float64)
    main()
