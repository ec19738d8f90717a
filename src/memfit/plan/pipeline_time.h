// A pipelined step's time (issue 43, items 1 and 5; Note [Pipeline parallel], "The step's
// time"): each stage's own estimate (plan/step_time.h: its blocks, the embeddings on the first,
// the head on the last, the re-materialised forward on all but the last) split into what it
// runs per micro-batch and what it runs once a step, the activations and their gradients sent
// between stages priced on the link each cut spans (plan/link_model.h), and the schedule: GPipe
// and 1F1B both take m + p - 1 slots of the slowest stage's micro-batch, so the bubble is
// (p - 1)/m of the ideal m slots; the interleaved schedule over V chunks a rank takes m V + p - 1
// slots of a chunk's micro-batch (a V-th of a stage's), so its bubble is (p - 1)/(V m). The
// transfers are priced where the runner waits for them: its sends are nonblocking (MPI_Isend,
// waited only when the buffer is reused, by when they have arrived), its receives blocking and
// posted when the operation that reads them starts, so each message costs its transfer once, on
// its receiver (Note [Pipeline parallel], "The step's time"). Then `--pp-layers auto`: the
// cut that balances the stages' estimated step times, or their memory where the time-balanced
// cut does not fit --mem-limit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memfit/plan/calibration.h"
#include "memfit/plan/link_model.h"
#include "memfit/plan/memory_plan.h"
#include "memfit/plan/step_time.h"

namespace memfit {

struct PipelineTime {
  int stages = 1, micro_batches = 1;
  int virtual_stages = 1;  // V: chunks a rank (the interleaved schedule), 1 otherwise
  // Per stage (rank), in seconds: one micro-batch's compute over all its chunks
  // (StepTime::micro_batches() / m, its tensor collectives included), one micro-batch's
  // transfers it waits for (its input from the previous stage, its output's gradient from the
  // next; V of each with V chunks, less the first virtual stage's input and the last's
  // gradient), and what it runs once a step (the update, the data group's collectives).
  std::vector<double> compute, p2p, once;
  // One transfer between neighbouring stages: a micro-batch's boundary activations (or their
  // gradient), B x T x d_model f32, sent as one message.
  int64_t p2p_bytes = 0;
  // Per cut (stage s to s + 1): whether it crosses nodes (priced on the inter link). With V > 1
  // the wrap from the last stage to the first is one more cut, inter where any cut is (a
  // pipeline group's ranks are increasing in the stage).
  std::vector<bool> cut_inter;
  int slowest = 0;    // the stage whose slot sets the pace
  // max over stages of (compute + p2p) / V: one slot of the schedule (a chunk's micro-batch)
  double slot = 0;
  double step = 0;    // (m V + p - 1) slots, then the slowest stage's once-a-step part
  double once_most = 0;  // that part
  // m V + p - 1: the schedule's slots.
  int slots() const { return micro_batches * virtual_stages + stages - 1; }
  // Each stage's step as if it ran alone at the pipeline's pace: (m V + p - 1) of its own slots
  // and its once-a-step part. What `--pp-layers auto` balances.
  double stage_step(int s) const;
  // The fill and the drain: p - 1 slots.
  double bubble() const { return (stages - 1) * slot; }
  // (p - 1)/(V m): the bubble against the ideal m V slots; (p - 1)/m for GPipe and 1F1B.
  double bubble_fraction() const {
    return double(stages - 1) / (double(virtual_stages) * micro_batches);
  }
  // The bubble's share of the step.
  double bubble_share() const { return step > 0 ? bubble() / step : 0; }
};

// From each stage's estimate (`stages[s]`: plan_training(spec.stage(s)).step_time; with V > 1
// a rank's V chunks together), the micro-batches m, the boundary's bytes and each cut's link
// (`cuts[s]` between stages s and s + 1, `inter[s]` whether it crosses nodes), and the chunks a
// rank V. A rank's receives add to its slot (it waits for them; its sends overlap its next
// compute and cost it nothing), as its collectives add to its compute (a first-order
// estimate, Note [Step-time model]); the chunks of a rank are taken as equal (each a V-th of its
// compute and of its transfers).
PipelineTime pipeline_time(const std::vector<StepTime>& stages, int micro_batches,
                           int64_t boundary_bytes, const std::vector<Link>& cuts,
                           const std::vector<bool>& inter, const Calibration& rates,
                           int virtual_stages = 1);

// The same for a run of spec.pp() stages from their plans (plan_training(spec.stage(s))): the
// boundary B x T x d_model f32, each cut on spec.links' link between the stages' ranks.
PipelineTime plan_pipeline_time(const RunSpec& spec, const std::vector<PlanReport>& stages,
                                const Calibration& rates, int virtual_stages = 1);

// `--pp-layers auto`: the cut of spec.model.n_layer blocks into spec.pp() stages (spec.pipeline
// holds some cut of that many) whose largest estimated stage step (PipelineTime::stage_step) is
// the least, cutting only between checkpoint segments; where spec.mem_limit is set and that
// cut's largest stage does not fit it, the cut whose largest stage peak is the least instead
// (`by_memory`). Each stage's time and bytes are planned (plan_training) once per kind of stage
// (first, middle, last), block count and checkpoint segments within: blocks are alike, so a
// stage's plan depends on nothing else but its index's kept inputs (dist::pipeline_buffers),
// added exactly. Under --pp-schedule interleaved the pieces are the P x V chunks (spec.pipeline
// holds that many), each priced as a stage of its own: the cut whose slowest chunk's step,
// (m V + p - 1) x (its compute and receives a micro-batch) + its once-a-step part, is least (a
// chunk is a slot of the interleaved schedule; a rank's chunks together are not a contiguous
// piece a cut can balance); no memory fallback (a rank's bytes are its chunks' together).
struct StageSplit {
  std::vector<PipelineStage> stages;
  bool by_memory = false;
  // One line for the plan and the run: how the cut was chosen.
  std::string why;
};
StageSplit balance_stages(const RunSpec& spec);

}  // namespace memfit
