#!/bin/bash
# Sourced by the device scripts (cpu_check.sh, step_check.sh) on the lent machine: unpacks
# build/device/pack.tar.xz (bench/device/pack.sh) and makes build/<tool> run each packed binary
# through the packed loader and libraries, data/brown the packed copy, and appends what the CPU
# is to $log.
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
