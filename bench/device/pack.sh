#!/bin/bash
# Packs what bench/device/cpu_check.sh runs on a machine that has none of Debian's packages (the
# device machine, when a session is lent one: python3 is there; oneDNN, Highway, OpenMPI and
# PyTorch are not): build/'s benchmark binaries with every shared library they load and the
# loader, and data/brown, as build/device/pack.tar.xz (about 20 MB; the tool carries at most 64
# MiB). Then, with the device tool: run(command="bash bench/device/cpu_check.sh",
# carry=["build/device"], timeout_s=540).
set -euo pipefail
cd "$(dirname "$0")/../.."
# PACK_EXTRA names more of build/'s binaries (e.g. the test executables for tests_check.sh).
bins=(memfit train_step_tool gemm_rate_tool memfit_bench ${PACK_EXTRA:-})
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/pack/bin" "$stage/pack/lib" build/device
for b in "${bins[@]}"; do
  [ -x "build/$b" ] || { echo "pack.sh: build/$b is missing: build with the bench tools first" >&2; exit 2; }
  cp "build/$b" "$stage/pack/bin/"
  # Every library the binary loads, and the loader itself (ldd's "=> /path" and "/lib64/ld-..." lines).
  ldd "build/$b" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\/.*ld-linux/ {print $1}'
done | sort -u | while read -r lib; do cp -L "$lib" "$stage/pack/lib/"; done
[ -d data/brown ] || { echo "pack.sh: data/brown is missing: memfit prepare --input brown --out data/brown" >&2; exit 2; }
cp -r data/brown "$stage/pack/brown"
tar -C "$stage" -cJf build/device/pack.tar.xz.part pack
mv build/device/pack.tar.xz.part build/device/pack.tar.xz
echo "build/device/pack.tar.xz: $(du -h build/device/pack.tar.xz | cut -f1)"
