// memory.html: a profile as one self-contained page that opens offline. The bytes live over the
// profiled steps as a stacked area per category (the arenas' bytes holding no live value hatched
// above them), the phases and the trainer's slices in bands underneath, the moment with the
// most live bytes marked with the buffers live then, the planner's peak and per-phase prediction
// drawn over the measurement, a tooltip and a legend. The drawing is the project's own small
// script (page/memory_page.js), compiled in; the data is a JSON block in the page.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "memfit/plan/memory_plan.h"
#include "memfit/profile/step_recorder.h"
#include "memfit/profile/timeline.h"

namespace memfit::profile {

// The data the page draws (the window only; times in ms), from the record, its timeline and
// its summary.json.
nlohmann::json page_data(const StepRecorder& recorder, const Timeline& timeline,
                         const nlohmann::json& summary, const std::string& title);

// The whole page for that data.
std::string memory_page_html(const nlohmann::json& data);

}  // namespace memfit::profile
