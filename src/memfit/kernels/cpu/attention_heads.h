// The heads of one attention layer: query heads and key/value heads. Multi-head attention has as
// many of each; grouped-query attention (LLaMA 2 70B, Llama 3, TinyLlama) shares each key/value
// head among q/kv query heads, as Hugging Face's repeat_kv does: query head h reads key/value
// head h / (q/kv). The fused projection output every attention kernel reads is laid out per
// token as [q heads | k heads | v heads], (q + 2 kv) * head_size wide, head h of each part at
// [h*hs, (h+1)*hs); with kv == q that is GPT-2's (B, T, 3C).
#pragma once

namespace memfit::kernels {

struct AttentionHeads {
  int q = 1;   // query heads
  int kv = 1;  // key/value heads; divides q

  // Multi-head attention: as many key/value heads as query heads. Implicit, so the many callers
  // that pass n_head keep meaning what they meant.
  AttentionHeads(int n_head) : q(n_head), kv(n_head) {}  // NOLINT(google-explicit-constructor)
  AttentionHeads(int q_heads, int kv_heads) : q(q_heads), kv(kv_heads) {}

  int group() const { return q / kv; }           // query heads per key/value head
  int kv_of(int head) const { return head / group(); }
  // Width of the fused q|k|v row for head size hs, and of the attention output.
  long qkv_width(long hs) const { return (q + 2L * kv) * hs; }
  long out_width(long hs) const { return q * hs; }
  bool operator==(const AttentionHeads&) const = default;
};

}  // namespace memfit::kernels
