// Memory categories: every byte memfit allocates is tagged with one, so the planner's
// prediction and the pool's measurement can be compared line by line.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace memfit {

enum class Category : uint8_t {
  params,       // the weights the model computes with
  master,       // FP32 master weights when `params` are in a lower precision
  grads,        // parameter gradients
  optimizer,    // optimizer state (moments, quantization scales)
  activations,  // tensors saved in forward for backward
  workspace,    // scratch that lives within one operation or one layer's backward
  comm,         // collective communication buffers
  staging,      // offload and I/O staging buffers
};
inline constexpr size_t kNumCategories = 8;

using CategoryBytes = std::array<size_t, kNumCategories>;

std::string_view category_name(Category c);
std::optional<Category> category_from_name(std::string_view name);
inline constexpr std::array<Category, kNumCategories> kAllCategories = {
    Category::params,      Category::master,    Category::grads, Category::optimizer,
    Category::activations, Category::workspace, Category::comm,  Category::staging};

}  // namespace memfit
