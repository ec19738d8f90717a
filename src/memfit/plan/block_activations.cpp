// The bytes each block keeps for its backward; see block_activations.h.
#include "memfit/plan/block_activations.h"

#include <algorithm>
#include <charconv>
#include <string_view>

namespace memfit {

namespace {

// "h.<l>.<name>": l and name; false for any other tag.
bool block_tag(std::string_view tag, int& layer, std::string_view& name) {
  if (!tag.starts_with("h.")) return false;
  const char* first = tag.data() + 2;
  const char* last = tag.data() + tag.size();
  auto [end, ec] = std::from_chars(first, last, layer);
  if (ec != std::errc() || end == first || end == last || *end != '.') return false;
  name = std::string_view(end + 1, static_cast<size_t>(last - end - 1));
  return !name.empty();
}

}  // namespace

BlockActivations block_activations(const StepPlan& plan, int n_layer) {
  BlockActivations out;
  out.per_block.assign(static_cast<size_t>(std::max(0, n_layer)), 0);
  for (const BufferSpec& b : plan.buffers) {
    int l = 0;
    std::string_view name;
    if (b.category != Category::activations || !block_tag(b.tag, l, name) || l < 0 ||
        l >= n_layer)
      continue;
    out.per_block[static_cast<size_t>(l)] +=
        b.shape.numel() * static_cast<int64_t>(dtype_size(b.dtype));
  }
  if (out.per_block.empty()) return out;
  out.layer = static_cast<int>(std::max_element(out.per_block.begin(), out.per_block.end()) -
                               out.per_block.begin());
  const std::string prefix = "h." + std::to_string(out.layer) + ".";
  for (const BufferSpec& b : plan.buffers)
    if (b.category == Category::activations && b.tag.starts_with(prefix))
      out.buffers[b.tag.substr(prefix.size())] +=
          b.shape.numel() * static_cast<int64_t>(dtype_size(b.dtype));
  return out;
}

}  // namespace memfit
