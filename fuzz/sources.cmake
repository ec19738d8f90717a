# What the libFuzzer build (fuzz/fuzz.cmake) links and runs, read by the main build too
# (fuzz/replay.cmake): the harnesses, and the sources that parse outside bytes with what those
# need. The main build links each harness against exactly these sources (its own objects of
# them) and replays the seed corpus, so a source missing here fails the ordinary build's link,
# not only the fuzz stage at the end of CI (session 33: model/unit_map.cpp).
set(MEMFIT_FUZZERS safetensors token_shard toml_config gpt2_hf_config gpt2_tokenizer
    trainer_state model_hf_config hf_tokenizer safetensors_index chat_record)
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
