#!/usr/bin/env python3
"""Writes tests/reference/optim_fixture.safetensors: three optimizer steps computed by PyTorch
on the parameters of a tiny GPT-2 layout, for two optimizers with less state than AdamW's, which
tests/optim/optim_reference_test.cpp compares memfit against:

- AdamW with bf16 moments (--optim-state-dtype bf16): torch.optim.AdamW in float32, each moment
  rounded to bf16 (nearest even) after every step, as torchtitan-style bf16 state keeps them.
- adamw4bit ("Memory Efficient Optimizers with 4-bit States", Li, Chen, Zhu, NeurIPS 2023): the
  first moment block-wise (128 values an absmax) on the signed dynamic-exponent map at 4 bits,
  the second moment rank-1 normalised (element (i, j) by min(row max i, column max j); block-wise
  for 1-D tensors) on the zero-free linear map; tensors under 4096 values keep FP32 moments.
  Written from the paper and its reference code (thu-ml/low-bit-optimizers: create_dynamic_map,
  create_pow_map, the rank-1 scale) in float32 torch operations that mirror memfit's kernel
  operation by operation (its fused multiply-adds as one rounding of the double result), so the
  4-bit codes are expected to match bit for bit.

Run by hand, not by CI (the fixture is committed):
    /usr/bin/python3 tests/reference/make_optim_fixture.py
It needs Debian's python3-torch and python3-numpy. Parameter names, shapes and order follow
memfit's ParamLayout for GPT-2 (linear weights (out, in); wte padded to 128 rows).
"""
import json
import os
import struct

import numpy as np
import torch

CONFIG = dict(n_layer=1, n_head=2, d_model=32, max_seq_len=16, vocab_size=100)
HYPER = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, steps=3,
             grad_scale=0.5)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "optim_fixture.safetensors")
BLOCK = 128            # values per absmax block (both moments' block-wise parts)
MIN_QUANTIZED = 4096   # smaller tensors keep FP32 moments


def shapes():
    C, V = CONFIG["d_model"], (CONFIG["vocab_size"] + 63) // 64 * 64
    out = [("wte.weight", (V, C)), ("wpe.weight", (CONFIG["max_seq_len"], C))]
    for l in range(CONFIG["n_layer"]):
        h = f"h.{l}."
        out += [(h + "ln_1.weight", (C,)), (h + "ln_1.bias", (C,)),
                (h + "attn.c_attn.weight", (3 * C, C)), (h + "attn.c_attn.bias", (3 * C,)),
                (h + "attn.c_proj.weight", (C, C)), (h + "attn.c_proj.bias", (C,)),
                (h + "ln_2.weight", (C,)), (h + "ln_2.bias", (C,)),
                (h + "mlp.c_fc.weight", (4 * C, C)), (h + "mlp.c_fc.bias", (4 * C,)),
                (h + "mlp.c_proj.weight", (C, 4 * C)), (h + "mlp.c_proj.bias", (C,))]
    return out + [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]


def f32(x):
    return x.to(torch.float32)


def fma(a, b, c):
    # a * b + c rounded once (a * b of two floats is exact in double).
    return f32(a.double() * b.double() + c.double())


# ---- the 4-bit maps -------------------------------------------------------------------------
def create_dynamic_map(signed, max_exponent_bits, total_bits):
    # The paper's dynamic-exponent map (its code's create_dynamic_map), in float32 torch ops.
    data = []
    non_sign_bits = total_bits - (1 if signed else 0)
    for i in range(max_exponent_bits):
        items = 2 ** (i + non_sign_bits - max_exponent_bits) + 1 if signed else \
            2 ** (i + non_sign_bits - max_exponent_bits + 1) + 1
        boundaries = torch.linspace(0.1, 1, items)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
        if signed:
            data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    data += [0.0, 1.0]
    data.sort()
    return torch.tensor(data, dtype=torch.float32)


SIGNED_MAP = create_dynamic_map(True, 3, 4)           # first moment: DE, signed, 4 bits
UNSIGNED_MAP = torch.linspace(0, 1, 17)[1:].float()   # second moment: linear without 0


def thresholds(qmap):
    # Midpoints of neighbours, in double, rounded to float once.
    v = qmap.double()
    return f32((v[:-1] + v[1:]) / 2.0)


def nearest(x, qmap):
    # The code of the nearest entry: the thresholds below x (a tie goes to the lower entry;
    # NaN compares false everywhere and gets code 0).
    th = thresholds(qmap)
    return (x.unsqueeze(-1) > th).sum(-1).to(torch.int32)


def blocks(x):
    n = x.numel()
    pad = (-n) % BLOCK
    return torch.cat([x.flatten(), torch.zeros(pad)]).view(-1, BLOCK), n


def quantize_blockwise(x, qmap):
    xb, n = blocks(x)
    absmax = xb.abs().amax(1)
    inv = torch.where(absmax > 0, f32(1.0 / absmax.double()), torch.zeros_like(absmax))
    codes = nearest(f32(xb * inv.unsqueeze(1)), qmap).flatten()[:n]
    return codes, absmax


def dequantize_blockwise(codes, absmax, qmap, n):
    scale = absmax.repeat_interleave(BLOCK)[:n]
    return f32(qmap[codes.long()] * scale)


def rank1_scale(rows, cols):
    return torch.minimum(rows.unsqueeze(1), cols.unsqueeze(0))


def quantize_rank1(v):
    rows, cols = v.amax(1), v.amax(0)
    s = rank1_scale(rows, cols)
    xs = torch.where(s > 0, f32(v.double() / s.double()), torch.zeros_like(v))
    return nearest(xs, UNSIGNED_MAP).flatten(), rows, cols


def dequantize_rank1(codes, rows, cols, shape):
    return f32(UNSIGNED_MAP[codes.long()].view(shape) * rank1_scale(rows, cols))


class AdamW4bit:
    """One tensor's 4-bit AdamW, with the arithmetic of memfit's kernel (bitsandbytes' order)."""

    def __init__(self, shape):
        self.shape, self.n = shape, int(np.prod(shape))
        self.quantized = self.n >= MIN_QUANTIZED
        self.rank1 = self.quantized and len(shape) == 2
        z = torch.zeros(self.n)
        if not self.quantized:
            self.m, self.v = z.clone(), z.clone()
            return
        nb = (self.n + BLOCK - 1) // BLOCK
        self.m_codes, self.m_absmax = torch.zeros(self.n, dtype=torch.int32), torch.zeros(nb)
        self.v_codes = torch.zeros(self.n, dtype=torch.int32)
        if self.rank1:
            self.v_rows, self.v_cols = torch.zeros(shape[0]), torch.zeros(shape[1])
        else:
            self.v_absmax = torch.zeros(nb)

    def step(self, p, g, t, decay_on):
        h = HYPER
        lr, b1, b2 = (torch.tensor(h[k], dtype=torch.float32) for k in ("lr", "beta1", "beta2"))
        eps = torch.tensor(h["eps"], dtype=torch.float32)
        wd = torch.tensor(h["weight_decay"] if decay_on else 0.0, dtype=torch.float32)
        one = torch.tensor(1.0, dtype=torch.float32)
        # The step's scalars as memfit's make_coeffs forms them.
        bc1 = 1.0 - float(b1.double()) ** t
        bc2 = 1.0 - float(b2.double()) ** t
        step = torch.tensor(float(lr.double()) / bc1, dtype=torch.float32)
        isb2 = torch.tensor(1.0 / np.sqrt(bc2), dtype=torch.float32)
        decay = f32(one - f32(lr * wd))
        omb1, omb2 = f32(one - b1), f32(one - b2)
        scale = torch.tensor(h["grad_scale"], dtype=torch.float32)

        p, g = p.flatten(), g.flatten()
        if self.quantized:
            m = dequantize_blockwise(self.m_codes, self.m_absmax, SIGNED_MAP, self.n)
            if self.rank1:
                v = dequantize_rank1(self.v_codes, self.v_rows, self.v_cols, self.shape).flatten()
            else:
                v = dequantize_blockwise(self.v_codes, self.v_absmax, UNSIGNED_MAP, self.n)
        else:
            m, v = self.m, self.v
        gi = f32(g * scale)
        mi = fma(b1, m, f32(omb1 * gi))
        vi = fma(b2, v, f32(omb2 * f32(gi * gi)))
        denom = fma(f32(torch.sqrt(vi.double())), isb2, eps)
        q = f32(mi.double() / denom.double())
        p_new = f32(f32(p * decay).double() - step.double() * q.double())
        if self.quantized:
            self.m_codes, self.m_absmax = quantize_blockwise(mi, SIGNED_MAP)
            if self.rank1:
                self.v_codes, self.v_rows, self.v_cols = quantize_rank1(vi.view(self.shape))
            else:
                self.v_codes, self.v_absmax = quantize_blockwise(vi, UNSIGNED_MAP)
        else:
            self.m, self.v = mi, vi
        return p_new.view(self.shape)


def write_safetensors(path, tensors, metadata):
    header, offset, blobs = {"__metadata__": metadata}, 0, []
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        dtype = {np.float32: "F32", np.int32: "I32", np.uint8: "U8"}[arr.dtype.type]
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
    gen = torch.Generator().manual_seed(20261129)
    h = HYPER
    params = {}
    for name, shape in shapes():
        params[name] = torch.randn(shape, generator=gen) * 0.5
    # Gradients whose rows and columns differ in scale, so that rank-1 normalisation matters.
    grads = []
    for t in range(h["steps"]):
        step_grads = {}
        for name, shape in shapes():
            g = torch.randn(shape, generator=gen) * 0.1
            if len(shape) == 2:
                g *= torch.exp(torch.randn(shape[0], 1, generator=gen))
                g *= torch.exp(torch.randn(1, shape[1], generator=gen))
            step_grads[name] = g
        grads.append(step_grads)

    out = {"signed_map": SIGNED_MAP.numpy(), "unsigned_map": UNSIGNED_MAP.numpy()}
    for name, p in params.items():
        out["param." + name] = p.numpy()
    for t, step_grads in enumerate(grads, 1):
        for name, g in step_grads.items():
            out[f"grad{t}.{name}"] = g.numpy()

    # AdamW with bf16 moments: torch.optim.AdamW, the moments rounded after every step.
    ps = {k: v.clone().requires_grad_() for k, v in params.items()}
    decay = [v for v in ps.values() if v.dim() == 2]
    no_decay = [v for v in ps.values() if v.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": h["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=h["lr"], betas=(h["beta1"], h["beta2"]), eps=h["eps"],
                            foreach=False)
    for step_grads in grads:
        for k, p in ps.items():
            p.grad = step_grads[k] * h["grad_scale"]
        opt.step()
        for p in ps.values():
            st = opt.state[p]
            for key in ("exp_avg", "exp_avg_sq"):
                st[key].copy_(st[key].bfloat16().float())
    for k, p in ps.items():
        out["bf16.after." + k] = p.detach().numpy()
        out["bf16.m." + k] = opt.state[p]["exp_avg"].numpy()
        out["bf16.v." + k] = opt.state[p]["exp_avg_sq"].numpy()

    # adamw4bit.
    states = {k: AdamW4bit(tuple(v.shape)) for k, v in params.items()}
    ps = {k: v.clone() for k, v in params.items()}
    for t, step_grads in enumerate(grads, 1):
        for k in ps:
            ps[k] = states[k].step(ps[k], step_grads[k], t, ps[k].dim() == 2)
    for k, p in ps.items():
        out["4bit.after." + k] = p.numpy()
        s = states[k]
        if not s.quantized:
            out["4bit.m." + k] = s.m.numpy()
            out["4bit.v." + k] = s.v.numpy()
            continue
        out["4bit.m_codes." + k] = s.m_codes.numpy().astype(np.uint8)
        out["4bit.m_absmax." + k] = s.m_absmax.numpy()
        out["4bit.v_codes." + k] = s.v_codes.numpy().astype(np.uint8)
        if s.rank1:
            out["4bit.v_rows." + k] = s.v_rows.numpy()
            out["4bit.v_cols." + k] = s.v_cols.numpy()
        else:
            out["4bit.v_absmax." + k] = s.v_absmax.numpy()

    meta = {k: str(v) for k, v in {**CONFIG, **HYPER}.items()}
    meta["torch"] = torch.__version__
    write_safetensors(OUT, out, meta)
    print(f"wrote {OUT}: {len(out)} tensors")


if __name__ == "__main__":
    main()
