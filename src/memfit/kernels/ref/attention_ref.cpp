// Reference causal attention in double precision, one (batch, position, query head) at a time as
// in llm.c's train_gpt2.c: scores, softmax, weighted values; backward retraces the same steps.
// Grouped-query heads only change where a query head's key and value are read from.
#include "memfit/kernels/ref/attention_ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace memfit::kernels::ref {
namespace {

// Column offsets in a qkv row of query head h's q, k and v.
struct Columns {
  int64_t q, k, v;
};
Columns columns_of(const AttentionHeads& heads, int64_t hs, int64_t h) {
  const int64_t g = heads.kv_of(static_cast<int>(h));
  return {h * hs, heads.out_width(hs) + g * hs, heads.out_width(hs) + (heads.kv + g) * hs};
}

}  // namespace

void attention_forward(double* out, double* att, const double* qkv, int64_t B, int64_t T,
                       int64_t C, AttentionHeads heads) {
  const int64_t NH = heads.q, hs = C / NH, W = heads.qkv_width(hs);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < NH; ++h) {
        const Columns col = columns_of(heads, hs, h);
        const double* q = qkv + (b * T + t) * W + col.q;
        double* a = att + ((b * NH + h) * T + t) * T;
        double maxval = -INFINITY;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const double* k = qkv + (b * T + t2) * W + col.k;
          double s = 0.0;
          for (int64_t i = 0; i < hs; ++i) s += q[i] * k[i];
          a[t2] = s * scale;
          maxval = std::max(maxval, a[t2]);
        }
        double sum = 0.0;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          a[t2] = std::exp(a[t2] - maxval);
          sum += a[t2];
        }
        for (int64_t t2 = 0; t2 < T; ++t2) a[t2] = t2 <= t ? a[t2] / sum : 0.0;

        double* o = out + (b * T + t) * C + h * hs;
        for (int64_t i = 0; i < hs; ++i) o[i] = 0.0;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const double* v = qkv + (b * T + t2) * W + col.v;
          for (int64_t i = 0; i < hs; ++i) o[i] += a[t2] * v[i];
        }
      }
    }
  }
}

void attention_backward(double* dqkv, const double* dout, const double* qkv, const double* att,
                        int64_t B, int64_t T, int64_t C, AttentionHeads heads) {
  const int64_t NH = heads.q, hs = C / NH, W = heads.qkv_width(hs);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  for (int64_t i = 0; i < B * T * W; ++i) dqkv[i] = 0.0;
  std::vector<double> datt(T), dpre(T);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < NH; ++h) {
        const Columns col = columns_of(heads, hs, h);
        const double* a = att + ((b * NH + h) * T + t) * T;
        const double* q = qkv + (b * T + t) * W + col.q;
        const double* d = dout + (b * T + t) * C + h * hs;
        double* dq = dqkv + (b * T + t) * W + col.q;
        // out = sum_t2 a[t2] v[t2]: gradients to the probabilities and to the values.
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const double* v = qkv + (b * T + t2) * W + col.v;
          double* dv = dqkv + (b * T + t2) * W + col.v;
          datt[t2] = 0.0;
          for (int64_t i = 0; i < hs; ++i) {
            datt[t2] += d[i] * v[i];
            dv[i] += a[t2] * d[i];
          }
        }
        // Softmax: dpre = a * (datt - sum(a * datt)).
        double dot = 0.0;
        for (int64_t t2 = 0; t2 <= t; ++t2) dot += a[t2] * datt[t2];
        for (int64_t t2 = 0; t2 <= t; ++t2) dpre[t2] = a[t2] * (datt[t2] - dot);
        // Scores = scale * q . k.
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const double* k = qkv + (b * T + t2) * W + col.k;
          double* dk = dqkv + (b * T + t2) * W + col.k;
          for (int64_t i = 0; i < hs; ++i) {
            dq[i] += dpre[t2] * k[i] * scale;
            dk[i] += dpre[t2] * q[i] * scale;
          }
        }
      }
    }
  }
}

}  // namespace memfit::kernels::ref
