#!/usr/bin/env python3
"""Writes tests/reference/nf4_fixture.json: bitsandbytes' NF4 quantization with double
quantization (QLoRA's storage of frozen base weights), computed here from its published
definition, which tests/kernels/nf4_fixture_test.cpp compares memfit's kernels against.

Run by hand, not by CI (the fixture is committed):
    /usr/bin/python3 tests/reference/make_nf4_fixture.py
It needs Debian's python3-torch and python3-numpy; there is no bitsandbytes here, so its
algorithm is written out below from its source (bitsandbytes/functional.py: create_normal_map,
create_dynamic_map, quantize_4bit with compress_statistics=True; csrc/kernels.cu:
kQuantizeBlockwise's NF4 case, dQuantizeNF4, kDequantizeBlockwise):

  - the 16-value code book is create_normal_map(offset=0.9677083, use_extra_value=True), built
    here (norm.ppf as torch.special.ndtri in float64) and checked against the published table;
  - a tensor is flattened, cut into blocks of 64 (the last one may be partial); absmax is the
    largest |x| of a block (f32), each x is scaled by the reciprocal 1/absmax (f32, as the CUDA
    kernel does: x * (1/absmax), not x / absmax), and its code is dQuantizeNF4's decision tree,
    which is the count of the 15 tree thresholds below x (a NaN, from 0 * (1/0) in an all-zero
    block, passes none: code 0);
  - codes are packed two a byte, the first element in the high nibble (`<< 4`); an odd element
    count leaves a last low nibble of the code of a zero (the kernel pads its load with 0);
  - double quantization: offset = mean(absmax), the centred absmax - offset (f32) quantized
    blockwise in blocks of 256 (partial last block) with the signed dynamic map
    (create_dynamic_map(signed=True)): one f32 scale (the block's max |c|) per 256-block and a
    byte per 64-block, the byte the nearest map entry to c * (1/scale);
  - dequantization: absmax' = map[q] * scale + offset (two f32 roundings, no fused multiply-add:
    kDequantizeBlockwise, then a separate torch add), W = nf4[code] * absmax' (f32), rounded to
    nearest even for a bf16 output.

Two places where "bitsandbytes' value" is not one number, and what memfit (and this script) take:
  - the offset is torch's f32 mean on the GPU, whose summation order is the GPU's; here (and in
    memfit) the mean is a float64 sum in block order, divided, and rounded once to f32;
  - create_dynamic_map's entries come from torch.linspace in f32, whose last bit depends on the
    torch build's vector width; memfit builds the same entries in exact arithmetic, rounded once
    (kernels/cpu/blockwise_quant.cpp). The fixture carries both maps ("dynamic_map_torch",
    "dynamic_map_exact"; they differ by at most one ulp) and quantizes with the exact one.
Ties (a value exactly between two entries) are measure-zero events; the inputs below have none.

Input values are integers times powers of two (exact in f32 and reproducible in C++: the test
regenerates them with the same integer hash); outputs are f32 / bf16 bit patterns, and for the
larger cases an FNV-1a 64-bit hash of the little-endian bytes instead of every value.
"""
import json
import os
from decimal import Decimal
from fractions import Fraction

import numpy as np
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nf4_fixture.json")
BLOCK, BLOCK2 = 64, 256
M32 = 0xFFFFFFFF

# bitsandbytes' published NF4 table (csrc/kernels.cu nf4_dequantization_lut, QLoRA appendix E)
PUBLISHED_NF4 = [
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0]
# dQuantizeNF4's decision thresholds (csrc/kernels.cu: float literals), ascending: x > t_i
# moves past entry i. Kept as text: they are parsed as the CUDA compiler parses them.
TREE_THRESHOLDS = [
    "-0.8480964004993439", "-0.6106329262256622", "-0.4599952697753906", "-0.33967943489551544",
    "-0.23460740596055984", "-0.13791173323988914", "-0.045525018125772476", "0.03979014977812767",
    "0.1202552504837513", "0.2035212516784668", "0.2920137718319893", "0.3893125355243683",
    "0.5016634166240692", "0.6427869200706482", "0.8614784181118011"]


def f32_literal(text):
    """The float32 nearest to the decimal `text`, as a C/CUDA `f` literal is parsed (numpy goes
    through float64 first, which rounds twice: wrong where the double lies on a float32 tie)."""
    exact = Fraction(Decimal(text))
    d = np.float32(float(text))
    candidates = [np.nextafter(d, np.float32(-np.inf)), d, np.nextafter(d, np.float32(np.inf))]
    dist = [abs(Fraction(float(c)) - exact) for c in candidates]
    best = min(dist)
    ties = [c for c, x in zip(candidates, dist) if x == best]
    if len(ties) > 1:  # to even
        ties = [c for c in ties if int(np.array(c, dtype=np.float32).view(np.uint32)) % 2 == 0]
    return ties[0]


def create_normal_map(offset=0.9677083):
    """bitsandbytes' create_normal_map(offset, use_extra_value=True), scipy's norm.ppf as
    torch.special.ndtri in float64."""
    def ppf(p):
        return torch.special.ndtri(p.double())
    v1 = ppf(torch.linspace(offset, 0.5, 9)[:-1]).tolist()
    v3 = (-ppf(torch.linspace(offset, 0.5, 8)[:-1])).tolist()
    values = torch.Tensor(v1 + [0] * (256 - 15) + v3).sort().values
    values /= values.max()
    return sorted(set(values.tolist()))


def create_dynamic_map_torch(signed=True, max_exponent_bits=7, total_bits=8):
    """bitsandbytes' create_dynamic_map, as written (torch f32 arithmetic)."""
    data = []
    non_sign_bits = total_bits - 1
    for i in range(max_exponent_bits):
        items = int(2 ** (i + non_sign_bits - max_exponent_bits) + 1 if signed
                    else 2 ** (i + non_sign_bits - max_exponent_bits + 1) + 1)
        boundaries = torch.linspace(0.1, 1, items)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
        if signed:
            data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    data.append(0)
    data.append(1.0)
    data.sort()
    return np.array(data, dtype=np.float32)


def create_dynamic_map_exact():
    """The same entries in exact (float64) arithmetic, rounded once: memfit's make_dynamic_map."""
    data = []
    for i in range(7):
        pieces, scale = 1 << i, 10.0 ** (i - 6)
        for k in range(pieces):
            lo, hi = 0.1 + 0.9 * k / pieces, 0.1 + 0.9 * (k + 1) / pieces
            mid = scale * (lo + hi) / 2.0
            data += [mid, -mid]
    data += [0.0, 1.0]
    return np.array(sorted(data), dtype=np.float32)


def hash32(x):
    """lowbias32, the integer mix the C++ test uses to regenerate the inputs."""
    x &= M32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    x ^= x >> 16
    return x


def generated(rows, cols, seed):
    """Element i of row r: (sum of four 12-bit hashes - 8190), times 16 for about one element in
    61 (outliers), times 2^-(13 + r % 4) (rows of different scales). Exact in f32."""
    n = rows * cols
    out = np.empty(n, dtype=np.float32)
    for i in range(n):
        s = sum(hash32(seed * 0x9E3779B9 + 4 * i + k) >> 20 for k in range(4)) - 8190
        if hash32(seed + 77777 + i) % 61 == 0:
            s *= 16
        out[i] = np.float32(s) * np.float32(2.0 ** -(13 + (i // cols) % 4))
    return out


def nearest(y, code):
    """Index of the map entry nearest to y (NaN: 0)."""
    if np.isnan(y):
        return 0
    return int(np.argmin(np.abs(code.astype(np.float64) - np.float64(y))))


def quantize_nf4(x, nf4_thresholds, dyn_map):
    n = x.size
    nblocks = (n + BLOCK - 1) // BLOCK
    padded = np.zeros(nblocks * BLOCK, dtype=np.float32)
    padded[:n] = x
    blocks = padded.reshape(nblocks, BLOCK)
    absmax = np.abs(blocks).max(axis=1).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = (np.float32(1.0) / absmax).astype(np.float32)
        scaled = (blocks * inv[:, None]).astype(np.float32).reshape(-1)
    codes = np.zeros(scaled.size, dtype=np.uint8)
    for t in nf4_thresholds:
        codes += (scaled > t).astype(np.uint8)  # NaN > t is False
    nbytes = (n + 1) // 2
    codes = codes[: 2 * nbytes]
    packed = ((codes[0::2] << 4) | codes[1::2]).astype(np.uint8)

    total = 0.0  # float64, in block order (memfit's definition; numpy's mean adds pairwise)
    for v in absmax:
        total += float(v)
    offset = np.float32(total / nblocks)
    centred = (absmax - offset).astype(np.float32)
    nb2 = (nblocks + BLOCK2 - 1) // BLOCK2
    scales = np.zeros(nb2, dtype=np.float32)
    qabsmax = np.zeros(nblocks, dtype=np.uint8)
    for b in range(nb2):
        part = centred[b * BLOCK2:(b + 1) * BLOCK2]
        scales[b] = np.abs(part).max()
        with np.errstate(divide="ignore", invalid="ignore"):
            inv2 = np.float32(1.0) / scales[b]
            ys = (part * inv2).astype(np.float32)
        for j, y in enumerate(ys):
            qabsmax[b * BLOCK2 + j] = nearest(y, dyn_map)
    return dict(absmax=absmax, codes=packed, offset=offset, scales=scales, qabsmax=qabsmax)


def dequantize_nf4(q, n, nf4, dyn_map):
    nblocks = q["qabsmax"].size
    absmax = np.empty(nblocks, dtype=np.float32)
    for b in range(nblocks):
        prod = np.float32(dyn_map[q["qabsmax"][b]] * q["scales"][b // BLOCK2])
        absmax[b] = np.float32(prod + q["offset"])
    codes = np.empty(2 * q["codes"].size, dtype=np.uint8)
    codes[0::2] = q["codes"] >> 4
    codes[1::2] = q["codes"] & 0xF
    codes = codes[:n]
    w = (nf4[codes] * absmax[np.arange(n) // BLOCK]).astype(np.float32)
    bf16 = torch.from_numpy(w.copy()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    return absmax, w, bf16


def bits(a):
    return [int(v) for v in np.asarray(a, dtype=np.float32).view(np.uint32)]


def fnv1a64(a):
    h = 0xCBF29CE484222325
    for byte in np.ascontiguousarray(a).tobytes():
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def main():
    nf4_built = create_normal_map()
    assert len(nf4_built) == 16
    nf4 = np.array(PUBLISHED_NF4, dtype=np.float32)
    assert np.array_equal(np.array(nf4_built, dtype=np.float32), nf4), "published table"
    thresholds = np.array([f32_literal(t) for t in TREE_THRESHOLDS], dtype=np.float32)
    # The literals are the float64 midpoints of neighbouring values, printed shortest; as float32
    # they are within an ulp of the midpoint (4 of 15 one ulp off its tie-to-even rounding).
    mid = ((nf4[:-1].astype(np.float64) + nf4[1:].astype(np.float64)) / 2).astype(np.float32)
    off = np.abs(mid.view(np.int32).astype(np.int64) - thresholds.view(np.int32))
    assert off.max() <= 1, "tree thresholds are the midpoints"
    print("thresholds an ulp from the rounded midpoint:", int((off > 0).sum()))
    dyn_torch, dyn_exact = create_dynamic_map_torch(), create_dynamic_map_exact()
    ulps = np.abs(dyn_torch.view(np.int32).astype(np.int64) - dyn_exact.view(np.int32))
    assert ulps.max() <= 1

    known = {
        # The code book itself at absmax 2: codes 0..15 in order, four times, dequantized exactly.
        "codebook_x2": (1, 64, np.tile(nf4 * np.float32(2.0), 4)),
        # An even ramp (2i - 63) / 64 over one block.
        "ramp": (1, 64, np.array([(2 * i - 63) / 64.0 for i in range(64)], dtype=np.float32)),
        # Zero blocks after a full one, odd length (a one-element tail block): 1/0 = inf,
        # 0 * inf = NaN, code 0 (-1.0 * 0), the padding nibble included.
        "zero_blocks_odd": (1, 64 + 65, np.concatenate([
            np.array([(i % 7 - 3) * 0.25 for i in range(64)], dtype=np.float32),
            np.zeros(65, dtype=np.float32)])),
    }
    shapes = [("g1x64", 1, 64, 1), ("g3x64", 3, 64, 2), ("g5x37", 5, 37, 3), ("g2x100", 2, 100, 4),
              ("g300x64", 300, 64, 5), ("g17x1000", 17, 1000, 6), ("g7x4099", 7, 4099, 7)]
    cases = []
    for name, (rows, cols, x) in known.items():
        cases.append(dict(name=name, rows=rows, cols=cols, x=x, input=bits(x)))
    for name, rows, cols, seed in shapes:
        cases.append(dict(name=name, rows=rows, cols=cols, x=generated(rows, cols, seed),
                          seed=seed))
    out_cases = []
    for c in cases:
        x, n = c.pop("x"), c["rows"] * c["cols"]
        q = quantize_nf4(x, thresholds, dyn_exact)
        absmax_dq, w, wbf = dequantize_nf4(q, n, nf4, dyn_exact)
        full = n <= 512
        c.update(
            codes=q["codes"].tobytes().hex() if full else fnv1a64(q["codes"]),
            absmax=bits(q["absmax"]), offset=bits([q["offset"]])[0],
            qabsmax=q["qabsmax"].tobytes().hex(), scales=bits(q["scales"]),
            absmax_dequantized=bits(absmax_dq))
        if full:
            c.update(dequant_f32=bits(w), dequant_bf16=[int(v) for v in wbf])
        else:
            c.update(dequant_f32_fnv=fnv1a64(w), dequant_bf16_fnv=fnv1a64(wbf))
        rel = np.abs(w - x).max() / max(np.abs(x).max(), 1e-30)
        print(f"{c['name']:14s} n={n:6d} blocks={q['qabsmax'].size:4d} "
              f"scale_blocks={q['scales'].size} max|w-x|/max|x|={rel:.4f}")
        out_cases.append(c)
    fixture = dict(
        nf4_values=bits(nf4), nf4_thresholds=bits(thresholds),
        dynamic_map_torch=bits(dyn_torch), dynamic_map_exact=bits(dyn_exact),
        dynamic_map_entries_differing=int((ulps > 0).sum()), cases=out_cases)
    with open(OUT, "w") as f:
        json.dump(fixture, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", OUT, os.path.getsize(OUT), "bytes")


if __name__ == "__main__":
    main()
