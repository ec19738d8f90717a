#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/, MEMFIT_FUZZ=ON) with clang in build-fuzz/ and runs each
# for a bounded time from its seed corpus, fuzz/corpus/<name>/ (docs/testing.md):
#   scripts/fuzz.sh              20 s each (CI)
#   scripts/fuzz.sh 3600         an hour each
#   scripts/fuzz.sh 600 toml_config safetensors    only those harnesses
# New inputs that reach new code go to build-fuzz/corpus/<name>/ (kept between runs; copy the
# small interesting ones into fuzz/corpus/ to keep them). A crash stops the script with the
# harness's report; the input is saved as build-fuzz/crash/<name>/crash-<sha1>. Reproduce with
# `build-fuzz/<name>_fuzz <that file>`, fix, and commit the input as a regression test
# (fuzz/corpus/<name>/, which every run replays first, or a GoogleTest of the parser).
# Each run's last line (libFuzzer's "Done N runs", with cov: and ft:) is printed per harness.
# Needs clang-19 with libclang-rt-19-dev and libomp-19-dev (Debian); FUZZ_CXX picks another.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-20}"
shift || true
cxx="${FUZZ_CXX:-clang++-19}"
cc="${FUZZ_CC:-${cxx/clang++/clang}}"

if ! command -v "$cxx" >/dev/null; then
  echo "fuzz: $cxx not found; on Debian: apt-get install clang-19 libclang-rt-19-dev libomp-19-dev"
  exit 1
fi
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# -O1 -g: libFuzzer's usual level; line numbers in the reports.
cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" -DMEMFIT_FUZZ=ON \
  -DMEMFIT_TESTS=OFF -DMEMFIT_BENCH=OFF "${launcher[@]}" >/dev/null
names=("$@")
if ((${#names[@]} == 0)); then
  for f in fuzz/*_fuzz.cpp; do f="${f##*/}"; names+=("${f%_fuzz.cpp}"); done
fi
ninja -C build-fuzz "${names[@]/%/_fuzz}"

# LeakSanitizer off: a harness that leaks would be reported at exit, not at the input; the
# sanitizer CI build (scripts/test.sh) checks leaks over the suite instead.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0}"
summary=()
for name in "${names[@]}"; do
  mkdir -p "build-fuzz/corpus/$name" "build-fuzz/crash/$name"
  echo "fuzz: $name for ${seconds}s"
  log="build-fuzz/$name.log"
  # -rss_limit_mb: a parser must not need 2 GB for a small input; -timeout: nor 10 s.
  if ! "build-fuzz/${name}_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
       -max_len=65536 -print_final_stats=1 -artifact_prefix="build-fuzz/crash/$name/" \
       "build-fuzz/corpus/$name" "fuzz/corpus/$name" >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "fuzz: $name found a crash (build-fuzz/crash/$name/); see $log"
    exit 1
  fi
  done_line=$(grep -E '^#[0-9]+.*(DONE|pulse|NEW|REDUCE|INITED)' "$log" | tail -n 1)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  per_s=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  summary+=("$(printf '%-16s %10s runs %7s/s  %s' "$name" "$execs" "$per_s" \
                "$(grep -oE 'cov: [0-9]+ ft: [0-9]+' <<<"$done_line")")")
done
printf 'fuzz: %s\n' "${summary[@]}"
