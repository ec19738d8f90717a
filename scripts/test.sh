#!/usr/bin/env bash
# Runs the whole test suite (CTest over the GoogleTest executables). Expects scripts/setup.sh
# to have built build/. Tests that need a GPU or several MPI ranks skip and say why.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 600
