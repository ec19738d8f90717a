#include "memfit/model/pipeline_schedule.h"

#include <algorithm>

#include "memfit/core/error.h"

namespace memfit {

PipeSchedule parse_pipe_schedule(std::string_view text) {
  if (text == "gpipe") return PipeSchedule::gpipe;
  if (text == "1f1b") return PipeSchedule::one_f_one_b;
  if (text == "interleaved")
    MEMFIT_THROW(ConfigError, "pp-schedule",
                 "--pp-schedule interleaved is not one stage's schedule: it runs over "
                 "--pp-virtual chunks a rank (model/pipeline_interleaved.h; the run's "
                 "RunSpec::pipe_virtual, set where the run is resolved)");
  MEMFIT_THROW(ConfigError, "pp-schedule", "--pp-schedule {}: want gpipe or 1f1b", text);
}

std::string_view pipe_schedule_name(PipeSchedule s) {
  switch (s) {
    case PipeSchedule::gpipe: return "gpipe";
    case PipeSchedule::one_f_one_b: return "1f1b";
  }
  return "?";
}

std::vector<PipeOp> pipe_stage_ops(PipeSchedule schedule, int stage, int stages,
                                   int micro_batches) {
  if (stages < 1 || stage < 0 || stage >= stages || micro_batches < 1)
    MEMFIT_THROW(ConfigError, "pp-schedule", "stage {} of {} with {} micro-batches", stage,
                 stages, micro_batches);
  const int m = micro_batches;
  using K = PipeOp::Kind;
  std::vector<PipeOp> ops;
  if (schedule == PipeSchedule::gpipe) {
    for (int i = 0; i < m; ++i) ops.push_back({K::forward, i});
    for (int i = 0; i < m; ++i) ops.push_back({K::backward, i});
    return ops;
  }
  const int warmup = std::min(stages - stage - 1, m);
  int f = 0, b = 0;
  for (; f < warmup; ++f) ops.push_back({K::forward, f});
  while (f < m) {  // steady: one forward, one backward
    ops.push_back({K::forward, f++});
    ops.push_back({K::backward, b++});
  }
  while (b < m) ops.push_back({K::backward, b++});
  return ops;
}

int pipe_in_flight(const std::vector<PipeOp>& ops) {
  int now = 0, most = 0;
  for (const PipeOp& op : ops) {
    now += op.kind == PipeOp::Kind::forward ? 1 : -1;
    most = std::max(most, now);
  }
  return most;
}

bool pipe_runs_to_completion(const std::vector<std::vector<PipeOp>>& stage_ops) {
  const int P = static_cast<int>(stage_ops.size());
  // done[s][kind][micro]
  std::vector<std::vector<std::vector<bool>>> done(static_cast<size_t>(P));
  std::vector<size_t> next(static_cast<size_t>(P), 0);
  for (int s = 0; s < P; ++s) {
    int m = 0;
    for (const PipeOp& op : stage_ops[static_cast<size_t>(s)]) m = std::max(m, op.micro + 1);
    done[static_cast<size_t>(s)].assign(2, std::vector<bool>(static_cast<size_t>(m), false));
  }
  auto is_done = [&](int s, PipeOp::Kind k, int micro) {
    const auto& d = done[static_cast<size_t>(s)][k == PipeOp::Kind::forward ? 0 : 1];
    return micro < static_cast<int>(d.size()) && d[static_cast<size_t>(micro)];
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < P; ++s) {
      const auto& ops = stage_ops[static_cast<size_t>(s)];
      size_t& i = next[static_cast<size_t>(s)];
      while (i < ops.size()) {
        const PipeOp op = ops[i];
        const bool ready =
            op.kind == PipeOp::Kind::forward
                ? (s == 0 || is_done(s - 1, PipeOp::Kind::forward, op.micro))
                : (is_done(s, PipeOp::Kind::forward, op.micro) &&
                   (s == P - 1 || is_done(s + 1, PipeOp::Kind::backward, op.micro)));
        if (!ready) break;
        done[static_cast<size_t>(s)][op.kind == PipeOp::Kind::forward ? 0 : 1]
            [static_cast<size_t>(op.micro)] = true;
        ++i;
        progress = true;
      }
    }
  }
  for (int s = 0; s < P; ++s)
    if (next[static_cast<size_t>(s)] < stage_ops[static_cast<size_t>(s)].size()) return false;
  return true;
}

}  // namespace memfit
