// The order in which a pipeline stage runs the step's micro-batches (`--pp-schedule`;
// Note [Pipeline parallel]): each stage's list of forwards and backwards, from which the engine
// runs and the planner counts how many micro-batches' activations a stage holds at once.
//   gpipe: every forward, then every backward (GPipe, Huang et al. 2019): a stage holds all m.
//   1f1b:  stage s of P runs min(P - s - 1, m) forwards to fill the pipe, then alternates one
//          forward and one backward, then drains the backwards (PipeDream-flush, Megatron-LM's
//          default): stage s holds at most min(P - s, m).
// Both run the backwards of each stage in micro-batch order 0, 1, ..., m - 1, as one process
// does, so every gradient is the same sum in the same order.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace memfit {

enum class PipeSchedule { gpipe, one_f_one_b };

// "gpipe", "1f1b". ConfigError naming --pp-schedule otherwise; "interleaved" too, saying it is
// the chunks' schedule (RunSpec::pipe_virtual), which the run's resolution sets instead.
PipeSchedule parse_pipe_schedule(std::string_view text);
std::string_view pipe_schedule_name(PipeSchedule s);

struct PipeOp {
  enum class Kind { forward, backward };
  Kind kind = Kind::forward;
  int micro = 0;  // the micro-batch, 0 .. m - 1
  bool operator==(const PipeOp&) const = default;
};

// Stage `stage` of `stages`' operations for m micro-batches, in order: each micro-batch's
// forward before its backward, each kind in micro-batch order.
std::vector<PipeOp> pipe_stage_ops(PipeSchedule schedule, int stage, int stages,
                                   int micro_batches);

// The most micro-batches a stage has run the forward of and not yet the backward, over `ops`:
// how many micro-batches' stage inputs (and boundary gradients) it keeps at once.
int pipe_in_flight(const std::vector<PipeOp>& ops);

// Whether the stages' lists can all run to the end when a forward waits for the previous
// stage's forward of its micro-batch and a backward for the next stage's backward of it (sends
// never wait: they are posted and finished later). The schedules above always can; a test
// checks it, and it says what a hand-written order would have to respect.
bool pipe_runs_to_completion(const std::vector<std::vector<PipeOp>>& stage_ops);

}  // namespace memfit
