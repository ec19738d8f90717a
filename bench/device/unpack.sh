#!/bin/bash
# The device scripts' common start (cpu_check.sh, step_check.sh source it on the lent machine):
# $OUT (the tool's folder, or /tmp/<script>), $log, say() and precision_tables(), then
# build/device/pack.tar.xz (bench/device/pack.sh) unpacked: build/<tool> runs each packed binary
# through the packed loader and libraries, data/brown is the packed copy, and what the CPU is
# goes into $log.
set -uo pipefail
OUT=${OUT:-/tmp/$(basename "$0" .sh)}
mkdir -p "$OUT"
log="$OUT/log.txt"
say() { echo "== $(date -u +%T) $*" | tee -a "$log"; }
export PYTHONUNBUFFERED=1
py=python3
# docs/benchmarks.md's precision table (memfit fp32 and bf16 at 6x384 and gpt2, 8 x 256),
# each shape's runs repeated $1 times (e.g. 3,2), for the ISAs that follow (native and avx2 if
# none are named).
precision_tables() {
  local repeats=$1
  shift
  local isas=${*:-native avx2}
  say "precision table: $isas"
  for isa in $isas; do
    $py bench/e2e/precision_vs_pytorch.py --no-torch --runs fp32,bf16 \
      --shapes gpt2-small-test:8x256,gpt2:8x256 --repeats "$repeats" \
      $([ $isa = avx2 ] && echo --isa avx2) --out "$OUT/precision_$isa.json" 2>&1 | tee -a "$log"
  done
}
pack=/tmp/memfit-pack
rm -rf "$pack" && mkdir -p "$pack"
tar -C "$pack" --strip-components=1 -xJf build/device/pack.tar.xz || exit 2
# build/<tool> runs the packed binary through the packed loader and libraries.
for b in "$pack"/bin/*; do
  printf '#!/bin/sh\nexec %s/lib/ld-linux-x86-64.so.2 --library-path %s/lib %s "$@"\n' \
    "$pack" "$pack" "$b" > "build/$(basename "$b")"
  chmod +x "build/$(basename "$b")"
done
mkdir -p data && rm -rf data/brown && cp -r "$pack/brown" data/brown
{ lscpu; nproc; grep -m1 flags /proc/cpuinfo; } >> "$log"
