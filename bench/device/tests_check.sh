#!/bin/bash
# The test suites that need no MPI, no network and no npm files, run on a lent AMX machine, where
# CI never runs: the AMX branches (flash attention's bf16 tiles on AMX, Note [GEMM kernel]'s AMX
# exception, oneDNN's AMX bf16 matmul under every bf16 test's tolerance) natively, then the
# kernels under MEMFIT_MAX_ISA=avx512 and =avx2 and the model and train tests under =avx2, as
# scripts/test.sh does. About 2 minutes. Prepare with
#   PACK_EXTRA="core_tests memory_tests kernels_tests model_tests optim_tests plan_tests state_tests train_tests offload_tests profile_tests" bash bench/device/pack.sh
# then run(command="bash bench/device/tests_check.sh", carry=["build/device"], timeout_s=300).
source "$(dirname "$0")/unpack.sh" || exit 2
# The tests find their fixtures under the source and build folders compiled in (MEMFIT_SOURCE_DIR,
# MEMFIT_BINARY_DIR: /work/main here); point that path at this checkout.
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
export MEMFIT_CACHE_DIR=/tmp/memfit-test-cache
failed=0
suite() {  # suite <name> [VAR=value ...]
  local name=$1
  shift
  say "${name}_tests ${*:-native}"
  env "$@" "build/${name}_tests" --gtest_brief=1 2>&1 | grep -vE "^\[[0-9]+/[0-9]+\] " \
    | tail -n 40 | tee -a "$log"
  [ "${PIPESTATUS[0]}" = 0 ] || failed=$((failed + 1))
}
for t in core memory kernels model optim plan state train offload profile; do suite $t; done
suite kernels MEMFIT_MAX_ISA=avx512
suite kernels MEMFIT_MAX_ISA=avx2
suite model MEMFIT_MAX_ISA=avx2
suite train MEMFIT_MAX_ISA=avx2
say "done: $failed suite runs failed"
