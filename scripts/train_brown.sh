#!/usr/bin/env bash
# The main job: prepare the Brown corpus with GPT-2's tokenizer, then train a 6-layer, 384-wide
# GPT-2 on it for about five minutes on two cores (configs/brown-6x384.toml) under a 630 MiB
# budget: the planner chooses how to fit it (printed at start), a memory profile of the first
# two steps compares the plan with what the pool measured, and the end prints the peak against
# the plan, the validation loss, the two pages to open and a sample of the model's text.
# Expects scripts/setup.sh to have built build/memfit. Extra arguments go to `memfit train`
# (e.g. --steps 100 for a shorter run).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f data/brown/train_000000.bin ] || ./build/memfit prepare --input brown --out data/brown
./build/memfit train --config configs/brown-6x384.toml "$@"
echo
./build/memfit sample --checkpoint out/brown --prompt "It was the first time that" --tokens 60 \
  --temperature 0.8 --top-k 40 --seed 7
echo
echo "main job: open these in a browser (offline pages, nothing fetched):"
echo "  out/brown-profile/memory.html   memory over the first two steps, planned against measured"
echo "  out/brown.curves.html           loss, validation loss, learning rate, gradient norm,"
echo "                                  tokens/s and memory by category over the steps"
