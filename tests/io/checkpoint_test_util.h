// Helpers shared by the checkpoint tests (gpt2_checkpoint_test.cpp, llama_checkpoint_test.cpp,
// model_checkpoint_test.cpp, sharded_safetensors_test.cpp): a parameter slab filled with
// distinct values, its bytes for bit-exact comparison, a loaded slab checked against the saved
// one, and the IoError a call throws.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "memfit/core/error.h"
#include "memfit/memory/tensor.h"
#include "memfit/memory/pool.h"
#include "memfit/model/model_config.h"
#include "memfit/model/param_layout.h"

namespace memfit::io::testing {

inline Tensor make_slab(MemoryPool& pool, const ParamLayout& layout, DType dtype = DType::f32) {
  return Tensor::empty(pool, {layout.total()}, dtype, Category::params, "params");
}

// Distinct, deterministic values everywhere, padding rows included; f32 or bf16.
inline void fill(const Tensor& slab, uint32_t seed) {
  for (int64_t i = 0; i < slab.numel(); ++i) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u + seed * 40503u;
    float v = static_cast<float>(h % 100003u) * 1e-3f - 50.0f;
    if (slab.dtype() == DType::f32)
      slab.data<float>()[i] = v;
    else
      static_cast<uint16_t*>(slab.raw_data())[i] = bf16_from_f32(v);
  }
}

inline std::string bytes(const Tensor& t) {
  return std::string(static_cast<const char*>(t.raw_data()), t.nbytes());
}

// The message of the IoError `f` throws; a test failure if it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const IoError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected IoError";
  return "";
}

// Parameters equal bit for bit, except the token embedding's and head's padding rows, which a
// load zeroes.
inline void expect_loaded(const ModelConfig& c, const ParamLayout& layout, const Tensor& saved,
                          const Tensor& loaded) {
  for (const ParamInfo& p : layout.params()) {
    Tensor a = layout.view(saved, p), b = layout.view(loaded, p);
    if (p.role == ParamRole::token_embedding || p.role == ParamRole::lm_head) {
      EXPECT_EQ(bytes(a.slice(0, c.vocab_size)), bytes(b.slice(0, c.vocab_size))) << p.name;
      Tensor pad = b.slice(c.vocab_size, c.padded_vocab);
      EXPECT_EQ(bytes(pad), std::string(pad.nbytes(), '\0')) << p.name;
    } else {
      EXPECT_EQ(bytes(a), bytes(b)) << p.name;
    }
  }
}

inline void expect_contains(const std::string& msg, const std::vector<std::string>& needles) {
  for (const std::string& n : needles)
    EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
}

}  // namespace memfit::io::testing
