#include "memfit/model/pipeline_stages.h"

#include <charconv>

#include <fmt/format.h>

#include "memfit/core/error.h"

namespace memfit {

std::vector<PipelineStage> stages_from_counts(const std::vector<int>& counts) {
  std::vector<PipelineStage> out;
  const int P = static_cast<int>(counts.size());
  int first = 0;
  for (int s = 0; s < P; ++s) {
    out.push_back({s, P, first, first + counts[static_cast<size_t>(s)]});
    first = out.back().last;
  }
  return out;
}

std::vector<PipelineStage> split_stages_evenly(int n_layer, int stages) {
  if (stages < 1 || stages > n_layer)
    MEMFIT_THROW(ConfigError, "pp",
                 "--pp {} for a model of {} blocks: every stage needs at least one block", stages,
                 n_layer);
  std::vector<int> counts(static_cast<size_t>(stages), n_layer / stages);
  int extra = n_layer % stages;
  std::vector<int> order;  // the middle stages, then the first, then the last
  for (int s = 1; s + 1 < stages; ++s) order.push_back(s);
  order.push_back(0);
  if (stages > 1) order.push_back(stages - 1);
  for (int s : order)
    if (extra > 0) {
      ++counts[static_cast<size_t>(s)];
      --extra;
    }
  return stages_from_counts(counts);
}

std::vector<PipelineStage> split_stages(std::string_view pp_layers, int n_layer, int stages) {
  if (pp_layers.empty() || pp_layers == "auto") return split_stages_evenly(n_layer, stages);
  std::vector<int> counts;
  std::string_view rest = pp_layers;
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    int n = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), n);
    if (ec != std::errc{} || end != item.data() + item.size() || n < 1)
      MEMFIT_THROW(ConfigError, "pp-layers",
                   "--pp-layers {}: '{}' is not a block count of 1 or more (want auto, or one "
                   "count per stage such as 6,6)",
                   pp_layers, item);
    counts.push_back(n);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  int sum = 0;
  for (int n : counts) sum += n;
  if (static_cast<int>(counts.size()) != stages || sum != n_layer)
    MEMFIT_THROW(ConfigError, "pp-layers",
                 "--pp-layers {} gives {} stages of {} blocks in all; --pp {} over a model of {} "
                 "blocks needs {} counts summing to {}",
                 pp_layers, counts.size(), sum, stages, n_layer, stages, n_layer);
  return stages_from_counts(counts);
}

std::string describe_stages(const std::vector<PipelineStage>& stages) {
  std::string s;
  for (const PipelineStage& p : stages)
    s += fmt::format("{}{}-{}", s.empty() ? "" : ",", p.first, p.last - 1);
  return s;
}

}  // namespace memfit
