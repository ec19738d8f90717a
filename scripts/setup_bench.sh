#!/usr/bin/env bash
# What the benchmarks need beyond scripts/setup.sh: Debian's PyTorch (the baseline and gradient
# reference) with OpenBLAS. Without libopenblas0-pthread, Debian's torch falls back to the
# reference BLAS and runs about 10x slower: we compare against PyTorch at its best.
set -euo pipefail
missing=()
for p in python3-torch python3-numpy libopenblas0-pthread; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
