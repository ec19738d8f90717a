# libFuzzer harnesses (MEMFIT_FUZZ=ON, clang, a build directory of their own: scripts/fuzz.sh).
# They link a library of only the sources that parse outside bytes and what those need, so a
# fuzz build compiles a small part of memfit (no kernels, no model). Adding a harness for a new
# parser (docs/testing.md, "Adding a harness"):
#   1. fuzz/<name>_fuzz.cpp defining LLVMFuzzerTestOneInput (fuzz/safetensors_fuzz.cpp is the
#      pattern: write the bytes where the parser reads them, call it, catch memfit::Error only);
#   2. seed inputs in fuzz/corpus/<name>/ (a few small valid files and near misses);
#   3. memfit_add_fuzzer(<name>) below, adding the parser's .cpp to MEMFIT_FUZZ_SOURCES if it is
#      not there yet. scripts/fuzz.sh runs every fuzz/*_fuzz.cpp.
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "MEMFIT_FUZZ needs clang (libFuzzer): configure with "
                      "-DCMAKE_CXX_COMPILER=clang++-19 (scripts/fuzz.sh does)")
endif()

set(MEMFIT_FUZZ_SOURCES
  src/memfit/core/cpu.cpp src/memfit/core/dtype.cpp src/memfit/core/error.cpp
  src/memfit/core/shape.cpp src/memfit/memory/tensor.cpp
  src/memfit/memory/category.cpp src/memfit/memory/pool.cpp
  src/memfit/io/atomic_file.cpp src/memfit/io/npm_package.cpp
  src/memfit/io/checkpoint/safetensors.cpp src/memfit/io/checkpoint/sharded_safetensors.cpp
  src/memfit/io/data/token_shard.cpp
  src/memfit/io/data/chat_record.cpp src/memfit/io/data/chat_template.cpp
  src/memfit/io/tokenizer/byte_tokenizer.cpp src/memfit/io/tokenizer/tokenizer.cpp
  src/memfit/io/hf/gpt2_hf_config.cpp src/memfit/io/hf/llama_hf_config.cpp
  src/memfit/io/hf/model_hf_config.cpp src/memfit/io/hf/hf_config_common.cpp
  src/memfit/io/tokenizer/gpt2_tokenizer.cpp src/memfit/io/tokenizer/gpt2_pretokenize.cpp
  src/memfit/io/tokenizer/hf_tokenizer.cpp src/memfit/io/tokenizer/hf_tokenizer_json.cpp
  src/memfit/io/tokenizer/hf_bpe.cpp src/memfit/io/tokenizer/hf_pretokenize.cpp
  src/memfit/model/model_config.cpp src/memfit/model/param_layout.cpp src/memfit/model/vocab_shard.cpp
  src/memfit/model/unit_map.cpp
  src/memfit/model/model_family.cpp src/memfit/model/gpt2/gpt2_family.cpp
  src/memfit/model/llama/llama_family.cpp
  src/memfit/cli/config_file.cpp
  src/memfit/train/resume_state.cpp src/memfit/train/lr_schedule.cpp
  src/memfit/train/loss_scaler.cpp)
add_library(memfit_fuzz_lib STATIC ${MEMFIT_FUZZ_SOURCES})
target_include_directories(memfit_fuzz_lib PUBLIC src ${CMAKE_SOURCE_DIR})
target_link_libraries(memfit_fuzz_lib PUBLIC OpenMP::OpenMP_CXX fmt::fmt
                      nlohmann_json::nlohmann_json tomlplusplus::tomlplusplus CLI11::CLI11
                      ICU::uc ICU::i18n PkgConfig::HWY DNNL::dnnl)

# memfit_add_fuzzer(name): the harness fuzz/<name>_fuzz.cpp as the executable <name>_fuzz.
function(memfit_add_fuzzer name)
  add_executable(${name}_fuzz fuzz/${name}_fuzz.cpp)
  target_compile_options(${name}_fuzz PRIVATE -fsanitize=fuzzer)
  target_link_options(${name}_fuzz PRIVATE -fsanitize=fuzzer)
  target_link_libraries(${name}_fuzz PRIVATE memfit_fuzz_lib)
endfunction()

memfit_add_fuzzer(safetensors)
memfit_add_fuzzer(token_shard)
memfit_add_fuzzer(toml_config)
memfit_add_fuzzer(gpt2_hf_config)
memfit_add_fuzzer(gpt2_tokenizer)
memfit_add_fuzzer(trainer_state)
memfit_add_fuzzer(model_hf_config)
memfit_add_fuzzer(hf_tokenizer)
memfit_add_fuzzer(safetensors_index)
memfit_add_fuzzer(chat_record)
