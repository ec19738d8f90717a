#!/bin/bash
# f32 GEMMs in oneDNN's GEMM-based kernel (Note [f32 GEMM kernel], dnnl_gemm.cpp) on a lent
# many-core machine, in one call of about 5 minutes: the bare GEMM rate; every GEMM of a gpt2
# 8 x 256 step, f32 and bf16, in oneDNN's first choice and in its GEMM-based kernel
# (BM_Gemm_StepKernels); the planner's step-time estimate against measured steps; and the
# precision table of docs/benchmarks.md, native and capped to AVX2. Prepare with
# bench/device/pack.sh, then
# run(command="bash bench/device/gemm_kernel_check.sh", carry=["build/device"], timeout_s=480).
source "$(dirname "$0")/unpack.sh" || exit 2

say "bare GEMM rate, native and capped"
{ build/gemm_rate_tool 2048 5; MEMFIT_MAX_ISA=avx2 build/gemm_rate_tool 2048 5; } 2>&1 | tee -a "$log"

say "the step's GEMMs, oneDNN's first choice against its GEMM-based kernel"
build/memfit_bench --benchmark_filter='BM_Gemm_StepKernels' --benchmark_min_time=0.2 \
  --benchmark_out="$OUT/step_kernels.json" --benchmark_out_format=json 2>&1 | grep BM_ |
  tee -a "$log"

say "the planner's step-time estimate against measured steps"
$py bench/e2e/plan_time_accuracy.py --no-doc --repeats 2 --out "$OUT/plan_time.json" 2>&1 |
  tee -a "$log"

precision_tables 2,2
say "done"
