// Checkpoints of a split layout (--tp, --pp, with ZeRO on the data group) as whole tensors: every
// rank writes its runs of the weights of record and of the optimizer state (model/layout_map.h)
// at their places in the files one process saves (model.safetensors, or its shards and index,
// under Hugging Face's names; optimizer.safetensors over the whole layout), byte for byte, so the
// layout is not part of the format: a save at any tp x pp x dp loads at any other, and `memfit
// export --hf` and transformers read it as they read any save. One rank lays the files out
// (headers, sizes; tensor bytes zero) before the others write; GPT-2's Conv1D weights are
// transposed on the way through a bounded staging. Loading reads any saved form (these files,
// ZeRO's shards, a Hugging Face directory) back through the same runs. Note [Checkpoints across
// layouts] in docs/notes/checkpoints.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "memfit/core/dtype.h"
#include "memfit/memory/tensor.h"
#include "memfit/model/model_config.h"
#include "memfit/model/param_layout.h"
#include "memfit/io/checkpoint/zero_checkpoint.h"
#include "memfit/model/tensor_slices.h"
#include "memfit/optim/optimizer.h"

namespace memfit::io {

class PlacedFile;  // a file of the save opened for positioned writes (layout_checkpoint.cpp)

class LayoutFiles {
 public:
  // The files of a save of `whole` (the whole run model: tp 1, every stage) with weights of
  // record of type `record` (f32 or bf16), weights sharded above `max_shard_bytes` as
  // save_weights shards them, and, with `optimizer` (one over the whole layout, allocated or
  // not: its name, whole state specs and steps_taken are read), optimizer.safetensors (the
  // whole state tensors, of any kind: optim/state_runs.h maps a rank's onto them). Every rank
  // computes the same layout of the files.
  LayoutFiles(const ModelConfig& whole, DType record, const Optimizer* optimizer,
              uint64_t max_shard_bytes);

  // The files, in the order create() makes them (the weights, their index when sharded, then
  // optimizer.safetensors).
  std::vector<std::string> files() const;

  // One rank, before any write(): every file made in the existing directory `dir`, with its
  // header and its size, tensor bytes zero (what no rank writes: alignment gaps of the state),
  // and the index of sharded weights. IoError if a file exists already.
  void create(const std::filesystem::path& dir) const;

  // Every rank that holds a part: the elements `runs` name (local -> whole; runs_within this
  // rank's range), from `record` (the weights of record, its element 0 local element
  // `record_begin`), and `state`'s runs of each whole state spec (save_state_parts; empty
  // without an optimizer), written at their places; the weights' vocabulary padding rows are
  // not stored, transposed tensors go through `staging` (its bytes, at least one element;
  // undefined where the family stores nothing transposed). Every file written is fsynced before
  // it returns.
  struct StateParts {
    std::vector<const void*> data;                // per whole state spec; null where empty
    std::vector<std::vector<SliceRun>> runs;      // per spec: local = element of data[i]
  };
  void write(const std::filesystem::path& dir, const std::vector<SliceRun>& runs,
             const void* record, int64_t record_begin, const StateParts& state,
             const Tensor& staging) const;

  // What write() does, in parts: a rank whose weights of record or state are not in RAM at once
  // (--offload-optimizer: each piece streamed from its file through the ring) writes each
  // part's runs as it has it. `runs` as write()'s, each part's runs_within its range; the
  // files are opened as a part first needs them and fsynced by finish().
  class Writer {
   public:
    Writer(const LayoutFiles& files, std::filesystem::path dir, const Tensor& staging);
    Writer(const Writer&) = delete;
    Writer& operator=(const Writer&) = delete;
    ~Writer();
    // The weights of record's elements `runs` name, from `record` (element 0 local element
    // `record_begin`).
    void weights(const std::vector<SliceRun>& runs, const void* record, int64_t record_begin);
    // Whole state spec `spec`'s elements `runs` name (state runs: optim/state_runs.h, local a
    // position in the rank's state tensor, Optimizer::state_extents), from `src` (element 0
    // local element `begin`).
    void state(size_t spec, const std::vector<SliceRun>& runs, const void* src, int64_t begin);
    void finish();

   private:
    PlacedFile& file(int k);
    const LayoutFiles& files_;
    std::filesystem::path dir_;
    const Tensor& staging_;
    std::map<int, std::unique_ptr<PlacedFile>> opened_;
  };
  // The number of whole state specs a save writes (0 without an optimizer).
  size_t state_count() const { return state_.size(); }

  // One rank, after every write(): the files renamed from `from` into `to` (the staging
  // directory beside the save into the atomic save's temporary directory: a
  // CheckpointSaveOptions::write_extra).
  void move(const std::filesystem::path& from, const std::filesystem::path& to) const;

 private:
  struct File {
    std::string name;
    std::string header;  // padded, as SafetensorsWriter writes it
    uint64_t size = 0;
  };
  struct Place {
    int file = 0;
    uint64_t at = 0;  // the tensor's first byte in the file
  };
  ModelConfig config_;
  ParamLayout layout_;
  DType record_;
  std::vector<File> files_;
  std::string index_;            // the weights' index JSON (sharded), else empty
  std::vector<Place> params_;    // per layout parameter
  std::vector<int64_t> stored_;  // its stored elements (padding rows dropped)
  std::vector<Place> state_;     // per whole state spec
  std::vector<size_t> state_bytes_;  // element size per state spec
};

// What a rank writes of `mine`'s state (its range's tensors) for the layout runs `runs`
// (first_holder_runs cut to its range): each whole state spec's data and its runs
// (optim/state_runs.h, StateRunUse::save) relative to it. `whole`: the same optimizer over the
// whole run model, unallocated. Error where the state does not map.
LayoutFiles::StateParts save_state_parts(const Optimizer& mine, const Optimizer& whole,
                                         const std::vector<SliceRun>& runs);

// Fills `optimizer`'s state (its range of its own layout: a rank's, at any tp, stage and ZeRO
// stage) and steps_taken from the checkpoint at `dir` (as located), whatever layout saved it:
// element l of the rank's layout is element `whole` of `runs` (whole_layout_runs), its state
// mapped by optim/state_runs.h, read from
// optimizer.safetensors or ZeRO's shard files through SavedOptimizerState over `whole_optimizer`
// (the same optimizer over the whole layout, unallocated). State in no run (--tp's padding
// rows, alignment gaps) is zero. Everything is checked before a byte is copied (IoError).
void load_optimizer_state_by_layout(const std::filesystem::path& dir, Optimizer& optimizer,
                                    const Optimizer& whole_optimizer,
                                    const std::vector<SliceRun>& runs);

// The saved optimizer state of a rank's range `mine`, whatever layout saved it, a part at a time
// (--offload-optimizer: each piece read into a ring slot): `optimizer` (over the rank's layout;
// allocated or not: its name, whole state specs and state_extents are read) and
// `whole_optimizer` (the same optimizer over the whole layout, unallocated) checked against the
// save (SavedOptimizerState over the whole layout) and their state runs mapped
// (optim/state_runs.h, StateRunUse::load) before a byte is read: IoError or Error otherwise.
// Element l of the rank's layout is element `whole` of `runs` (whole_layout_runs).
class LayoutStateReader {
 public:
  LayoutStateReader(const std::filesystem::path& dir, const Optimizer& optimizer,
                    const Optimizer& whole_optimizer, std::vector<SliceRun> runs,
                    ElementRange mine);
  int64_t steps_taken() const { return saved_.steps_taken(); }
  // State spec `spec`'s state elements `local` (Optimizer::state_extents positions, inside
  // `mine`'s) into `dst`, in the state's dtype; zeros where no run (--tp's padding rows,
  // alignment gaps).
  void read(size_t spec, ElementRange local, void* dst) const;
  // Done with state spec `spec` (SavedOptimizerState::release).
  void release(size_t spec) const { saved_.release(spec); }

 private:
  SavedOptimizerState saved_;
  std::vector<std::vector<SliceRun>> runs_;  // per whole state spec (state_layout_runs)
  std::vector<size_t> elem_bytes_;
};

}  // namespace memfit::io
