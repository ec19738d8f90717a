#!/usr/bin/env python3
"""Writes tests/reference/lora_fixture.safetensors: LoRA on the tiny GPT-2 and LLaMA of
make_gpt2_fixture.py and make_llama_fixture.py, computed by PyTorch in float64, which
tests/model/lora_reference_test.cpp compares memfit's adapters against.

Run by hand, not by CI (the fixture is committed):
    /usr/bin/python3 tests/reference/make_lora_fixture.py
There is no PEFT here: LoRA is PEFT's Linear in a few lines, y = x W^T + b + (alpha / r)
(x A^T) B^T with A (r, in) and B (out, r), put on every linear layer of the blocks (PEFT's
"all-linear": never the LM head) by wrapping torch.nn.functional.linear, which the two family
references call for each layer. B is random here (PEFT starts it at zero, which would leave A's
gradient zero), so the adapters change the logits and every gradient is exercised. Per family:
the base weights and adapters (PEFT's module names, "<module>.lora_A.weight"), one batch, the
logits, the loss and the adapters' gradients.
"""
import os

import numpy as np
import torch
import torch.nn.functional as F

import make_gpt2_fixture as gpt2
import make_llama_fixture as llama

RANK, ALPHA = 4, 8.0
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lora_fixture.safetensors")
_linear = F.linear


def adapters_for(params, modules, gen):
    """modules: (memfit parameter name, PEFT module name, out, in) -> {id(weight): (A, B, name)}"""
    out = {}
    for pname, module, o, i in modules:
        a = ((torch.rand(RANK, i, generator=gen) * 2 - 1) / i ** 0.5).float().double()
        b = (torch.randn(o, RANK, generator=gen) * 0.1).float().double()
        out[id(params[pname])] = (a.requires_grad_(), b.requires_grad_(), module)
    return out


def run(prefix, fam, seed, modules_of, out):
    gen = torch.Generator().manual_seed(seed)
    params = {k: v.float().double() for k, v in fam.make_params(gen).items()}
    V = fam.CONFIG["vocab_size"]
    data = torch.randint(0, V, (fam.B, fam.T + 1), generator=gen)
    tokens, targets = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    adapters = adapters_for(params, modules_of(fam.CONFIG), gen)

    def lora_linear(x, w, b=None):
        y = _linear(x, w, b)
        if id(w) in adapters:
            a, bb, _ = adapters[id(w)]
            y = y + (ALPHA / RANK) * ((x @ a.T) @ bb.T)
        return y

    F.linear = lora_linear
    try:
        logits = fam.forward(params, tokens)
    finally:
        F.linear = _linear
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    loss.backward()
    out[prefix + "tokens"] = tokens.numpy().astype(np.int32)
    out[prefix + "targets"] = targets.numpy().astype(np.int32)
    out[prefix + "logits"] = logits.detach().numpy().astype(np.float32)
    out[prefix + "loss"] = np.array([loss.item()], dtype=np.float32)
    for k, v in params.items():
        out[prefix + "param." + k] = v.numpy().astype(np.float32)
    for a, b, module in adapters.values():
        for name, t in (("lora_A", a), ("lora_B", b)):
            out[f"{prefix}{module}.{name}.weight"] = t.detach().numpy().astype(np.float32)
            out[f"{prefix}grad.{module}.{name}.weight"] = t.grad.numpy().astype(np.float32)
    return loss.item()


def gpt2_modules(c):
    C = c["d_model"]
    return [m for l in range(c["n_layer"]) for m in (
        (f"h.{l}.attn.c_attn.weight", f"transformer.h.{l}.attn.c_attn", 3 * C, C),
        (f"h.{l}.attn.c_proj.weight", f"transformer.h.{l}.attn.c_proj", C, C),
        (f"h.{l}.mlp.c_fc.weight", f"transformer.h.{l}.mlp.c_fc", 4 * C, C),
        (f"h.{l}.mlp.c_proj.weight", f"transformer.h.{l}.mlp.c_proj", C, 4 * C))]


def llama_modules(c):
    C, hs, Fd = c["d_model"], c["d_model"] // c["n_head"], c["ffn_dim"]
    q, kv = c["n_head"] * hs, c["n_kv_head"] * hs
    out = []
    for l in range(c["n_layer"]):
        p = f"model.layers.{l}."
        for name, o, i in (("self_attn.q_proj", q, C), ("self_attn.k_proj", kv, C),
                           ("self_attn.v_proj", kv, C), ("self_attn.o_proj", C, q),
                           ("mlp.gate_proj", Fd, C), ("mlp.up_proj", Fd, C),
                           ("mlp.down_proj", C, Fd)):
            out.append((p + name + ".weight", p + name, o, i))
    return out


def main():
    out = {}
    l1 = run("gpt2.", gpt2, 20240620, gpt2_modules, out)
    l2 = run("llama.", llama, 20240621, llama_modules, out)
    meta = {"rank": str(RANK), "alpha": str(ALPHA), "torch": torch.__version__}
    for fam, name in ((gpt2, "gpt2"), (llama, "llama")):
        for k, v in {**fam.CONFIG, "B": fam.B, "T": fam.T}.items():
            meta[f"{name}.{k}"] = str(v)
    gpt2.write_safetensors(OUT, out, meta)
    print(f"wrote {OUT}: losses {l1:.6f} (gpt2), {l2:.6f} (llama), {len(out)} tensors")


if __name__ == "__main__":
    torch.set_default_dtype(torch.float64)
    main()
