#!/bin/bash
# The device scripts' common start (cpu_check.sh, step_check.sh source it on the lent machine):
# $OUT (the tool's folder, or /tmp/<script>), $log and say(), then build/device/pack.tar.xz
# (bench/device/pack.sh) unpacked: build/<tool> runs each packed binary through the packed loader
# and libraries, data/brown is the packed copy, and what the CPU is goes into $log.
set -uo pipefail
OUT=${OUT:-/tmp/$(basename "$0" .sh)}
mkdir -p "$OUT"
log="$OUT/log.txt"
say() { echo "== $(date -u +%T) $*" | tee -a "$log"; }
export PYTHONUNBUFFERED=1
py=python3
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
