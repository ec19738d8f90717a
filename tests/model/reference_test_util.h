// Shared by the PyTorch reference tests (gpt2_reference_test.cpp, llama_reference_test.cpp): the
// fixture file with the training step it describes (batch size, sequence length, AdamW settings,
// step count: the metadata tests/reference/make_*_fixture.py writes), tensors loaded from it, and
// the relative error the tests bound.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "memfit/io/checkpoint/safetensors.h"
#include "memfit/model/transformer.h"
#include "memfit/optim/adamw.h"

namespace memfit::reference_test {

// Norm of the difference over norm of `want` (the absolute norm where `want` is zero); f32.
inline double rel_error(const Tensor& got, const Tensor& want) {
  const float* a = got.data<float>();
  const float* b = want.data<float>();
  double diff = 0, ref = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    ref += double(b[i]) * b[i];
  }
  return ref == 0 ? std::sqrt(diff) : std::sqrt(diff / ref);
}

// A test over a fixture file, one case per attention kind. The family's fixture sets `config`
// from the metadata in its SetUp (with meta()) and calls read_step() for the rest.
class ReferenceFixture : public ::testing::TestWithParam<AttentionKind> {
 protected:
  explicit ReferenceFixture(const char* path) : file{path} {}

  double meta(const char* key) const { return std::stod(file.metadata().at(key)); }
  // B, T, the learning rate, AdamW's settings and the number of steps.
  void read_step() {
    B = int(meta("B"));
    T = int(meta("T"));
    lr = float(meta("lr"));
    optim.beta1 = float(meta("beta1"));
    optim.beta2 = float(meta("beta2"));
    optim.eps = float(meta("eps"));
    optim.weight_decay = float(meta("weight_decay"));
    steps = int(meta("steps"));
  }
  Tensor load(const std::string& name, Shape shape, DType dtype = DType::f32) {
    Tensor t = Tensor::empty(pool, shape, dtype, Category::staging, name);
    file.read(name, t);
    return t;
  }

  io::SafetensorsReader file;
  MemoryPool pool;
  ModelConfig config;
  OptimConfig optim;
  int B = 0, T = 0, steps = 0;
  float lr = 0;
};

}  // namespace memfit::reference_test
