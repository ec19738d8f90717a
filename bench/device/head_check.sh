#!/bin/bash
# The bf16 step's GEMMs on a lent many-core machine, in one call of about 5 minutes: the block
# and LM head products of gpt2 with their operands in cache and out of every cache
# (BM_Matmul_Bf16Forward against BM_Matmul_Bf16ForwardCold), then gpt2 8 x 256 bf16 steps at
# the LM head's default gradient group (512 rows) and at --lm-head-group 1024 and 2048,
# interleaved (bench/e2e/step_variants.py), then the native half of the precision table of
# docs/benchmarks.md. Prepare with bench/device/pack.sh, then
# run(command="bash bench/device/head_check.sh", carry=["build/device"], timeout_s=480).
source "$(dirname "$0")/unpack.sh" || exit 2

say "GEMMs with operands in cache and out of every cache"
build/memfit_bench --benchmark_filter='BM_Matmul_Bf16Forward' --benchmark_min_time=0.3 \
  --benchmark_out="$OUT/cold.json" --benchmark_out_format=json 2>&1 \
  | grep -E "real_time |median" | tee -a "$log"

say "the LM head's gradient group"
$py bench/e2e/step_variants.py --kernel-times --repeats 3 --out "$OUT/head_group.json" \
  --variant 'bf16 group 512||--precision bf16' \
  --variant 'bf16 group 1024||--precision bf16 --lm-head-group 1024' \
  --variant 'bf16 group 2048||--precision bf16 --lm-head-group 2048' 2>&1 | tee -a "$log"

precision_tables 2,2 native
say "done"
