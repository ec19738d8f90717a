#include "memfit/memory/category.h"

namespace memfit {

std::string_view category_name(Category c) {
  switch (c) {
    case Category::params: return "params";
    case Category::master: return "master";
    case Category::grads: return "grads";
    case Category::optimizer: return "optimizer";
    case Category::activations: return "activations";
    case Category::workspace: return "workspace";
    case Category::comm: return "comm";
    case Category::staging: return "staging";
  }
  return "?";
}

std::optional<Category> category_from_name(std::string_view name) {
  for (Category c : kAllCategories)
    if (category_name(c) == name) return c;
  return std::nullopt;
}

}  // namespace memfit
