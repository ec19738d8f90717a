#!/bin/bash
# A/B of step changes on a lent many-core machine, in one call of about 5 minutes: gpt2 8 x 256
# steps as variants run interleaved (bench/e2e/step_variants.py), with their kernel times, then
# the precision table of docs/benchmarks.md, native and capped to AVX2. The variants: native
# bf16 and fp32 as built, with OpenMP's threads bound to cores (OMP_PROC_BIND=close,
# OMP_PLACES=cores) and spinning between regions (OMP_WAIT_POLICY=active), and bf16 with a
# 256-row LM head chunk; capped fp32 against capped bf16, as built and with OpenMP spinning;
# and the widening convert at in-cache sizes. Prepare with bench/device/pack.sh, then
# run(command="bash bench/device/step_check.sh", carry=["build/device"], timeout_s=480).
source "$(dirname "$0")/unpack.sh" || exit 2
pin='OMP_PROC_BIND=close OMP_PLACES=cores'

say "native bf16 variants"
$py bench/e2e/step_variants.py --kernel-times --repeats 2 --out "$OUT/native_bf16.json" \
  --variant 'bf16||--precision bf16' \
  --variant "bf16 pinned|$pin|--precision bf16" \
  --variant 'bf16 spinning|OMP_WAIT_POLICY=active|--precision bf16' \
  --variant 'bf16 head chunk 256||--precision bf16 --lm-head-chunk 256' 2>&1 | tee -a "$log"

say "native fp32 variants"
$py bench/e2e/step_variants.py --kernel-times --repeats 2 --out "$OUT/native_fp32.json" \
  --variant 'fp32||--precision fp32' \
  --variant "fp32 pinned spinning|$pin OMP_WAIT_POLICY=active|--precision fp32" 2>&1 | tee -a "$log"

say "capped variants"
$py bench/e2e/step_variants.py --kernel-times --repeats 2 --out "$OUT/capped.json" \
  --variant 'fp32 capped|MEMFIT_MAX_ISA=avx2|--precision fp32' \
  --variant 'bf16 capped|MEMFIT_MAX_ISA=avx2|--precision bf16' \
  --variant 'fp32 capped spinning|MEMFIT_MAX_ISA=avx2 OMP_WAIT_POLICY=active|--precision fp32' \
  --variant 'bf16 capped spinning|MEMFIT_MAX_ISA=avx2 OMP_WAIT_POLICY=active|--precision bf16' \
  2>&1 | tee -a "$log"

say "in-cache widening: bf16 -> f32 convert of a head block, an MLP weight, and 16M values"
for isa in native avx2; do
  env $([ $isa = avx2 ] && echo MEMFIT_MAX_ISA=avx2) build/memfit_bench \
    --benchmark_filter='BM_Convert/n:(1572864|2359296|16777216)/src:1/dst:0' \
    --benchmark_min_time=0.2 2>&1 | grep BM_ | tee -a "$log"
done

precision_tables 2,2
say "done"
