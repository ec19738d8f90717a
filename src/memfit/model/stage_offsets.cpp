#include "memfit/model/stage_offsets.h"

#include <string>
#include <vector>

#include "memfit/core/error.h"

namespace memfit {

namespace {

ElementRange table_range(const ParamLayout& layout) {
  for (const ParamInfo& p : layout.params())
    if (p.role == ParamRole::token_embedding) return {p.offset, p.offset + p.numel};
  return {};
}

}  // namespace

// The table starts the whole layout (and the first stage's), so a token table in a layout that
// does not start at the whole layout's element 0 is the last stage's copy.
ElementRange tied_table_copy(const ParamLayout& layout) {
  return layout.whole_offset() > 0 ? table_range(layout) : ElementRange{};
}

ElementRange tied_table(const ModelConfig& config, const ParamLayout& layout) {
  if (!config.pipelined() || !config.tie_embeddings) return {};
  return table_range(layout);
}

int64_t whole_index(const ParamLayout& layout, int64_t at) {
  if (layout.whole_offset() == 0) return at;
  const ElementRange copy = tied_table_copy(layout);
  return !copy.empty() && at >= copy.begin ? at - copy.begin : at + layout.whole_offset();
}

int64_t first_param_index(const ModelConfig& config) {
  if (!config.pipelined()) return 0;
  ModelConfig whole = config;
  whole.set_pipeline_stage({});
  const std::string first = ParamLayout(config).params().front().name;
  const ParamLayout layout(whole);
  const std::vector<ParamInfo>& all = layout.params();
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i].name == first) return static_cast<int64_t>(i);
  MEMFIT_THROW(Error, "params", "stage parameter {} is not a parameter of the whole model", first);
}

}  // namespace memfit
