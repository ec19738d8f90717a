#!/usr/bin/env python3
"""Writes tests/reference/llama_fixture.safetensors: a tiny LLaMA (grouped-query attention, an
untied head) computed by PyTorch in float64 (weights, one batch, logits, loss, every gradient,
and the parameters after 3 AdamW steps with weight decay on 2-D weights), which
tests/model/llama_reference_test.cpp compares memfit against.

Run by hand, not by CI (the fixture is committed):
    /usr/bin/python3 tests/reference/make_llama_fixture.py
It needs Debian's python3-torch and python3-numpy, not transformers: the model is written out
in full, operation by operation as Hugging Face's LlamaForCausalLM (modeling_llama.py) does it
(RMSNorm, rotate-half RoPE, repeat_kv, causal attention, SwiGLU MLP, untied lm_head), so the
reference depends on nothing of memfit's. Parameter names are Hugging Face's, as memfit's
ParamLayout; linear weights are (out, in); embed_tokens and lm_head are padded to a multiple of
64 rows with zero rows, which the model never reads (logits over the real vocabulary only).
The only departure from transformers: the rotary frequencies and angles are formed in float64
here (transformers forms them in float32), the difference is ~1e-7 relative.
"""
import json
import math
import os
import struct

import numpy as np
import torch
import torch.nn.functional as F

CONFIG = dict(n_layer=2, n_head=4, n_kv_head=2, d_model=32, ffn_dim=48, max_seq_len=16,
              vocab_size=100, rope_theta=10000.0, norm_eps=1e-5)
B, T = 2, 12
# The GPT-2 fixture's AdamW (make_gpt2_fixture.py), decay on 2-D tensors as ParamInfo::decay.
ADAMW = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, steps=3)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llama_fixture.safetensors")


def padded_vocab(v):
    return (v + 63) // 64 * 64


def make_params(gen):
    c = CONFIG
    C, L, V, Vp = c["d_model"], c["n_layer"], c["vocab_size"], padded_vocab(c["vocab_size"])
    hs = C // c["n_head"]
    NQ, NKV, Fd = c["n_head"] * hs, c["n_kv_head"] * hs, c["ffn_dim"]
    p = {}

    def normal(*shape, std=0.02):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * std

    def padded(std):
        w = torch.zeros(Vp, C, dtype=torch.float64)
        w[:V] = normal(V, C, std=std)
        return w

    p["model.embed_tokens.weight"] = padded(0.02)
    for l in range(L):
        h = f"model.layers.{l}."
        # Norm gains are random, so that every parameter's gradient is exercised; the projections
        # are wider than LLaMA's init (0.02), so that the attention is far from uniform and the
        # rotation matters to the scores.
        p[h + "input_layernorm.weight"] = 1 + normal(C, std=0.1)
        p[h + "self_attn.q_proj.weight"] = normal(NQ, C, std=0.1)
        p[h + "self_attn.k_proj.weight"] = normal(NKV, C, std=0.1)
        p[h + "self_attn.v_proj.weight"] = normal(NKV, C, std=0.1)
        p[h + "self_attn.o_proj.weight"] = normal(C, NQ, std=0.1)
        p[h + "post_attention_layernorm.weight"] = 1 + normal(C, std=0.1)
        p[h + "mlp.gate_proj.weight"] = normal(Fd, C, std=0.1)
        p[h + "mlp.up_proj.weight"] = normal(Fd, C, std=0.1)
        p[h + "mlp.down_proj.weight"] = normal(C, Fd, std=0.1)
    p["model.norm.weight"] = 1 + normal(C, std=0.1)
    p["lm_head.weight"] = padded(0.1)
    return p


def rms_norm(x, w, eps):  # LlamaRMSNorm
    variance = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(variance + eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rotary_cos_sin(hs, Tn, theta):  # LlamaRotaryEmbedding, default rope_type, in float64
    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.int64).double() / hs))
    positions = torch.arange(Tn, dtype=torch.float64)
    freqs = torch.outer(positions, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()  # (T, hs), broadcast over batch and heads


def repeat_kv(x, n_rep):  # (B, KV, T, hs) -> (B, KV n_rep, T, hs): query head h reads h // n_rep
    Bn, KV, Tn, hs = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(Bn, KV, n_rep, Tn, hs).reshape(Bn, KV * n_rep, Tn, hs)


def forward(p, tokens):
    c = CONFIG
    C, NH, KV, V, eps = c["d_model"], c["n_head"], c["n_kv_head"], c["vocab_size"], c["norm_eps"]
    hs = C // NH
    Bn, Tn = tokens.shape
    cos, sin = rotary_cos_sin(hs, Tn, c["rope_theta"])
    mask = torch.ones(Tn, Tn, dtype=torch.bool).tril()
    x = p["model.embed_tokens.weight"][tokens]
    for l in range(c["n_layer"]):
        h = f"model.layers.{l}."
        a = rms_norm(x, p[h + "input_layernorm.weight"], eps)
        q = F.linear(a, p[h + "self_attn.q_proj.weight"]).view(Bn, Tn, NH, hs).transpose(1, 2)
        k = F.linear(a, p[h + "self_attn.k_proj.weight"]).view(Bn, Tn, KV, hs).transpose(1, 2)
        v = F.linear(a, p[h + "self_attn.v_proj.weight"]).view(Bn, Tn, KV, hs).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin  # apply_rotary_pos_emb
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, NH // KV), repeat_kv(v, NH // KV)
        # scaled_dot_product_attention(is_causal=True), scale 1/sqrt(hs), written out (torch 1.13)
        s = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        s = s.masked_fill(~mask, float("-inf"))
        y = (s.softmax(-1) @ v).transpose(1, 2).reshape(Bn, Tn, NH * hs)
        x = x + F.linear(y, p[h + "self_attn.o_proj.weight"])
        m = rms_norm(x, p[h + "post_attention_layernorm.weight"], eps)
        m = F.silu(F.linear(m, p[h + "mlp.gate_proj.weight"])) * F.linear(m, p[h + "mlp.up_proj.weight"])
        x = x + F.linear(m, p[h + "mlp.down_proj.weight"])
    x = rms_norm(x, p["model.norm.weight"], eps)
    return x @ p["lm_head.weight"][:V].T  # untied head over the real vocabulary only


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
    gen = torch.Generator().manual_seed(20240521)
    # Rounded to float32 first: memfit starts from the stored float32 weights, so the float64
    # model must too.
    params = {k: v.float().double().requires_grad_() for k, v in make_params(gen).items()}
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
    meta["family"] = "llama"
    meta["tie_embeddings"] = "0"
    meta["torch"] = torch.__version__
    write_safetensors(OUT, out, meta)
    print(f"wrote {OUT}: losses {', '.join(f'{l:.6f}' for l in losses)}, {len(out)} tensors")


if __name__ == "__main__":
    torch.set_default_dtype(torch.float64)
    main()
