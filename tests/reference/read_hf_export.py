"""Reads a Hugging Face directory the way a loader without transformers does: config.json, then
model.safetensors or model.safetensors.index.json and its shards, each tensor decoded from the
safetensors layout (u64 header size, JSON header, data) by Python's standard library alone, so
the check needs no package CI would have to install (it used torch.frombuffer, and skipped on
every machine without PyTorch). It is independent of memfit's C++ reader: the same bytes, read
by other code. Prints one JSON object: {"config": {...}, "tensors": {name: {"dtype", "shape",
"sum"}}} with each sum in float64, for tests/io/checkpoint_export_test.cpp to compare with what
it exported.

Usage: python3 read_hf_export.py DIR
"""
import json
import math
import os
import struct
import sys

# Bytes per element and a decoder of little-endian raw bytes to Python floats.
DTYPES = {
    "F32": (4, lambda b: struct.unpack(f"<{len(b) // 4}f", b)),
    "F16": (2, lambda b: struct.unpack(f"<{len(b) // 2}e", b)),
    # bf16 is the top half of an f32: widen each by 16 zero bits.
    "BF16": (2, lambda b: struct.unpack(
        f"<{len(b) // 2}f",
        struct.pack(f"<{len(b) // 2}I", *(h << 16 for h in struct.unpack(f"<{len(b) // 2}H", b))))),
}


def read_file(path, out):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    for name, e in header.items():
        if name == "__metadata__":
            assert e.get("format") == "pt", e
            continue
        begin, end = e["data_offsets"]
        size, decode = DTYPES[e["dtype"]]
        assert end - begin == size * math.prod(e["shape"]), (name, e)
        values = decode(data[base + begin:base + end])
        out[name] = {"dtype": e["dtype"], "shape": list(e["shape"]), "sum": math.fsum(values)}


def main(d):
    config = json.load(open(os.path.join(d, "config.json")))
    tensors = {}
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(os.path.join(d, "model.safetensors")):
        read_file(os.path.join(d, "model.safetensors"), tensors)
    else:
        weight_map = json.load(open(index))["weight_map"]
        for f in sorted(set(weight_map.values())):
            read_file(os.path.join(d, f), tensors)
        assert sorted(weight_map) == sorted(tensors), "the index lists other tensors"
    print(json.dumps({"config": config, "tensors": tensors}))


if __name__ == "__main__":
    main(sys.argv[1])
