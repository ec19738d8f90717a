#!/usr/bin/env bash
# What the benchmarks need beyond scripts/setup.sh: Debian's PyTorch (the baseline and gradient
# reference) with OpenBLAS. Without libopenblas0-pthread, Debian's torch falls back to the
# reference BLAS and runs about 10x slower: we compare against PyTorch at its best.
set -euo pipefail
source "$(dirname "$0")/install_missing.sh"
install_missing setup_bench "for the benchmarks" python3-torch python3-numpy libopenblas0-pthread
# The benchmark executables and tools (build/memfit_bench, build/*_tool): scripts/setup.sh builds
# only the memfit command.
cd "$(dirname "$0")/.."
cmake --build build -j"$(nproc)"
