#!/usr/bin/python3
"""Writes tests/reference/galore_fixture.safetensors: four steps of GaLore on the parameters of a
tiny GPT-2 layout (memfit's ParamLayout names, shapes and decay flags), computed by PyTorch in
float32, which tests/optim/galore_test.cpp compares memfit's Galore optimizer against (1e-5
relative in the parameters).

Run by hand, not by CI (the fixture is committed):
    /usr/bin/python3 tests/reference/make_galore_fixture.py
It needs Debian's python3-torch (1.13) and python3-numpy. The projected matrices follow the
authors' code (github.com/jiaweizzhao/GaLore, galore_torch/adamw.py and galore_projector.py,
proj_type "std", scale 0.25) line by line: torch.linalg.svd of the step's gradient in float32
every proj_gap steps (steps 1 and 3 here, so the moments of the first projector meet the
second's gradients). One change, made in memfit too: each singular vector's sign is fixed so
that its entry of largest magnitude is positive (LAPACK leaves it arbitrary, and with the
moments kept across a new projector the update depends on it). The other parameters go through
torch.optim.AdamW, as memfit steps them.
"""
import json
import math
import os
import struct

import numpy as np
import torch

CONFIG = dict(n_layer=1, n_head=2, d_model=16, max_seq_len=8, vocab_size=20)
HYPER = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, steps=4, grad_scale=0.5,
             proj_gap=2, galore_rank=4, scale=0.25)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "galore_fixture.safetensors")


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


def canonical(vectors):
    """Each row's sign fixed: its entry of largest magnitude (the first of equals) positive."""
    top = vectors.abs().argmax(dim=1)
    signs = torch.sign(vectors[torch.arange(vectors.shape[0]), top])
    return vectors * signs[:, None]


class GaLoreProjector:
    """galore_torch/galore_projector.py, proj_type "std", with canonical signs."""

    def __init__(self, rank, update_proj_gap, scale):
        self.rank, self.gap, self.scale, self.ortho = rank, update_proj_gap, scale, None

    def project(self, grad, it):
        if grad.shape[0] >= grad.shape[1]:
            if self.ortho is None or it % self.gap == 0:
                _, _, vh = torch.linalg.svd(grad, full_matrices=False)
                self.ortho = canonical(vh[:self.rank, :])                # "right": (rank, n)
            return torch.matmul(grad, self.ortho.t())
        if self.ortho is None or it % self.gap == 0:
            u, _, _ = torch.linalg.svd(grad, full_matrices=False)
            self.ortho = canonical(u[:, :self.rank].t()).t()           # "left": (m, rank)
        return torch.matmul(self.ortho.t(), grad)

    def project_back(self, low):
        if low.shape[0] >= low.shape[1]:
            return torch.matmul(low, self.ortho) * self.scale
        return torch.matmul(self.ortho, low) * self.scale


def galore_matrix_step(p, grad, state):
    """galore_torch/adamw.py's step for one parameter of the GaLore group."""
    H = HYPER
    if "step" not in state:
        state["step"] = 0
    if "projector" not in state:
        state["projector"] = GaLoreProjector(min(H["galore_rank"], *grad.shape), H["proj_gap"],
                                             H["scale"])
    grad = state["projector"].project(grad, state["step"])
    if "exp_avg" not in state:
        state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(grad), torch.zeros_like(grad)
    ea, es = state["exp_avg"], state["exp_avg_sq"]
    b1, b2 = H["beta1"], H["beta2"]
    state["step"] += 1
    ea.mul_(b1).add_(grad, alpha=1.0 - b1)
    es.mul_(b2).addcmul_(grad, grad, value=1.0 - b2)
    denom = es.sqrt().add_(H["eps"])
    step_size = H["lr"] * math.sqrt(1.0 - b2 ** state["step"]) / (1.0 - b1 ** state["step"])
    norm_grad = state["projector"].project_back(ea / denom)
    p.add_(norm_grad, alpha=-step_size)
    p.add_(p, alpha=-H["lr"] * H["weight_decay"])


def run(w0, grads):
    H = HYPER
    ps = layout()
    w = {name: w0[name].clone() for name, *_ in ps}
    plain = [(name, torch.nn.Parameter(w[name]), decay) for name, _, proj, decay in ps if not proj]
    adamw = torch.optim.AdamW(
        [{"params": [p for _, p, d in plain if d], "weight_decay": H["weight_decay"]},
         {"params": [p for _, p, d in plain if not d], "weight_decay": 0.0}],
        lr=H["lr"], betas=(H["beta1"], H["beta2"]), eps=H["eps"])
    states, out = {}, {}
    for t in range(1, H["steps"] + 1):
        for name, p, _ in plain:
            p.grad = grads[t - 1][name] * H["grad_scale"]
        adamw.step()
        for name, _, proj, _ in ps:
            if proj:
                galore_matrix_step(w[name], grads[t - 1][name] * H["grad_scale"],
                                   states.setdefault(name, {}))
        for name, p, _ in plain:
            w[name] = p.data
        for name, *_ in ps:
            out[f"galore.w{t}.{name}"] = w[name].numpy().copy()
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
    tensors.update(run(w0, grads))
    meta = {k: str(v) for k, v in {**CONFIG, **HYPER}.items()}
    write_safetensors(OUT, tensors, meta)


if __name__ == "__main__":
    main()
