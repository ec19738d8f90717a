#!/usr/bin/env bash
# Runs the whole test suite (CTest over the GoogleTest executables). Expects scripts/setup.sh
# to have built build/. Tests that need a GPU or several MPI ranks skip and say why.
#
# The kernel tests are registered in CTest three times (CMakeLists.txt): as they are, and under
# MEMFIT_MAX_ISA=avx2 and =scalar, so every SIMD target this CPU has is checked against the
# references. On a CPU with more than AVX2 (AVX-512, AVX512_BF16, AMX) the model and train tests
# then run a second time under MEMFIT_MAX_ISA=avx2 (which caps oneDNN too), as an AVX2-only
# machine runs them: no bf16 matmul in oneDNN, the AVX2 kernels. A change that breaks the other
# kind of machine fails here as well. MEMFIT_SKIP_AVX2_RERUN=1 skips that second run.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 600

if grep -qw avx512f /proc/cpuinfo && [ -z "${MEMFIT_MAX_ISA:-}" ] &&
   [ "${MEMFIT_SKIP_AVX2_RERUN:-0}" != 1 ]; then
  echo "test: model and train again under MEMFIT_MAX_ISA=avx2, as on an AVX2-only CPU"
  MEMFIT_MAX_ISA=avx2 ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 600 \
    -L '^(model|train)$'
fi
