#!/bin/bash
# Whether bf16 weight gradients belong in oneDNN's gemm:jit on AMX too (Note [GEMM kernel] in
# src/memfit/kernels/cpu/dnnl_gemm.cpp: below AMX they take it, and the bf16 step is 0.95x on a
# Zen 5; on AMX they stay in brgemm, as this measured on 2026-11-28: 0.996x and 1.004x the step,
# 180 MiB more outside the pool), in one call of about 4 minutes: the
# step's GEMMs alone in both kernels (BM_Gemm_StepKernels, bf16, and the LM head's products as
# laid out and transposed, BM_Gemm_LmHeadForms), then gpt2 8 x 256 and 6 x 384
# bf16 steps, memfit's rule against MEMFIT_GEMM_KERNEL=jit-weight-gradients, interleaved, with
# the kernels' times (bench/e2e/step_variants.py); then the native precision table of
# docs/benchmarks.md (issue 12's percentages of the bare rate), as built and with bf16 under the
# other rule. Prepare with bench/device/pack.sh, then
# run(command="bash bench/device/bf16_dweight_check.sh", carry=["build/device"], timeout_s=480).
source "$(dirname "$0")/unpack.sh" || exit 2

say "the step's bf16 GEMMs alone, oneDNN's first choice (kernel:0) and gemm:jit (kernel:1)"
build/memfit_bench --benchmark_filter='BM_Gemm_StepKernels/.*/bf16:1/|BM_Gemm_LmHeadForms' \
  --benchmark_min_time=0.2 \
  --benchmark_out="$OUT/step_gemms.json" --benchmark_out_format=json 2>&1 \
  | grep -E "real_time " | tee -a "$log"

for shape in "gpt2 3" "gpt2-small-test 4"; do
  set -- $shape
  say "$1 8 x 256 bf16: the weight gradients in brgemm (AMX) and in gemm:jit"
  $py bench/e2e/step_variants.py --model "$1" --kernel-times --repeats "$2" \
    --out "$OUT/dweight_$1.json" \
    --variant 'bf16||--precision bf16' \
    --variant 'bf16 dW in gemm:jit|MEMFIT_GEMM_KERNEL=jit-weight-gradients|--precision bf16' \
    2>&1 | tee -a "$log"
done
precision_tables 3,3 native
say "precision table, bf16 with its weight gradients in gemm:jit"
MEMFIT_GEMM_KERNEL=jit-weight-gradients $py bench/e2e/precision_vs_pytorch.py --no-torch \
  --runs bf16 --shapes gpt2-small-test:8x256,gpt2:8x256 --repeats 3,3 \
  --out "$OUT/precision_native_jit_dweight.json" 2>&1 | tee -a "$log"
say "done"
