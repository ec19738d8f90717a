// How memfit train and memfit plan show the planner's searches: the choice of --ckpt auto and
// --auto-batch with a short table of the runner-ups it rejected, and --max-model's winner with
// its neighbours in the family; as text or as JSON.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "memfit/plan/max_model.h"
#include "memfit/plan/search.h"

namespace memfit::cli {

// The choice (or that nothing fits), then chosen, slower and over-the-limit rows.
void print_search(const SearchResult& s, const std::string& note);
nlohmann::json search_json(const SearchResult& s);

void print_max_model(const MaxModelResult& r);
nlohmann::json max_model_json(const MaxModelResult& r);

}  // namespace memfit::cli
