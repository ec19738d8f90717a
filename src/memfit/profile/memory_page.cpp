#include "memfit/profile/memory_page.h"

#include <algorithm>

#include <fmt/format.h>

#include "memfit/profile/page_assets.h"
#include "memfit/profile/page_text.h"

namespace memfit::profile {

using nlohmann::json;

namespace {

double ms(int64_t ns) { return static_cast<double>(ns) / 1e6; }

}  // namespace

json page_data(const StepRecorder& rec, const Timeline& tl, const json& summary,
               const std::string& title) {
  const StepPlan& plan = rec.plan();
  json d;
  d["title"] = title;
  d["window"] = {ms(tl.begin), ms(tl.end)};

  // The samples of the window: the one in force at its start (moved to it), then those in it.
  std::vector<const Sample*> in;
  for (size_t i = 0; i < tl.samples.size(); ++i) {
    const Sample& s = tl.samples[i];
    if (s.t > tl.end) break;
    if (s.t <= tl.begin) {
      if (in.empty()) in.push_back(&s);
      else in.back() = &s;
    } else {
      in.push_back(&s);
    }
  }
  CategoryBytes used{};
  for (const Sample* s : in)
    for (size_t c = 0; c < kNumCategories; ++c) used[c] |= s->pool[c] | s->live[c];
  json t = json::array(), total = json::array(), live = json::object(), cats = json::array();
  for (Category c : kAllCategories)
    if (used[static_cast<size_t>(c)]) {
      cats.push_back(std::string(category_name(c)));
      live[std::string(category_name(c))] = json::array();
    }
  for (size_t k = 0; k < in.size(); ++k) {
    // Rounded to a microsecond: the page needs no more, and it keeps the file small.
    t.push_back(std::round(std::max(ms(in[k]->t), ms(tl.begin)) * 1000) / 1000);
    total.push_back(in[k]->pool_total());
    for (Category c : kAllCategories)
      if (used[static_cast<size_t>(c)])
        live[std::string(category_name(c))].push_back(in[k]->live[static_cast<size_t>(c)]);
  }
  d["categories"] = std::move(cats);
  d["t"] = std::move(t);
  d["pool_total"] = std::move(total);
  d["live"] = std::move(live);

  json runs = json::array(), planned_runs = json::array();
  const json& phases = summary["phases"];
  for (const PhaseRun& r : rec.phase_runs()) {
    if (r.t1 < tl.begin || r.t0 > tl.end) continue;
    const Phase& p = plan.phases[r.phase];
    const bool training = rec.micro_batches()[r.micro_batch].training;
    runs.push_back({ms(r.t0), ms(r.t1), phase_kind_name(p.kind),
                    training ? p.name() : p.name() + " (evaluation)"});
    if (training && phases[r.phase].contains("planned_live_bytes"))
      planned_runs.push_back({ms(r.t0), ms(r.t1), phases[r.phase]["planned_live_bytes"]});
  }
  d["runs"] = std::move(runs);
  d["planned_runs"] = std::move(planned_runs);
  json slices = json::array();
  for (const SliceRun& s : rec.slices())
    if (s.t1 >= tl.begin && s.t0 <= tl.end)
      slices.push_back({ms(s.t0), ms(s.t1), s.name, std::string(slice_kind_name(s.kind)), s.depth});
  d["slices"] = std::move(slices);

  json buffers = json::array();
  for (const json& b : summary["top_buffers"])
    buffers.push_back({b["tag"], b["category"], b["bytes"], b["lifetime"]});
  d["peak"] = {{"t", ms(tl.live_peak_t)},
               {"bytes", tl.live_peak},
               {"where", summary["live_peak"]["where"]},
               {"phase", summary["live_peak"]["phase"].get<std::string>().empty()
                             ? summary["live_peak"]["where"]
                             : summary["live_peak"]["phase"]},
               {"buffers", std::move(buffers)}};
  d["shares"] = summary["shares"]["at_live_peak"];
  json groups = json::array();
  for (const json& g : summary["top_groups"])
    groups.push_back({g["group"], g["category"], g["bytes"], g["count"]});
  d["groups"] = std::move(groups);
  d["pool_peak"] = tl.pool_peak;
  d["disk"] = summary.contains("disk") ? summary["disk"] : json(nullptr);
  d["measured"] = summary["measured"]["by_category"];
  const json& planned = summary["planned"];
  d["planned"] = planned.is_null() ? json(nullptr)
                                   : json{{"peak", planned["peak_bytes"]},
                                          {"by_category", planned["by_category"]}};
  return d;
}

std::string memory_page_html(const json& data) {
  return page_html(data.value("title", std::string("memfit memory profile")), kMemoryPageCss,
                   R"(<h1 id="title"></h1>
<p class="sub" id="sub"></p>
<p class="sub" id="shares"></p>
<p class="sub" id="disk"></p>
<pre id="errors"></pre>
<div id="legend"></div>
<div id="plot"></div>
<div id="tip"></div>
<div style="display:flex;gap:40px;align-items:flex-start">
<div><h2 style="font-size:14px;margin:10px 0 0">Buffers live at the peak (largest first)</h2>
<table><thead><tr><th class="n">bytes</th><th>category</th><th>tag</th><th>lifetime</th></tr></thead>
<tbody id="buffers"></tbody></table></div>
<div><h2 style="font-size:14px;margin:10px 0 0">The same by group (* is a block number)</h2>
<table><thead><tr><th class="n">bytes</th><th>category</th><th>group</th><th class="n">buffers</th></tr></thead>
<tbody id="groups"></tbody></table></div>
</div>
<p class="sub">memfit train --profile: trace.json (open it in Perfetto or chrome://tracing) and
summary.json lie beside this page.</p>
)",
                   data.dump(), kMemoryPageJs);
}

}  // namespace memfit::profile
