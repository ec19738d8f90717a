#!/usr/bin/python3
"""Writes tests/reference/apollo_fixture.safetensors: three steps of APOLLO and APOLLO-Mini on
the parameters of a tiny GPT-2 layout (memfit's ParamLayout names, shapes and decay flags),
computed by PyTorch in float32, which tests/optim/apollo_reference_test.cpp compares memfit's
Apollo optimizer against (1e-5 relative).

Run by hand, not by CI (the fixture is committed):
    /usr/bin/python3 tests/reference/make_apollo_fixture.py
It needs Debian's python3-torch (1.13) and python3-numpy. The projected matrices follow the paper's code
(github.com/zhuhanqing/APOLLO, apollo_torch/apollo.py and random_projector.py, proj_type "std",
scale_front off, the norm-growth limiter on) line by line; the random projection is memfit's own
counter-based generator (optim/apollo_projection.h), written again here in NumPy, since
torch.Generator's stream cannot be reproduced in C++. The other parameters go through
torch.optim.AdamW, as memfit steps them.
"""
import json
import math
import os
import struct

import numpy as np
import torch

CONFIG = dict(n_layer=1, n_head=2, d_model=16, max_seq_len=8, vocab_size=20)
HYPER = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, steps=3, grad_scale=0.5,
             seed=7, proj_gap=2, apollo_rank=4)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "apollo_fixture.safetensors")
MASK = (1 << 64) - 1


def layout():
    """(name, shape, projected, decay) in memfit's GPT-2 ParamLayout order."""
    c = CONFIG
    C, V = c["d_model"], (c["vocab_size"] + 63) // 64 * 64
    ps = [("wte.weight", (V, C), False, True), ("wpe.weight", (c["max_seq_len"], C), False, True)]
    for l in range(c["n_layer"]):
        h = f"h.{l}."
        ps += [(h + "ln_1.weight", (C,), False, False), (h + "ln_1.bias", (C,), False, False),
               (h + "attn.c_attn.weight", (3 * C, C), True, True),
               (h + "attn.c_attn.bias", (3 * C,), False, False),
               (h + "attn.c_proj.weight", (C, C), True, True),
               (h + "attn.c_proj.bias", (C,), False, False),
               (h + "ln_2.weight", (C,), False, False), (h + "ln_2.bias", (C,), False, False),
               (h + "mlp.c_fc.weight", (4 * C, C), True, True),
               (h + "mlp.c_fc.bias", (4 * C,), False, False),
               (h + "mlp.c_proj.weight", (C, 4 * C), True, True),
               (h + "mlp.c_proj.bias", (C,), False, False)]
    return ps + [("ln_f.weight", (C,), False, False), ("ln_f.bias", (C,), False, False)]


def splitmix64(x):
    with np.errstate(over="ignore"):
        z = (x + np.uint64(0x9E3779B97F4A7C15))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def projection_key(seed, index, window):
    s = lambda v: int(splitmix64(np.array([v & MASK], dtype=np.uint64))[0])
    return s((s((s(seed) + index) & MASK) + window) & MASK)


def projection(shape, key, rank):
    """memfit's apollo_projection_fill: Box-Muller pairs from SplitMix64 counters, / sqrt(rank)."""
    n = int(np.prod(shape))
    pairs = (n + 1) // 2
    k = np.arange(pairs, dtype=np.uint64)
    with np.errstate(over="ignore"):
        a = splitmix64(np.uint64(key) + np.uint64(2) * k)
        b = splitmix64(np.uint64(key) + np.uint64(2) * k + np.uint64(1))
    u1 = ((a >> np.uint64(11)) + np.uint64(1)).astype(np.float64) * 2.0 ** -53
    u2 = (b >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    rad, ang = np.sqrt(-2.0 * np.log(u1)), 2.0 * math.pi * u2
    z = np.empty(2 * pairs)
    z[0::2], z[1::2] = rad * np.cos(ang), rad * np.sin(ang)
    inv = 1.0 / math.sqrt(rank)
    return torch.from_numpy((z[:n] * inv).astype(np.float32).reshape(shape))


def apollo_matrix_step(p, grad, state, index, step, mini):
    """apollo_torch/apollo.py's step for one projected matrix (state["step"] = step - 1 before)."""
    H = HYPER
    m, n = grad.shape
    rank = min(1 if mini else H["apollo_rank"], min(m, n))
    key = projection_key(H["seed"], index, (step - 1) // H["proj_gap"])
    norm_dim = 0 if m < n else 1
    if m >= n:  # "right": ortho (rank, n), low = G @ ortho.T
        low = grad @ projection((rank, n), key, rank).t()
    else:  # "left": ortho (m, rank), low = ortho.T @ G
        low = projection((m, rank), key, rank).t() @ grad
    if "exp_avg" not in state:
        state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(low), torch.zeros_like(low)
    ea, es = state["exp_avg"], state["exp_avg_sq"]
    b1, b2 = H["beta1"], H["beta2"]
    ea.mul_(b1).add_(low, alpha=1.0 - b1)
    es.mul_(b2).addcmul_(low, low, value=1.0 - b2)
    denom = es.sqrt().add_(H["eps"])
    step_size = H["lr"] * math.sqrt(1.0 - b2 ** step) / (1.0 - b1 ** step)
    norm_grad = ea / denom
    if mini:
        factor = torch.norm(norm_grad) / (torch.norm(low) + 1e-8)
    else:
        factor = torch.norm(norm_grad, dim=norm_dim) / (torch.norm(low, dim=norm_dim) + 1e-8)
        if norm_dim == 1:
            factor = factor.unsqueeze(1)
    scaled = grad * factor
    if "scaled_grad" in state:
        sn = torch.norm(scaled)
        limiter = max(sn / (state["scaled_grad"] + 1e-8), 1.01) / 1.01
        scaled = scaled / limiter
        state["scaled_grad"] = sn / limiter
    else:
        state["scaled_grad"] = torch.norm(scaled)
    scaled = scaled * math.sqrt(128.0 if mini else 1.0)
    p.add_(scaled, alpha=-step_size)
    p.add_(p, alpha=-H["lr"] * H["weight_decay"])


def run(mini, w0, grads):
    H = HYPER
    ps = layout()
    w = {name: w0[name].clone() for name, *_ in ps}
    plain = [(name, torch.nn.Parameter(w[name]), decay) for name, _, proj, decay in ps if not proj]
    adamw = torch.optim.AdamW(
        [{"params": [p for _, p, d in plain if d], "weight_decay": H["weight_decay"]},
         {"params": [p for _, p, d in plain if not d], "weight_decay": 0.0}],
        lr=H["lr"], betas=(H["beta1"], H["beta2"]), eps=H["eps"])
    states = {}
    out = {}
    for t in range(1, H["steps"] + 1):
        for name, p, _ in plain:
            p.grad = grads[t - 1][name] * H["grad_scale"]
        adamw.step()
        for index, (name, _, proj, _) in enumerate(ps):
            if proj:
                apollo_matrix_step(w[name], grads[t - 1][name] * H["grad_scale"],
                                   states.setdefault(name, {}), index, t, mini)
        for name, p, _ in plain:
            w[name] = p.data
        for name, *_ in ps:
            out[f"{'apollo-mini' if mini else 'apollo'}.w{t}.{name}"] = w[name].numpy().copy()
    return out


def write_safetensors(path, tensors, metadata):
    header, offset, blobs = {"__metadata__": metadata}, 0, []
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        data = arr.tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    os.replace(path + ".tmp", path)


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1234)
    ps = layout()
    w0 = {name: torch.randn(shape, generator=gen) * 0.5 for name, shape, *_ in ps}
    grads = [{name: torch.randn(shape, generator=gen) * 0.1 for name, shape, *_ in ps}
             for _ in range(HYPER["steps"])]
    tensors = {f"w0.{k}": v.numpy() for k, v in w0.items()}
    for t, g in enumerate(grads):
        tensors.update({f"g{t}.{k}": v.numpy() for k, v in g.items()})
    tensors.update(run(False, w0, grads))
    tensors.update(run(True, w0, grads))
    meta = {k: str(v) for k, v in {**CONFIG, **HYPER}.items()}
    write_safetensors(OUT, tensors, meta)


if __name__ == "__main__":
    main()
