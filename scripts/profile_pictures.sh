#!/usr/bin/env bash
# The pictures of docs/profiling.md: memory profiles of two steps of gpt2 124M at 8 x 256 tokens
# on the Brown corpus, in fp32 and bf16, with --ckpt none and --ckpt full, into out/profiles/,
# and a 1200 x 700 screenshot of each page (headless Chromium) into docs/profiling/. Memory is
# exact on a busy machine, so the pictures are too (the time axis is not). About 4 GiB of RAM a
# run; expects build/memfit, data/brown (scripts/train_brown.sh) and chromium. Then, where the
# main job has run, a screenshot of its training curves (out/brown.curves.html).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p out/profiles docs/profiling
for precision in fp32 bf16; do
  for ckpt in none full; do
    name="gpt2-$precision-ckpt-$ckpt"
    rm -rf "out/profiles/$name"
    nice -n 10 build/memfit train --model gpt2 --batch 8 --seq-len 256 --steps 2 \
      --eval-batches 1 --precision "$precision" --ckpt "$ckpt" \
      --profile "out/profiles/$name" --profile-steps 2 > "out/profiles/$name.txt"
    chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
      --disable-background-networking --disable-component-update --disable-sync \
      --user-data-dir="$(mktemp -d)" --window-size=1200,700 --virtual-time-budget=10000 \
      --screenshot="$PWD/docs/profiling/$name.png" "file://$PWD/out/profiles/$name/memory.html" \
      > /dev/null 2>&1
    echo "$name: docs/profiling/$name.png; summary in out/profiles/$name.txt"
  done
done
build/memfit profile-diff out/profiles/gpt2-fp32-ckpt-none out/profiles/gpt2-fp32-ckpt-full
# The main job's training curves (scripts/train_brown.sh writes out/brown.jsonl), 1200 x 1000.
if [ -f out/brown.jsonl ]; then
  build/memfit curves out/brown.jsonl -o out/brown.curves.html > /dev/null
  chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$(mktemp -d)" --window-size=1200,1000 --virtual-time-budget=10000 \
    --screenshot="$PWD/docs/profiling/curves-brown.png" "file://$PWD/out/brown.curves.html" \
    > /dev/null 2>&1
  echo "curves of the main job: docs/profiling/curves-brown.png"
fi
