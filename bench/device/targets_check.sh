#!/bin/bash
# Issue 12's remaining measurements on a lent many-core machine, in one call of about 5 minutes:
# the planner's step-time estimate against the measured step (bench/e2e/plan_time_accuracy.py,
# fp32 and bf16 at gpt2 and 6x384, 8 x 256), the precision table capped to AVX2 (fp32 against
# widened bf16: within 10%?), and the main job (configs/brown-6x384.toml, 150 steps) on every
# core. Prepare with bench/device/pack.sh, then
# run(command="bash bench/device/targets_check.sh", carry=["build/device"], timeout_s=420).
source "$(dirname "$0")/unpack.sh" || exit 2

say "the planner's step-time estimate against the measured step"
$py bench/e2e/plan_time_accuracy.py --no-doc --repeats 2 --out "$OUT/plan_time.json" 2>&1 \
  | tee -a "$log"

precision_tables 2,2 avx2

say "the main job, every core"
build/memfit train --config configs/brown-6x384.toml --save /tmp/brown-out \
  --log "$OUT/main_job.jsonl" 2>&1 | tail -n 12 | tee -a "$log"
say "done"
