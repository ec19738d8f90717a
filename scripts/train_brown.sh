#!/usr/bin/env bash
# The main job: prepare the Brown corpus with GPT-2's tokenizer, train a 6-layer, 384-wide GPT-2
# on it for a few minutes on the CPU (configs/brown-6x384.toml), then print a sample.
# Expects scripts/setup.sh to have built build/. Extra arguments go to `memfit train`.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f data/brown/train_000000.bin ] || ./build/memfit prepare --input brown --out data/brown
./build/memfit train --config configs/brown-6x384.toml "$@"
echo
./build/memfit sample --checkpoint out/brown --prompt "The jury said" --tokens 60 --seed 7
