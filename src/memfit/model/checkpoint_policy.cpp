#include "memfit/model/checkpoint_policy.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>

#include "memfit/core/error.h"

namespace memfit {

namespace {

[[noreturn]] void bad(std::string_view text) {
  MEMFIT_THROW(ConfigError, "config",
               "--ckpt must be none, full, selective, every:K (K >= 1), layers:LIST (block "
               "numbers or ranges A-B separated by commas) or auto (with --mem-limit), got '{}'",
               text);
}

int parse_int(std::string_view s, std::string_view whole) {
  int v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < 0) bad(whole);
  return v;
}

// "0-3,5,7,8": runs of three or more consecutive blocks as ranges, so that the planner's
// layers:0-46 reads as what it is.
std::string layer_list_text(const std::vector<int>& layers) {
  std::string out;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    if (!out.empty()) out += ',';
    if (j - i >= 2) {
      out += fmt::format("{}-{}", layers[i], layers[j]);
    } else {
      for (size_t k = i; k <= j; ++k) out += fmt::format("{}{}", k > i ? "," : "", layers[k]);
    }
    i = j + 1;
  }
  return out;
}

}  // namespace

CheckpointPolicy CheckpointPolicy::parse(std::string_view text) {
  CheckpointPolicy p;
  if (text == "auto")
    MEMFIT_THROW(ConfigError, "config",
                 "--ckpt auto is not a policy but a request to the planner, which replaces it "
                 "with one before the run is built (cli/options/resolve_train_spec.h: "
                 "resolve_auto)");
  if (text == "none") return p;
  if (text == "full") {
    p.kind = Kind::full;
    return p;
  }
  if (text == "selective") {
    p.kind = Kind::selective;
    return p;
  }
  if (text.starts_with("every:")) {
    p.kind = Kind::every;
    p.every = parse_int(text.substr(6), text);
    if (p.every < 1) bad(text);
    return p;
  }
  if (text.starts_with("layers:")) {
    p.kind = Kind::layers;
    std::string_view rest = text.substr(7);
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      const std::string_view item = rest.substr(0, comma);
      const size_t dash = item.find('-');
      const int first = parse_int(item.substr(0, dash), text);
      const int last =
          dash == std::string_view::npos ? first : parse_int(item.substr(dash + 1), text);
      if (last < first || last - first > 65535) bad(text);
      for (int l = first; l <= last; ++l) p.layers.push_back(l);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    }
    std::sort(p.layers.begin(), p.layers.end());
    p.layers.erase(std::unique(p.layers.begin(), p.layers.end()), p.layers.end());
    return p;
  }
  bad(text);
}

std::string CheckpointPolicy::name() const {
  switch (kind) {
    case Kind::none: return "none";
    case Kind::full: return "full";
    case Kind::selective: return "selective";
    case Kind::every: return fmt::format("every:{}", every);
    case Kind::layers: return "layers:" + layer_list_text(layers);
  }
  return "?";
}

std::vector<std::pair<int, int>> CheckpointPolicy::segments(int n_layer) const {
  std::vector<std::pair<int, int>> out;
  switch (kind) {
    case Kind::none:
    case Kind::selective: break;
    case Kind::full:
      for (int l = 0; l < n_layer; ++l) out.emplace_back(l, l);
      break;
    case Kind::every:
      for (int l = 0; l < n_layer; l += every) out.emplace_back(l, std::min(n_layer, l + every) - 1);
      break;
    case Kind::layers:
      for (int l : layers) {
        if (l >= n_layer)
          MEMFIT_THROW(ConfigError, "config", "--ckpt {}: block {} does not exist (the model has {})",
                       name(), l, n_layer);
        out.emplace_back(l, l);
      }
      break;
  }
  return out;
}

}  // namespace memfit
