#!/bin/bash
# oneDNN's GEMM-based kernel against its first choice (Note [GEMM kernel], dnnl_gemm.cpp) on a
# lent many-core machine: the bare GEMM rates; gpt2 8 x 256 fp32 steps as built and with
# MEMFIT_GEMM_KERNEL=first, run interleaved (bench/e2e/step_variants.py); then, unless
# QUICK=1, every GEMM of that step in both kernels (BM_Gemm_StepKernels) and the planner's
# step-time estimate against measured steps; and the precision table of docs/benchmarks.md,
# native and (unless QUICK=1) capped to AVX2. About 6 minutes; QUICK=1, about 3. Prepare with
# bench/device/pack.sh, then
# run(command="bash bench/device/gemm_kernel_check.sh", carry=["build/device"], timeout_s=480).
source "$(dirname "$0")/unpack.sh" || exit 2

say "bare GEMM rate (the faster of oneDNN's two kernels), native and capped"
{ build/gemm_rate_tool 2048 5; MEMFIT_MAX_ISA=avx2 build/gemm_rate_tool 2048 5; } 2>&1 |
  tee -a "$log"

say "fp32 steps: gemm:jit against oneDNN's first choice"
$py bench/e2e/step_variants.py --kernel-times --repeats 3 --out "$OUT/kernel_ab.json" \
  --variant 'fp32||--precision fp32' \
  --variant 'fp32 first|MEMFIT_GEMM_KERNEL=first|--precision fp32' 2>&1 | tee -a "$log"

if [ "${QUICK:-0}" != 1 ]; then
  say "the step's GEMMs, oneDNN's first choice against its GEMM-based kernel"
  build/memfit_bench --benchmark_filter='BM_Gemm_StepKernels' --benchmark_min_time=0.2 \
    --benchmark_out="$OUT/step_kernels.json" --benchmark_out_format=json 2>&1 | grep BM_ |
    tee -a "$log"
  say "the planner's step-time estimate against measured steps"
  $py bench/e2e/plan_time_accuracy.py --no-doc --repeats 2 --out "$OUT/plan_time.json" 2>&1 |
    tee -a "$log"
  precision_tables 2,2
else
  precision_tables 2,2 native
fi
say "done"
