#!/bin/bash
# Issue 12's CPU measurements on a lent machine (the device host: 16 cores, Sapphire Rapids class
# with AMX when last seen), in one call of about 6 minutes: where the step's time goes phase by
# phase and kernel by kernel (native and capped to AVX2, fp32 and bf16, and bf16 at 2/4/8/all
# threads), the linear layers' GEMM rates at GPT-2's shapes (and with the weights kept in oneDNN's
# own layout: BM_Matmul_Bf16PackedWeights), the planner's step-time estimate
# against measured steps, and the precision table of docs/benchmarks.md. Prepare here with
# bench/device/pack.sh, then run(command="bash bench/device/cpu_check.sh", carry=["build/device"],
# timeout_s=540). Eight files come back under $OUT (the tool returns eight at most).
source "$(dirname "$0")/unpack.sh" || exit 2

say "bare GEMM rate, native and capped"
{ build/gemm_rate_tool 2048 5; MEMFIT_MAX_ISA=avx2 build/gemm_rate_tool 2048 5; } 2>&1 | tee -a "$log"

say "phases: fp32 and bf16, native and capped, all threads"
$py bench/e2e/phase_profile.py --precisions fp32,bf16 --isas native,avx2 --threads 0 \
  --out "$OUT/phases.json" 2>&1 | tee -a "$log"
say "phases: bf16 native at 2, 4 and 8 threads"
$py bench/e2e/phase_profile.py --precisions bf16 --threads 2,4,8 \
  --out "$OUT/phases_threads.json" 2>&1 | tee -a "$log"

say "GEMM rates at GPT-2's linear shapes, native and capped"
for isa in native avx2; do
  env $([ $isa = avx2 ] && echo MEMFIT_MAX_ISA=avx2) build/memfit_bench \
    --benchmark_filter='BM_Matmul_Bf16' --benchmark_min_time=0.2 --benchmark_format=json \
    > "$OUT/matmul_$isa.json" 2>> "$log"
  $py - "$OUT/matmul_$isa.json" <<'PY' | tee -a "$log"
import json, sys
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    if b.get("error_occurred"):  # skipped: e.g. no bf16 matmul under the AVX2 cap
        print(f"{b['name']:<60} skipped: {b.get('error_message', '')}")
        continue
    print(f"{b['name']:<60} {b.get('label', '')[:40]:<40} {b['real_time']:9.3f} {b['time_unit']}")
PY
done

say "the planner's step-time estimate against measured steps"
$py bench/e2e/plan_time_accuracy.py --no-doc --repeats 2 --out "$OUT/plan_time.json" 2>&1 | tee -a "$log"

precision_tables 3,2
say "done"
