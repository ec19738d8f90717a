#include "memfit/cli/search_output.h"

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "memfit/memory/pool.h"
#include "memfit/model/model_family.h"

namespace memfit::cli {

namespace {

double mib(size_t bytes) { return bytes / 1048576.0; }

// The precision levers a candidate pulled (Candidate::levers), as options.
std::vector<std::string> lever_options(const Candidate& c) {
  std::vector<std::string> out;
  if (c.levers & kLeverGradBf16) out.push_back("--grad-dtype bf16");
  if (c.levers & kLeverNoMaster) out.push_back("--master-weights none");
  return out;
}

// With the stage searched, a --zero column; over several ranks the peak is the largest rank's.
// The precision levers pulled, if any, after the estimate.
// The layout search's layout: "2spx2x1" (--tp 2 --sp, --pp 2, its data ranks from `world`).
std::string layout_text(const Candidate& c, int world) {
  return fmt::format("{}{}x{}x{}", c.tp, c.sp ? "sp" : "", c.pp, world / std::max(1, c.tp * c.pp));
}

// With the layout searched, a tp x pp x dp column first ("2spx2x1": --tp 2 --sp, --pp 2, one
// data rank).
void print_row(const std::string& status, const Candidate& c, bool with_stage, int world = 0) {
  std::string levers;
  for (const std::string& o : lever_options(c)) levers += "  " + o;
  if (world) fmt::print("  {:<10}", layout_text(c, world));
  fmt::print("  {:<22} {:<18} {:<14} {:>5} x {:<5} {}{:>12.1f} {:>10}{}\n", status, c.ckpt,
             act_compress_name(c.act_compress), c.batch, c.grad_accum,
             with_stage ? fmt::format("{:>5} ", c.zero) : std::string(), mib(c.peak_bytes),
             format_seconds(c.est_step_seconds), levers);
}

// A candidate's configuration and what the planner predicts for it.
nlohmann::json choice_json(const Candidate& c) {
  return {{"ckpt", c.ckpt},
          {"act_compress", act_compress_name(c.act_compress)},
          {"batch", c.batch},
          {"grad_accum", c.grad_accum},
          {"zero", c.zero},
          {"offload", c.offload},
          {"offload_params", c.offload_params},
          {"offload_grads", c.offload_grads},
          {"precision_levers", lever_options(c)},
          {"peak_bytes", c.peak_bytes},
          {"peak_rank", c.peak_rank},
          {"est_step_seconds", c.est_step_seconds},
          // The layout search's layout (0: the run's own, not searched).
          {"tp", c.tp},
          {"sp", c.sp},
          {"pp", c.pp}};
}

nlohmann::json candidate_json(const Candidate& c, size_t limit) {
  nlohmann::json j = choice_json(c);
  j["fits"] = c.fits;
  if (!c.fits) j["over_bytes"] = c.over(limit);
  return j;
}

// What a member's choice keeps on disk, for the table: "-", or e.g. "optim,params,grads".
std::string offload_column(const Candidate& c) {
  if (!c.offload && !c.offload_params) return "-";
  std::string s = c.offload ? "optim" : "";
  if (c.offload_params) s += s.empty() ? "params" : ",params";  // (LoRA: the frozen base alone)
  if (c.offload_grads) s += ",grads";
  return s;
}

nlohmann::json shape_json(const ShapeFit& f) {
  nlohmann::json j = choice_json(f.search.choice);
  j["n_layer"] = f.shape.n_layer;
  j["d_model"] = f.shape.d_model;
  j["n_head"] = f.shape.n_head;
  j["params"] = f.params;
  j["fits"] = f.fits();
  if (f.disk_bytes) {
    j["disk_bytes"] = f.disk_bytes;
    j["disk_fits"] = f.disk_fits;
  }
  if (f.shape.ffn_dim) {
    j["n_kv_head"] = f.shape.n_kv_head;
    j["ffn_dim"] = f.shape.ffn_dim;
  }
  return j;
}

}  // namespace

void print_search(const SearchResult& s, const std::string& note) {
  fmt::print("planner: {}\n", s.message);
  if (!note.empty()) fmt::print("planner: {}\n", note);
  // The layout search's ranks: every candidate's tp x pp x dp.
  const int world = s.with_layout ? s.world : 0;
  if (world) fmt::print("\n  {:<10}", "tp x pp x dp");
  fmt::print("{}  {:<22} {:<18} {:<14} {:>5}   {:<5} {}{:>12} {:>10}\n", world ? "" : "\n", "",
             "--ckpt", "--act-compress", "batch", "accum", s.with_stage ? "--zero " : "",
             "peak MiB", "est s/step");
  if (s.fits) print_row("chosen", s.choice, s.with_stage, world);
  for (const Candidate& c : s.slower)
    print_row(faster(s.choice, c) ? "fits, slower" : "fits, as fast, larger", c, s.with_stage,
              world);
  for (const Candidate& c : s.over)
    print_row(c.why_over(s.limit, s.disk_limit), c, s.with_stage, world);
  if (s.with_layout) {
    fmt::print("\nlayouts of {} ranks (tp x pp x dp; the fastest that fits is chosen, ties to the "
               "fewer model-parallel ranks):\n", s.world);
    for (const std::string& line : s.layouts) fmt::print("  {}\n", line);
  }
  fmt::print("\n");
}

nlohmann::json search_json(const SearchResult& s) {
  nlohmann::json j = {{"limit_bytes", s.limit},
                      {"fits", s.fits},
                      {"message", s.message},
                      {"candidates_planned", s.candidates.size()},
                      {"searched_micro_batch", s.with_batch},
                      {"searched_zero", s.with_stage},
                      {"searched_layout", s.with_layout},
                      // Over several ranks the limit is each rank's, a peak the largest rank's.
                      {"per_rank", s.per_rank}};
  j["choice"] = s.fits ? candidate_json(s.choice, s.limit) : nlohmann::json(nullptr);
  j["rejected_slower"] = nlohmann::json::array();
  for (const Candidate& c : s.slower) j["rejected_slower"].push_back(candidate_json(c, s.limit));
  j["rejected_over_limit"] = nlohmann::json::array();
  for (const Candidate& c : s.over) j["rejected_over_limit"].push_back(candidate_json(c, s.limit));
  if (s.with_layout) j["layouts"] = s.layouts;
  j["smallest"] = candidate_json(s.smallest, s.limit);
  j["smallest"]["dominant_category"] = std::string(category_name(s.smallest.dominant()));
  j["smallest"]["dominant_bytes"] = s.smallest.dominant_bytes();
  return j;
}

void print_max_model(const MaxModelResult& r) {
  const ShapeFit& b = r.best;
  const Candidate& c = b.search.choice;
  const std::string_view family = model_family(r.family).display_name;
  // Over several ranks the limit is each rank's and the stage is named.
  const bool stage = r.world > 1;
  const std::string ranks =
      (stage ? fmt::format(" per rank over {} ranks", r.world) : std::string()) +
      (r.policy ? fmt::format(" with --ckpt {}", r.policy->name()) : std::string());
  if (r.found) {
    fmt::print("memfit plan --max-model: the largest {}-family model that trains in {}{} is "
               "{} layers x {} wide ({} heads), {:.1f}M parameters, with {}: predicted peak {}{}, "
               "about {} s a step{}\n",
               family, format_mib(r.limit), ranks, b.shape.n_layer, b.shape.d_model,
               b.shape.n_head, b.params / 1e6, candidate_options(c, true, stage),
               format_mib(c.peak_bytes),
               r.world > 1 ? fmt::format(" (rank {}, the largest)", c.peak_rank) : std::string(),
               format_seconds(c.est_step_seconds),
               r.capped ? fmt::format(" (the search stops at {} layers)", kMaxFamilyLayers) : "");
    if (c.offload) {
      std::vector<std::string> what = {"the optimizer"};
      if (c.offload_params) what.push_back("the working weights");
      if (c.offload_grads) what.push_back("the gradients");
      std::string list = what.front();
      for (size_t i = 1; i < what.size(); ++i)
        list += (i + 1 == what.size() ? " and " : ", ") + what[i];
      fmt::print("with {} offloaded: the files take {:.1f} GiB of the {:.1f} GiB of disk "
                 "allowed (--disk-limit, else the free space of --offload-dir)\n",
                 list, b.disk_bytes / 1073741824.0, r.disk_limit / 1073741824.0);
    }
  } else {
    fmt::print("memfit plan --max-model: no {}-family model trains in {}{}; the smallest, {} "
               "layer x {} wide ({:.1f}M parameters), needs at least {} ({}); its largest part "
               "is {}, {}\n",
               family, format_mib(r.limit), ranks, b.shape.n_layer, b.shape.d_model,
               b.params / 1e6,
               format_mib(c.peak_bytes), candidate_options(c, true, stage),
               category_name(c.dominant()), format_mib(c.dominant_bytes()));
  }
  // With offload possible (given, or open to the search), what each member keeps on disk.
  const bool disk = r.disk_limit > 0;
  fmt::print("\n  {:>6} {:>6} {:>5} {:>10}  {:<18} {:<14} {:>5}   {:<5} {}{}{:>12} {:>10}  {}\n",
             "layers", "width", "heads", "params M", "--ckpt", "--act-compress", "batch", "accum",
             stage ? "--zero " : "", disk ? fmt::format("{:<19} ", "offload") : std::string(),
             "peak MiB", "est s/step", "fits");
  for (const ShapeFit& f : r.neighbours) {
    const Candidate& n = f.search.choice;
    fmt::print("  {:>6} {:>6} {:>5} {:>10.1f}  {:<18} {:<14} {:>5} x {:<5} {}{}{:>12.1f} {:>10}  {}\n",
               f.shape.n_layer, f.shape.d_model, f.shape.n_head, f.params / 1e6, n.ckpt,
               act_compress_name(n.act_compress), n.batch, n.grad_accum,
               stage ? fmt::format("{:>6} ", n.zero) : std::string(),
               disk ? fmt::format("{:<19} ", offload_column(n)) : std::string(), mib(n.peak_bytes),
               format_seconds(n.est_step_seconds),
               !f.search.fits ? "no, " + n.why_over(r.limit, f.search.disk_limit)
               : !f.disk_fits ? "no, " + disk_over(f.disk_bytes, r.disk_limit)
                              : std::string("yes"));
  }
  fmt::print("\n({} shapes planned; {}: docs/notes/planner.md)\n", r.shapes_planned,
             family_shape_rule(r.family));
}

nlohmann::json max_model_json(const MaxModelResult& r) {
  nlohmann::json j = {{"limit_bytes", r.limit},
                      {"world_size", r.world},
                      {"found", r.found},
                      {"capped", r.capped},
                      {"shapes_planned", r.shapes_planned},
                      // The policy every member was planned with; "auto": each one's fastest.
                      {"ckpt", r.policy ? r.policy->name() : std::string("auto")},
                      {"best", shape_json(r.best)}};
  j["neighbours"] = nlohmann::json::array();
  for (const ShapeFit& f : r.neighbours) j["neighbours"].push_back(shape_json(f));
  return j;
}

}  // namespace memfit::cli
