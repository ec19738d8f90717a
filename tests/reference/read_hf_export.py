"""Reads a Hugging Face directory the way PyTorch users do without transformers: config.json,
then model.safetensors or model.safetensors.index.json and its shards, each tensor made with
torch.frombuffer from the safetensors layout (u64 header size, JSON header, data). Prints one
JSON object: {"config": {...}, "tensors": {name: {"dtype", "shape", "sum"}}} with each sum in
float64, for tests/io/checkpoint_export_test.cpp to compare with what it exported.

Usage: /usr/bin/python3 read_hf_export.py DIR
"""
import json
import os
import struct
import sys

import torch

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


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
        t = torch.frombuffer(bytearray(data[base + begin:base + end]), dtype=DTYPES[e["dtype"]])
        t = t.reshape(e["shape"])
        out[name] = {"dtype": e["dtype"], "shape": list(t.shape),
                     "sum": float(t.double().sum())}


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
