// Reference causal attention in double precision, one (batch, position, head) at a time as in
// llm.c's train_gpt2.c: scores, softmax, weighted values; backward retraces the same steps.
#include "memfit/kernels/ref/attention_ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace memfit::kernels::ref {

void attention_forward(double* out, double* att, const double* qkv, int64_t B, int64_t T,
                       int64_t C, int64_t n_head) {
  const int64_t hs = C / n_head, C3 = 3 * C;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < n_head; ++h) {
        const double* q = qkv + (b * T + t) * C3 + h * hs;
        double* a = att + ((b * n_head + h) * T + t) * T;
        double maxval = -INFINITY;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const double* k = qkv + (b * T + t2) * C3 + C + h * hs;
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
          const double* v = qkv + (b * T + t2) * C3 + 2 * C + h * hs;
          for (int64_t i = 0; i < hs; ++i) o[i] += a[t2] * v[i];
        }
      }
    }
  }
}

void attention_backward(double* dqkv, const double* dout, const double* qkv, const double* att,
                        int64_t B, int64_t T, int64_t C, int64_t n_head) {
  const int64_t hs = C / n_head, C3 = 3 * C;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  for (int64_t i = 0; i < B * T * C3; ++i) dqkv[i] = 0.0;
  std::vector<double> datt(T), dpre(T);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < n_head; ++h) {
        const double* a = att + ((b * n_head + h) * T + t) * T;
        const double* q = qkv + (b * T + t) * C3 + h * hs;
        const double* d = dout + (b * T + t) * C + h * hs;
        double* dq = dqkv + (b * T + t) * C3 + h * hs;
        // out = sum_t2 a[t2] v[t2]: gradients to the probabilities and to the values.
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const double* v = qkv + (b * T + t2) * C3 + 2 * C + h * hs;
          double* dv = dqkv + (b * T + t2) * C3 + 2 * C + h * hs;
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
          const double* k = qkv + (b * T + t2) * C3 + C + h * hs;
          double* dk = dqkv + (b * T + t2) * C3 + C + h * hs;
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
