// Double-precision causal attention, the reference the flash kernels are tested against: see
// flash_attention_ref.h.
#include "memfit/kernels/ref/flash_attention_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace memfit::kernels::ref {
namespace {

// Offset of query head h's part (0 q, 1 k, 2 v) in row t of batch b of qkv: k and v are those of
// its key/value head.
int64_t offset_of(const AttentionDims& d, int64_t b, int64_t t, int part, int h) {
  const int64_t hs = d.head_size(), g = d.heads.kv_of(h);
  const int64_t col = part == 0 ? h * hs : d.C + ((part - 1) * d.heads.kv + g) * hs;
  return (b * d.T + t) * d.qkv_width() + col;
}

// Probabilities P (T, T) of head (b, h), zero above the diagonal, and optionally each row's
// log-sum-exp.
void head_probs(std::vector<double>& P, std::vector<double>* lse_row, const double* qkv,
                const AttentionDims& d, int64_t b, int h) {
  const int64_t T = d.T, hs = d.head_size();
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  P.assign(static_cast<size_t>(T * T), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    const double* q = qkv + offset_of(d, b, t, 0, h);
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t s = 0; s <= t; ++s) {
      const double* k = qkv + offset_of(d, b, s, 1, h);
      double dot = 0;
      for (int64_t i = 0; i < hs; ++i) dot += q[i] * k[i];
      P[t * T + s] = dot * scale;
      mx = std::max(mx, dot * scale);
    }
    double sum = 0;
    for (int64_t s = 0; s <= t; ++s) sum += std::exp(P[t * T + s] - mx);
    for (int64_t s = 0; s <= t; ++s) P[t * T + s] = std::exp(P[t * T + s] - mx) / sum;
    if (lse_row) (*lse_row)[t] = mx + std::log(sum);
  }
}

}  // namespace

void attention_forward_ref(std::vector<double>& out, std::vector<double>& lse,
                           const std::vector<double>& qkv, const AttentionDims& d) {
  const int64_t T = d.T, C = d.C, hs = d.head_size();
  const int NH = d.heads.q;
  out.assign(static_cast<size_t>(d.B * T * C), 0.0);
  lse.assign(static_cast<size_t>(d.B * NH * T), 0.0);
  std::vector<double> P, lse_row(static_cast<size_t>(T));
  for (int64_t b = 0; b < d.B; ++b) {
    for (int h = 0; h < NH; ++h) {
      head_probs(P, &lse_row, qkv.data(), d, b, h);
      std::copy(lse_row.begin(), lse_row.end(), lse.begin() + (b * NH + h) * T);
      for (int64_t t = 0; t < T; ++t) {
        double* o = out.data() + (b * T + t) * C + h * hs;
        for (int64_t s = 0; s <= t; ++s) {
          const double* v = qkv.data() + offset_of(d, b, s, 2, h);
          for (int64_t i = 0; i < hs; ++i) o[i] += P[t * T + s] * v[i];
        }
      }
    }
  }
}

void attention_backward_ref(std::vector<double>& dqkv, const std::vector<double>& dout,
                            const std::vector<double>& qkv, const AttentionDims& d) {
  const int64_t T = d.T, C = d.C, hs = d.head_size();
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  dqkv.assign(static_cast<size_t>(d.B * T * d.qkv_width()), 0.0);
  std::vector<double> P, dP(static_cast<size_t>(T * T));
  for (int64_t b = 0; b < d.B; ++b) {
    for (int h = 0; h < d.heads.q; ++h) {
      head_probs(P, nullptr, qkv.data(), d, b, h);
      for (int64_t t = 0; t < T; ++t) {
        const double* go = dout.data() + (b * T + t) * C + h * hs;
        // dP = dO V^T, dV = P^T dO (summed over the query heads that share the value head).
        for (int64_t s = 0; s <= t; ++s) {
          const double* v = qkv.data() + offset_of(d, b, s, 2, h);
          double* dv = dqkv.data() + offset_of(d, b, s, 2, h);
          double dot = 0;
          for (int64_t i = 0; i < hs; ++i) {
            dot += go[i] * v[i];
            dv[i] += P[t * T + s] * go[i];
          }
          dP[t * T + s] = dot;
        }
        // Softmax backward: dS = P * (dP - sum_s P dP); then scores = scale * q.k.
        double pdp = 0;
        for (int64_t s = 0; s <= t; ++s) pdp += P[t * T + s] * dP[t * T + s];
        const double* q = qkv.data() + offset_of(d, b, t, 0, h);
        double* dq = dqkv.data() + offset_of(d, b, t, 0, h);
        for (int64_t s = 0; s <= t; ++s) {
          const double ds = P[t * T + s] * (dP[t * T + s] - pdp) * scale;
          const double* k = qkv.data() + offset_of(d, b, s, 1, h);
          double* dk = dqkv.data() + offset_of(d, b, s, 1, h);
          for (int64_t i = 0; i < hs; ++i) {
            dq[i] += ds * k[i];
            dk[i] += ds * q[i];
          }
        }
      }
    }
  }
}

}  // namespace memfit::kernels::ref
