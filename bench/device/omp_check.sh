#!/bin/bash
# How OpenMP's idle threads wait, on a lent many-core machine, in one call of about 4 minutes:
# libgomp's settings as it reads them (OMP_DISPLAY_ENV), what one parallel region costs after
# the team has idled 0.1-100 ms (BM_ParallelRegion_AfterGap) with libgomp's default wait, with
# threads that spin (OMP_WAIT_POLICY=active) and with threads that sleep at once
# (GOMP_SPINCOUNT=0), then gpt2 8 x 256 steps in bf16 and fp32 with each policy, interleaved
# (bench/e2e/step_variants.py), and the bare GEMM rates of the same call. Prepare with
# bench/device/pack.sh, then
# run(command="bash bench/device/omp_check.sh", carry=["build/device"], timeout_s=420).
source "$(dirname "$0")/unpack.sh" || exit 2

say "libgomp's settings"
OMP_DISPLAY_ENV=verbose build/gemm_rate_tool 256 1 2>&1 | grep -E "OMP_|GOMP_" | tee -a "$log"

say "one parallel region after an idle gap"
for env in "" "OMP_WAIT_POLICY=active" "GOMP_SPINCOUNT=0"; do
  echo "-- ${env:-default}" | tee -a "$log"
  env $env build/memfit_bench --benchmark_filter=BM_ParallelRegion \
    --benchmark_out="$OUT/region_${env:-default}.json" --benchmark_out_format=json 2>&1 \
    | grep median | tee -a "$log"
done

say "bare GEMM rates"
build/gemm_rate_tool 2048 5 2>&1 | tee -a "$log"

say "steps by wait policy"
$py bench/e2e/step_variants.py --kernel-times --repeats 2 --out "$OUT/wait_bf16.json" \
  --variant 'bf16||--precision bf16' \
  --variant 'bf16 spin x10|GOMP_SPINCOUNT=3000000|--precision bf16' \
  --variant 'bf16 active|OMP_WAIT_POLICY=active|--precision bf16' 2>&1 | tee -a "$log"
$py bench/e2e/step_variants.py --kernel-times --repeats 2 --out "$OUT/wait_fp32.json" \
  --variant 'fp32||--precision fp32' \
  --variant 'fp32 active|OMP_WAIT_POLICY=active|--precision fp32' 2>&1 | tee -a "$log"
build/gemm_rate_tool 2048 5 2>&1 | tee -a "$log"
say "done"
