#include "memfit/plan/run_spec.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "memfit/core/error.h"
#include "memfit/model/pipeline_interleaved.h"
#include "memfit/model/sequence_parallel.h"
#include "memfit/kernels/cpu/quant_weight.h"
#include "memfit/optim/sliced_optimizer.h"
#include "memfit/optim/state_runs.h"
#include "memfit/optim/tensor_split.h"

namespace memfit {

namespace {

// LoRA under ZeRO stages 1-2, with the optimizer or the gradients offloaded, and with the base
// offloaded over several ranks at stage 0: refused before anything is built, saying why (Note
// [LoRA], "ZeRO and offload: what is refused, and why").
void refuse_lora_sharding(const RunSpec& spec) {
  ModelConfig model = spec.model;
  model.finalize();
  const int64_t adapters = LoraLayout(model, spec.lora).total();
  if (spec.zero_auto)
    MEMFIT_THROW(ConfigError, "config",
                 "--zero auto with --lora-rank: give --zero 0 (the base whole on every rank) or "
                 "--zero 3 (the frozen base sharded and gathered per block); stages 1-2 are "
                 "refused (give --zero 1 or 2 to see why)");
  if (spec.zero == 1 || spec.zero == 2)
    MEMFIT_THROW(ConfigError, "config",
                 "--zero {} with --lora-rank is not built: LoRA's optimizer state{} are the "
                 "adapters' alone ({} f32 elements), while ZeRO's shards are cut over the base's "
                 "layout, which LoRA neither steps nor keeps gradients for: the stage would shard "
                 "nothing that exists. Sharding the adapters needs shards of their own layout, "
                 "the update's all-gather of their weights and a sharded adapter_optimizer save, "
                 "for little to save. Give --zero 0 (the adapters replicated and their gradients "
                 "all-reduced) or --zero 3 (the frozen base sharded too)",
                 spec.zero, spec.zero == 2 ? " and gradients" : "", adapters);
  // Offload (Note [LoRA], "The frozen base on disk"): the frozen base's blocks in a file,
  // read only, in one process or each rank's shard at stage 3; the adapters and their
  // optimizer stay in RAM.
  if (spec.offload.optimizer)
    MEMFIT_THROW(ConfigError, "config",
                 "--offload-optimizer with --lora-rank is not built: LoRA's optimizer state is "
                 "the adapters' alone ({} f32 elements), kept in RAM with them, while the "
                 "offloaded update streams the base's layout, which LoRA never steps. To keep "
                 "the frozen base on disk give --offload-params nvme --offload-dir DIR alone",
                 adapters);
  if (spec.offload.grads)
    MEMFIT_THROW(ConfigError, "config",
                 "--offload-grads with --lora-rank: the frozen base has no gradients to "
                 "offload, and the adapters' ({} f32 elements) stay in RAM; drop "
                 "--offload-grads (--offload-params nvme keeps the base on disk)",
                 adapters);
  if (spec.offload.params && spec.world > 1 && spec.zero != 3)
    MEMFIT_THROW(ConfigError, "config",
                 "--offload-params with --lora-rank under {} ranks at --zero {}: every rank would "
                 "hold a whole copy of the frozen base's file; give --zero 3 (each rank's shard "
                 "of the base in its file) or one process",
                 spec.world, spec.zero);
}

// LoRA under --tp (Note [LoRA], "Under --tp"): the adapters split as their layers' weights.
// Not built: dropout (its mask numbers the elements of the whole input, of which a row-parallel
// rank holds some columns), adapters on key/value heads replicated over ranks (tp above
// n_kv_head: their B's gradients would be summed over the replicas), ZeRO stage 3 with --tp
// (untested), an optimizer that is not element-wise (its blocks or rows over a rank's slices
// are not one process's), and with a save or resume state that is not f32 (the save gathers
// the slices of f32 state into whole tensors).
void refuse_lora_tensor_split(const RunSpec& spec) {
  const ModelConfig& m = spec.model;
  // --pp (Note [LoRA], "Under --pp"): each stage its own blocks' adapters. Not built: dropout
  // (the pipeline's micro-batches draw no mask), ZeRO stage 3 (untested).
  if (spec.pp() > 1 && (spec.lora.dropout > 0 || spec.zero == 3))
    MEMFIT_THROW(ConfigError, "config",
                 "--lora-rank with --pp {} and {} is not built yet (Note [LoRA], \"Under --pp\")",
                 spec.pp(),
                 spec.lora.dropout > 0
                     ? "--lora-dropout: the pipeline's micro-batches draw no dropout mask"
                     : "--zero 3: the gathered base's stages with adapters are untested");
  if (m.tp <= 1) return;
  const std::vector<std::string> targets = lora_chosen_targets(spec.lora, m.family);
  const bool kv = std::find(targets.begin(), targets.end(), "k") != targets.end() ||
                  std::find(targets.begin(), targets.end(), "v") != targets.end();
  const char* why =
      spec.lora.dropout > 0
          ? "--lora-dropout: the mask numbers the elements of a layer's whole input, of which a "
            "row-parallel rank holds some columns"
      : kv && m.kv_replicas() > 1
          ? "adapters on k or v with --tp above --n-kv-head: the key/value heads are replicated "
            "over ranks, and their B's gradients would need summing over the replicas; leave k "
            "and v out of --lora-targets or give a --tp dividing the key/value heads"
      : spec.zero == 3 ? "--zero 3: the gathered base's blocks with split adapters are untested"
      : spec.optim.name != "adamw" && spec.optim.name != "sgd" && spec.optim.name != "lion"
          ? "an --optim other than adamw, sgd or lion: the adapters' optimizer steps a rank's "
            "slices as one process only where it is element-wise"
      : (spec.saves || spec.resumed) && spec.optim.state_dtype != DType::f32
          ? "--optim-state-dtype bf16 with --save or --resume: the save gathers the slices of "
            "f32 state into whole tensors"
          : nullptr;
  if (why)
    MEMFIT_THROW(ConfigError, "config",
                 "--lora-rank with --tp {} and {} is not built yet (Note [LoRA], \"Under --tp\")",
                 m.tp, why);
}

// A save or resume over a split layout (--tp, --pp) writes and reads each rank's optimizer state
// as the whole model's (optim/state_runs.h; Note [Checkpoints across layouts], "Optimizer state
// of every kind"): refused before the first step where a rank's state does not map.
void refuse_layout_state(const RunSpec& spec) {
  if (!(spec.saves || spec.resumed) || spec.lora.enabled() || (spec.model.tp <= 1 && spec.pp() == 1))
    return;
  // Every stage's layout (interleaved: every chunk's, P x V of them; the head's is the last).
  const int stages = spec.pp() > 1 ? static_cast<int>(spec.pipeline.size()) : 1;
  for (int s = 0; s < stages; ++s)
    if (const std::optional<std::string> why =
            layout_state_refusal(spec.optim, spec.stage(s).model))
      MEMFIT_THROW(ConfigError, "config",
                   "--save or --resume with --tp {} --pp {} and --optim {} is refused: a "
                   "checkpoint holds the whole model's optimizer state, and this rank's does not "
                   "map onto it ({}); give widths whose slices cut whole quantisation blocks, or "
                   "an element-wise optimizer (adamw, lion, sgd), or save without --tp (Note "
                   "[Checkpoints across layouts])",
                   spec.model.tp, spec.pp(), spec.optim.name, *why);
}

}  // namespace

PrecisionOptions run_precision(PrecisionOptions asked, const LoraOptions& lora) {
  if (lora.enabled() && asked.precision == Precision::bf16) asked.master_weights = false;
  return asked;
}

ActivationOptions RunSpec::activation_options() const {
  ActivationOptions o;
  o.attention = attention;
  o.lm_head_group = lm_head_group;
  o.ckpt = ckpt;
  o.act_compress = act_compress;
  o.precision = precision.precision;
  o.grads_in_arena = grads_share_arena();
  o.lora_rank = lora.rank;
  o.lora_dropout = lora.enabled() ? lora.dropout : 0.0f;
  o.base_quantized = lora.enabled() && lora.base_quant().has_value();
  o.sequence_parallel = sp;
  return o;
}

StateOptions RunSpec::state_options() const {
  StateOptions o;
  o.zero = zero;
  o.working_dtype = half_dtype(precision.precision);
  o.master_weights = precision.precision != Precision::fp32 && precision.master_weights;
  o.offload_optimizer = offload.optimizer;
  o.offload_params = offload.params;
  o.offload_grads = offload.grads;
  o.offload_dir = offload.dir;
  o.prefetch_depth = prefetch_depth;
  o.persist_threshold = persist_threshold;
  o.sync_every_micro_batch = sync_every_micro_batch;
  o.grad_dtype = grad_dtype;
  o.bucket_bytes = bucket_bytes;
  o.update_in_backward = update_in_backward;
  o.frozen_base = lora.enabled();
  // FP8 storage (Note [FP8], "Storage"; StatePlacement::params_fp8 says where it is built):
  // a pipeline stage holds whole matrices, each encoded with its own amax's scale; under --tp
  // the tensor group agrees on each matrix's scale ("Under --tp and --pp").
  o.fp8_weights = precision.precision == Precision::fp8;
  return o;
}

// What --tp is built with so far (Note [Tensor parallel], "What `--tp` does today"): fp32, bf16
// (with or without master weights) and fp16; the optimizers sliced_optimizer_refusal accepts
// (AdamW with f32 or bf16 moments, SGD, Lion, Adam-mini; 8-bit AdamW and Lion, and 4-bit AdamW,
// where the slices cut whole quantisation blocks); ZeRO 0-3 over the data group of each tensor
// slice; every checkpoint policy (recomputation re-issues the row-parallel all-reduces);
// --act-compress; --grad-dtype bf16; --sp (check_sequence_parallel); --zero auto and --ckpt
// auto (the search plans each candidate per rank of the split model, its state in RAM); saves, resumes and --init-from at
// any layout (Note [Checkpoints across layouts]), with the optimizer offloaded too. Each refusal names the option and says why it
// is not built.
void RunSpec::check_tensor_parallel() const {
  struct Refusal {
    const char* option;
    const char* why;
  };
  const std::optional<Refusal> refused =
      offload.grads
          ? Refusal{"--offload-grads",
                    "--offload-grads nvme is for one process (its file is checked unit by unit, "
                    "where the tensor group's norm needs each parameter's slice apart); under "
                    "--tp, as under several data ranks, the gradients stay in RAM: "
                    "--offload-optimizer and --offload-params are built, each rank's slices in "
                    "its own files"}
      : offload.params && lora.enabled()
          ? Refusal{"--offload-params and --lora-rank",
                    "the frozen base's file holds a rank's slices under --tp, and the split "
                    "adapters over an offloaded base are untested"}
                  : std::optional<Refusal>{};
  if (refused)
    MEMFIT_THROW(ConfigError, "config",
                 "--tp {} with {} is not built yet: {} (Note [Tensor parallel])", model.tp,
                 refused->option, refused->why);
  // The optimizers that step a rank's slices as one process steps the whole model
  // (optim/sliced_optimizer.h; Note [Tensor parallel], "Optimizers").
  if (const std::optional<std::string> why = sliced_optimizer_refusal(optim, model))
    MEMFIT_THROW(ConfigError, "config", "--tp {} with --optim {} is refused: {} (Note [Tensor "
                 "parallel], \"Optimizers\")",
                 model.tp, optim.name, *why);
  // (Adam-mini and 4-bit AdamW take the tensor group in the update, --update-in-backward's
  // per-unit optimizers and the offloaded pieces' too: optim/tensor_split.h.)
}

RunSpec RunSpec::stage(int s) const {
  RunSpec r = *this;
  if (pp() == 1) return r;
  MEMFIT_CHECK(s >= 0 && s < static_cast<int>(pipeline.size()), "pipeline", "stage {} of {}", s,
               pipeline.size());
  r.model.set_pipeline_stage(pipeline[static_cast<size_t>(s)]);
  return r;
}

// What --pp is built with so far (Note [Pipeline parallel], "What remains"): fp32, bf16 (with
// or without master weights), fp16 or fp8, every optimizer (each stage steps its own whole
// parameters: Note [Pipeline parallel], "Optimizers"), any ZeRO stage over the data group
// (each stage's own units reduced and gathered: Note [Pipeline parallel], "ZeRO"), f32 or bf16
// gradients, --act-compress (each stage compresses its own blocks' saved activations), no
// LoRA, offload or fused update, no search; tied or untied, and
// checkpoint segments inside the stages. Saves and resumes at any layout (Note [Checkpoints
// across layouts]). With --tp each stage is a tensor group (Note [Pipeline
// parallel], "Stages of tensor groups"), and --tp's own rules (check_tensor_parallel) hold too.
// Each refusal names the option and the value.
void RunSpec::check_pipeline() const {
  if (pp() == 1) return;
  const int P = pp();
  check_interleaved_run();
  const char* refused = ckpt_auto     ? "--ckpt auto (the search plans one model whole)"
                        : auto_batch  ? "--auto-batch (the search plans one model whole)"
                        : zero_auto ? "--zero auto (the search plans one model whole)"
                        // The gradient file's layout (offload::GradFileLayout) is one
                        // process's units: the embeddings, the blocks, the tail; a stage's
                        // units are a run of them (Note [NVMe offload], "Under --pp").
                        : offload.grads
                            ? "--offload-grads nvme (the gradient file is laid out as one "
                              "process's units: the embeddings first, the tail last, which a "
                              "stage does not hold both of)"
                                                               : nullptr;
  if (refused)
    MEMFIT_THROW(ConfigError, "config",
                 "--pp {} with {} is not built yet: pipeline parallelism trains in fp32, bf16, "
                 "fp16 or fp8 at any ZeRO stage with every optimizer, f32 or bf16 gradients, "
                 "compressed activations or not (Note [Pipeline parallel])",
                 P, refused);
  ModelConfig first = model;  // ConfigError naming --pp for a bad cut
  for (const PipelineStage& s : pipeline) first.set_pipeline_stage(s);
  // Each stage recomputes from inputs it holds: a checkpoint segment may not cross a cut.
  for (const PipelineStage& s : pipeline)
    for (const auto& [a, b] : ckpt.segments(model.n_layer))
      if ((a < s.first) != (b < s.first) || (a < s.last) != (b < s.last))
        MEMFIT_THROW(ConfigError, "config",
                     "--ckpt {} recomputes blocks {}-{} together, across the cut of --pp {} "
                     "(stage {} holds blocks {}-{}; the stages' blocks: {}); give segments "
                     "inside the stages",
                     ckpt.name(), a, b, P, s.index, s.first, s.last - 1,
                     describe_stages(pipeline));
}

void RunSpec::check() const {
  check_optim_config(optim);
  // Note [FP8], "What is built": the blocks' own linears; LoRA's adapters (and so QLoRA's NF4
  // base) have no FP8 path.
  if (precision.precision == Precision::fp8 && lora.enabled())
    MEMFIT_THROW(ConfigError, "config",
                 "--lora-rank with --precision fp8 is not built: the adapters' GEMMs have no FP8 "
                 "path; use --precision bf16 for LoRA");
  if (lora.enabled()) {
    check_lora_options(lora, model.family);
    refuse_lora_sharding(*this);
    refuse_lora_tensor_split(*this);
    // What is built (Note [LoRA], "What remains"): fp32 or bf16 (the base bf16 alone, no
    // master weights: resolve_run), one process (the frozen base in RAM, or its blocks in a
    // file: "The frozen base on disk") or data-parallel ranks at stage 0 (the adapters'
    // gradients all-reduced whole: "Over data-parallel ranks") or stage 3 (the frozen base
    // sharded and gathered too: "ZeRO stage 3"), every weight in RAM.
    const char* refused = precision.precision == Precision::fp16 ? "--precision fp16"
                          : precision.master_weights && precision.precision != Precision::fp32
                              ? "master weights for the frozen base"
                          : world > 1 && sync_every_micro_batch ? "--sync-every-micro-batch"
                          : (zero != 0 && zero != 3) || zero_auto ? "--zero"
                          : grad_dtype != DType::f32 ? "--grad-dtype bf16"
                          : update_in_backward       ? "--update-in-backward"
                                                     : nullptr;
    if (refused)
      MEMFIT_THROW(ConfigError, "config",
                   "--lora-rank with {} is not built: LoRA trains in fp32 or bf16, in one process "
                   "or over data-parallel ranks at --zero 0 or 3, the frozen base in RAM or "
                   "(--offload-params nvme, not at --zero 0 over ranks) on disk (no --zero 1-2, no "
                   "--offload-optimizer or --offload-grads, no --update-in-backward, no "
                   "--sync-every-micro-batch)",
                   refused);
  }
  check_base_dtype();
  if (model.tp > 1) check_tensor_parallel();
  check_pipeline();
  refuse_layout_state(*this);
  if (sp && model.tp <= 1)
    MEMFIT_THROW(ConfigError, "config",
                 "--sp splits the sequence over the tensor group: it needs --tp 2 or more (got "
                 "--tp {})",
                 model.tp);
  check_sequence_parallel(model, activation_options(), T);
  if (tp_overlap && model.tp <= 1)
    MEMFIT_THROW(ConfigError, "config",
                 "--tp-overlap on overlaps the tensor group's sums with compute: it needs --tp 2 "
                 "or more (got --tp {})",
                 model.tp);
  // The kernels and the step plan count a micro-batch's rows (tokens) in 32-bit integers.
  if (int64_t{batch} * T > std::numeric_limits<int32_t>::max())
    MEMFIT_THROW(ConfigError, "config",
                 "--batch {} x --seq-len {} = {} tokens a micro-batch; at most {} (2^31 - 1): "
                 "use --grad-accum for a larger batch",
                 batch, T, int64_t{batch} * T, std::numeric_limits<int32_t>::max());
  if (zero < 0 || zero > 3)
    MEMFIT_THROW(ConfigError, "config", "--zero must be 0, 1, 2 or 3, got {}", zero);
  const StateOptions state = state_options();
  // Under several ranks each rank offloads its own shard of the state (Note [NVMe offload],
  // "Under ZeRO"): stages 1 to 3, where the state is sharded. Stage 0 would have every rank
  // write the whole state. (--zero auto with offload searches stages 1 to 3: search_training.)
  if (offload.optimizer && !zero_auto && !StatePlacement::allows_optimizer_offload(state, world))
    MEMFIT_THROW(ConfigError, "config",
                 "--offload-optimizer nvme under {} ranks offloads each rank's shard of the "
                 "optimizer state, so it needs --zero 1, 2 or 3 (got --zero 0: every rank would "
                 "write the whole state)",
                 world);
  // --offload-params (Note [NVMe offload], "Working weights on disk"): the update writes each
  // block's new working weights back to the file as it streams the state, so the state must
  // stream (with it in RAM the update would need every block's weights in RAM at once); and one
  // process, or ZeRO stage 3 (each rank's shard in its file, read, then all-gathered): below
  // stage 3 every rank holds and would write the whole working copy.
  // (LoRA's frozen base is never written: its file needs no update; Note [LoRA], "The frozen
  // base on disk".)
  if (offload.params && !offload.optimizer && !lora.enabled())
    MEMFIT_THROW(ConfigError, "config",
                 "--offload-params nvme needs --offload-optimizer nvme: the update that streams "
                 "the optimizer state a piece at a time is what writes each block's new working "
                 "weights back to the file");
  // (With --zero auto over several ranks the stage is not chosen yet: refused too.)
  if (offload.params &&
      (zero_auto ? world > 1 : !StatePlacement::allows_params_offload(state, world)))
    MEMFIT_THROW(ConfigError, "config",
                 "--offload-params nvme under {} ranks offloads each rank's shard of the working "
                 "weights, so it needs --zero 3 (got --zero {}: every rank would hold and write "
                 "the whole working copy)",
                 world, zero_auto ? std::string("auto") : std::to_string(zero));
  if (prefetch_depth < 0)
    MEMFIT_THROW(ConfigError, "config", "--prefetch-depth must be 0 or more, got {}",
                 prefetch_depth);
  if (persist_threshold < 0)
    MEMFIT_THROW(ConfigError, "config", "--persist-threshold must be 0 or more elements, got {}",
                 persist_threshold);
  check_precision_options(precision);
  check_activation_options(activation_options());
  // (LoRA's optimizer steps the f32 adapters: no stochastic rounding there.)
  if (!precision.master_weights && !lora.enabled() && optim.name != "adamw" &&
      optim.name != "adamw8bit" && !is_apollo(optim.name))
    MEMFIT_THROW(ConfigError, "config",
                 "--master-weights none updates bf16 weights with stochastic rounding, which "
                 "only --optim adamw, adamw8bit, apollo and apollo-mini implement; got {}",
                 optim.name);
  if (offload.optimizer && offload.dir.empty())
    MEMFIT_THROW(ConfigError, "config",
                 "--offload-optimizer nvme keeps the optimizer state in files, so it needs "
                 "--offload-dir DIR (a directory on the disk to use)");
  if (offload.params && offload.dir.empty())
    MEMFIT_THROW(ConfigError, "config",
                 "--offload-params nvme keeps the blocks' weights in a file, so it needs "
                 "--offload-dir DIR (a directory on the disk to use)");
  // The offloaded update reads the gradients from their file; an update in RAM would need the
  // whole slab back. Over several ranks the gradients are already per unit and a shard
  // (stages 2-3) or all-reduced whole (stages 0-1): not built (Note [NVMe offload]).
  if (offload.grads && !offload.optimizer)
    MEMFIT_THROW(ConfigError, "config",
                 "--offload-grads nvme is read by the offloaded update, so it needs "
                 "--offload-optimizer nvme");
  if (offload.grads && world > 1)
    MEMFIT_THROW(ConfigError, "config",
                 "--offload-grads nvme is for one process; under {} ranks use --zero 2 or 3, "
                 "whose gradients are already a shard per rank",
                 world);
  check_update_in_backward();
  // Given --offload-dir alone, a search may offload, and its offloaded candidates must fit the
  // limit (Note [NVMe offload], "Choosing offload").
  if (offload.disk_limit && !offload.optimizer && !offload.params && !offload_open)
    MEMFIT_THROW(ConfigError, "config",
                 "--disk-limit bounds the offload files, so it needs --offload-optimizer nvme "
                 "(or --offload-dir with --ckpt auto / --auto-batch / --zero auto, which may "
                 "offload)");
}

void RunSpec::check_update_in_backward() const {
  if (!update_in_backward) return;
  // Note [Update in backward]: each unit is stepped once, as its one backward of the step ends.
  if (grad_accum > 1)
    MEMFIT_THROW(ConfigError, "config",
                 "--update-in-backward steps each unit as its backward ends, so a step has one "
                 "micro-batch: --grad-accum {} is refused (use --grad-accum 1 with a larger "
                 "--batch, or drop --update-in-backward)",
                 grad_accum);
  if (precision.precision == Precision::fp16)
    MEMFIT_THROW(ConfigError, "config",
                 "--update-in-backward with --precision fp16: the loss scale's overflow check "
                 "needs every gradient before any unit is stepped; use --precision bf16 (no loss "
                 "scale) or drop --update-in-backward");
  // Over ranks each unit is reduce-scattered and this rank's part stepped from the unit's
  // buffer: stages 2-3, whose gradients are already per unit and a shard. (With --zero auto
  // over several ranks the stage is not chosen yet: refused too.)
  if (zero_auto ? world > 1 : !StatePlacement::allows_update_in_backward(state_options(), world))
    MEMFIT_THROW(ConfigError, "config",
                 "--update-in-backward under {} ranks reduce-scatters each unit and steps this "
                 "rank's part of it at once, so it needs --zero 2 or 3 (got --zero {})",
                 world, zero_auto ? std::string("auto") : std::to_string(zero));
  // With the optimizer offloaded the streamed update runs inside the backward, a unit at a
  // time (Note [Update in backward], "With offload"): each unit's gradients are consumed as its
  // backward ends, so there is nothing to put in a gradient file.
  if (offload.grads)
    MEMFIT_THROW(ConfigError, "config",
                 "--offload-grads nvme with --update-in-backward: each unit's gradients are "
                 "consumed by its update as its backward ends and never kept (RAM holds one unit "
                 "buffer), so there is no gradient file to write; drop --offload-grads");
  if (grad_dtype != DType::f32)
    MEMFIT_THROW(ConfigError, "config",
                 "--update-in-backward with --grad-dtype bf16: the unit's gradients are stepped "
                 "from the one f32 slot the units take in turn and never kept (the kernels add "
                 "into f32), so there is nothing to hold in bf16; drop --grad-dtype bf16");
  // --pp (Note [Update in backward], "Under --pp"): a tied table's gradient has a part on the
  // first stage and a part on the last, summed between them after the backward, while each
  // stage would step its part as its own backward ends.
  if (pp() > 1 && model.tie_embeddings)
    MEMFIT_THROW(ConfigError, "config",
                 "--update-in-backward with --pp {} and tied embeddings is not built: the "
                 "table's gradient has the first stage's part and the last stage's, summed "
                 "between them after both backwards, so neither stage can step it as its own "
                 "backward ends; use --tie-embeddings false (LLaMA) or drop --update-in-backward",
                 pp());
}

// --base-dtype (Note [NF4 weights], "QLoRA"; Note [Int8 weights]): the frozen base's storage,
// so LoRA's alone; bf16 is --precision bf16's base; a quantized base (NF4, QLoRA, or int8) is
// built in one process with every weight in RAM, in fp32 or bf16 (the rules LoRA's own list
// above has, named here again so that a LoRA built under ZeRO or offload still refuses a
// quantized base). Not with --offload-params: the file holds the working layout's blocks,
// while a quantized base keeps the blocks' linears in a buffer of their own
// (model/quant_base.h) that the file source neither reads nor writes.
void RunSpec::check_base_dtype() const {
  if (lora.base == LoraBase::precision) return;
  if (!lora.enabled())
    MEMFIT_THROW(ConfigError, "config",
                 "--base-dtype {} stores the frozen base of a LoRA run: it needs --lora-rank",
                 lora_base_name(lora.base));
  if (lora.base == LoraBase::bf16 && precision.precision != Precision::bf16)
    MEMFIT_THROW(ConfigError, "config",
                 "--base-dtype bf16 is the base of --precision bf16 (got --precision {}): "
                 "give --precision bf16, or --base-dtype nf4 or int8",
                 precision_name(precision.precision));
  const std::optional<kernels::WeightQuant> quant = lora.base_quant();
  if (!quant) return;
  if (offload.params)
    MEMFIT_THROW(ConfigError, "config",
                 "--base-dtype {0} with --offload-params is not built: the file holds the "
                 "blocks of the working weights' layout, while the {0} base keeps the blocks' "
                 "linears quantized in a buffer of their own, which the file source does not "
                 "read; give --base-dtype bf16 (with --precision bf16) to keep the base on "
                 "disk, or the {0} base in RAM",
                 kernels::weight_quant_name(*quant));
  const char* refused = precision.precision == Precision::fp16 ? "--precision fp16"
                        : world > 1 || model.tp > 1 || pp() > 1 ? "several ranks"
                        : zero != 0 || zero_auto               ? "--zero"
                        : offload.optimizer || offload.grads   ? "--offload-*"
                        : grad_dtype != DType::f32 ? "--grad-dtype bf16"
                        : update_in_backward       ? "--update-in-backward"
                                                   : nullptr;
  if (refused)
    MEMFIT_THROW(ConfigError, "config",
                 "--base-dtype {} with {} is not built: the {} base trains in fp32 or bf16, in one "
                 "process, with every weight in RAM",
                 kernels::weight_quant_name(*quant), refused,
                 *quant == kernels::WeightQuant::nf4 ? "NF4 (QLoRA)" : "int8");
}

// --pp-schedule interleaved (Note [Pipeline parallel], "Interleaved"): what a rank of V chunks
// is built with: fp32, bf16, fp16 or fp8, f32 or bf16 gradients, every optimizer, --act-compress,
// LoRA, ZeRO 0-3 over the data group, --tp, --offload-optimizer and --offload-params (each
// chunk's files in its virtual stage's directory; no save or resume of them yet),
// --sync-every-micro-batch, the P x V chunks each at least one block, --grad-accum a multiple
// of --pp. The refusals name the values.
void RunSpec::check_interleaved_run() const {
  if (pipe_virtual < 1)
    MEMFIT_THROW(ConfigError, "config", "--pp-virtual must be 1 or more, got {}", pipe_virtual);
  if (!interleaved()) return;
  const int P = pp();
  check_interleaved(P, pipe_virtual, grad_accum);
  // --update-in-backward steps each unit as the step's one backward of it ends (--grad-accum
  // 1: check_update_in_backward), and interleaved's micro-batches go through the chunks in
  // groups of P (2 or more): the two never meet (Note [Update in backward], "Under --pp").
  if (update_in_backward)
    MEMFIT_THROW(ConfigError, "config",
                 "--pp-schedule interleaved (--pp {} --pp-virtual {}) with --update-in-backward: "
                 "the fused update steps each unit as the step's one backward of it ends, so it "
                 "takes --grad-accum 1, and interleaved needs --grad-accum a multiple of --pp {} "
                 "(got {}); use --pp-schedule 1f1b or gpipe with --update-in-backward",
                 P, pipe_virtual, P, grad_accum);
  if (static_cast<int>(pipeline.size()) != P * pipe_virtual)
    MEMFIT_THROW(ConfigError, "config",
                 "--pp-schedule interleaved: {} chunks given, --pp {} x --pp-virtual {} = {} "
                 "needed",
                 pipeline.size(), P, pipe_virtual, P * pipe_virtual);
}

std::string pipe_schedule_label(const RunSpec& spec) {
  return spec.interleaved() ? fmt::format("interleaved (--pp-virtual {})", spec.pipe_virtual)
                            : std::string(pipe_schedule_name(spec.pipe_schedule));
}

}  // namespace memfit
