// The vocabulary-parallel cross-entropy's local passes over rows of a vocabulary slice, built on
// the plain kernel's row passes (crossentropy_rows.h) in the plain kernel's order, so one slice
// holding the whole vocabulary reproduces crossentropy.cpp bit for bit.
#include "memfit/kernels/cpu/crossentropy_slice.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/crossentropy_rows.h"
#include "memfit/kernels/cpu/parallel.h"
#include "memfit/kernels/kernel_times.h"

namespace memfit::kernels {
namespace {

struct Dims {
  int64_t R, width, real;  // rows; the slice's columns; those of them that are real
};

Dims check_slice(std::string_view op, const Tensor& logits, const Tensor& targets,
                 VocabSliceView slice, const Tensor* mask) {
  const Shape& ls = expect_any_shape(logits, op, "logits");
  MEMFIT_CHECK_SHAPE(ls.rank() == 2, op, "logits must be (R, width), got {}", ls);
  const int64_t R = ls[0], width = ls[1];
  MEMFIT_CHECK_SHAPE(slice.vocab > 0 && slice.begin >= 0, op,
                     "slice begins at {} of a vocabulary of {} (want begin >= 0, vocabulary > 0)",
                     slice.begin, slice.vocab);
  expect_tensor(targets, op, "targets", Shape{R}, DType::i32);
  const int32_t* tg = targets.data<int32_t>();
  for (int64_t r = 0; r < R; ++r)
    MEMFIT_CHECK(tg[r] >= 0 && tg[r] < slice.vocab, op, "target {} at row {} is outside [0, {})",
                 tg[r], r, slice.vocab);
  if (mask) {
    expect_tensor(*mask, op, "mask", Shape{R}, DType::u8);
    const uint8_t* m = mask->data<uint8_t>();
    for (int64_t r = 0; r < R; ++r)
      MEMFIT_CHECK(m[r] <= 1, op, "mask {} at row {} is not 0 or 1", int(m[r]), r);
  }
  const int64_t real = std::clamp<int64_t>(slice.vocab - slice.begin, 0, width);
  return {R, width, real};
}

void check_rows(std::string_view op, std::string_view name, size_t got, int64_t R) {
  MEMFIT_CHECK_SHAPE(static_cast<int64_t>(got) == R, op, "{} holds {} rows, logits {}", name, got,
                     R);
}

const uint8_t* keep_of(const Tensor* mask) { return mask ? mask->data<uint8_t>() : nullptr; }

// The target's column in this slice, or -1 where another slice holds it.
int64_t local_target(int32_t target, VocabSliceView slice, int64_t real) {
  const int64_t j = target - slice.begin;
  return j >= 0 && j < real ? j : -1;
}

}  // namespace

void crossentropy_slice_max(std::span<float> row_max, const Tensor& logits, const Tensor& targets,
                            VocabSliceView slice, const Tensor* mask) {
  KernelScope timed("crossentropy_slice_max");
  constexpr std::string_view op = "crossentropy_slice_max";
  const Dims d = check_slice(op, logits, targets, slice, mask);
  check_rows(op, "row_max", row_max.size(), d.R);
  const int64_t R = d.R, width = d.width, real = d.real;
  const uint8_t* keep = keep_of(mask);
  const float* x = logits.data<float>();
#pragma omp parallel for schedule(static) if (R * real > kParallelGrain)
  for (int64_t r = 0; r < R; ++r)
    row_max[r] = keep && !keep[r] ? -std::numeric_limits<float>::infinity()
                                   : ce_rows::row_max(x + r * width, real);
}

void crossentropy_slice_sum_exp(std::span<double> sum_exp, std::span<double> target_logit,
                                Tensor& logits, const Tensor& targets,
                                std::span<const float> row_max, VocabSliceView slice, bool store,
                                const Tensor* mask) {
  KernelScope timed("crossentropy_slice_sum_exp");
  constexpr std::string_view op = "crossentropy_slice_sum_exp";
  const Dims d = check_slice(op, logits, targets, slice, mask);
  check_rows(op, "sum_exp", sum_exp.size(), d.R);
  check_rows(op, "target_logit", target_logit.size(), d.R);
  check_rows(op, "row_max", row_max.size(), d.R);
  const int64_t R = d.R, width = d.width, real = d.real;
  const uint8_t* keep = keep_of(mask);
  float* x = logits.data<float>();
  const int32_t* tg = targets.data<int32_t>();
#pragma omp parallel for schedule(static) if (R * real > kParallelGrain)
  for (int64_t r = 0; r < R; ++r) {
    if (keep && !keep[r]) {
      sum_exp[r] = 0;
      target_logit[r] = 0;
      continue;
    }
    float* row = x + r * width;
    const int64_t t = local_target(tg[r], slice, real);
    target_logit[r] = t >= 0 ? row[t] : 0.0;  // read before the store below overwrites it
    sum_exp[r] = ce_rows::row_sum_exp(row, real, row_max[r], store);
  }
}

void crossentropy_slice_backward(Tensor& logits, const Tensor& targets,
                                 std::span<const double> sum_exp, VocabSliceView slice,
                                 float dloss, DType round_to, const Tensor* mask) {
  KernelScope timed("crossentropy_slice_backward");
  constexpr std::string_view op = "crossentropy_slice_backward";
  const Dims d = check_slice(op, logits, targets, slice, mask);
  check_rows(op, "sum_exp", sum_exp.size(), d.R);
  MEMFIT_CHECK_DTYPE(round_to == DType::f32 || round_to == DType::bf16 || round_to == DType::f16,
                     op, "round_to must be f32, bf16 or f16, got {}", dtype_name(round_to));
  const int64_t R = d.R, width = d.width, real = d.real;
  const uint8_t* keep = keep_of(mask);
  float* x = logits.data<float>();
  const int32_t* tg = targets.data<int32_t>();
#pragma omp parallel for schedule(static) if (R * real > kParallelGrain)
  for (int64_t r = 0; r < R; ++r) {
    float* row = x + r * width;
    if (keep && !keep[r]) {
      std::fill_n(row, width, 0.0f);
      continue;
    }
    const double sum = sum_exp[r];
    const int64_t t = local_target(tg[r], slice, real);
    const float et = t >= 0 ? row[t] : 0.0f;
    ce_rows::row_scale_round_pad(round_to, row, real, width, static_cast<float>(dloss / sum));
    if (t >= 0)
      row[t] = ce_rows::round_one(round_to, static_cast<float>((et / sum - 1.0) * dloss));
  }
}

void crossentropy_slice_loss(Tensor& losses, std::span<const float> row_max,
                             std::span<const double> sum_exp, std::span<const double> target_logit,
                             const Tensor* mask) {
  constexpr std::string_view op = "crossentropy_slice_loss";
  const Shape& ls = expect_any_shape(losses, op, "losses");
  MEMFIT_CHECK_SHAPE(ls.rank() == 1, op, "losses must be (R), got {}", ls);
  const int64_t R = ls[0];
  check_rows(op, "row_max", row_max.size(), R);
  check_rows(op, "sum_exp", sum_exp.size(), R);
  check_rows(op, "target_logit", target_logit.size(), R);
  if (mask) expect_tensor(*mask, op, "mask", Shape{R}, DType::u8);
  const uint8_t* keep = keep_of(mask);
  float* loss = losses.data<float>();
  for (int64_t r = 0; r < R; ++r) {
    if (keep && !keep[r]) {
      loss[r] = 0;
      continue;
    }
    // As the plain kernel: log(sum) + mx - x[target], in double, rounded once.
    const float mx = row_max[r];
    const float xt = static_cast<float>(target_logit[r]);
    loss[r] = static_cast<float>(std::log(sum_exp[r]) + mx - xt);
  }
}

}  // namespace memfit::kernels
