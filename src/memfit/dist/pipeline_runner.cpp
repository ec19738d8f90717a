#include "memfit/dist/pipeline_runner.h"

#include "memfit/core/error.h"
#include "memfit/model/sequence_parallel.h"

namespace memfit::dist {

namespace {

constexpr int kActivationTag = 0;  // forward: a stage's output to the next
constexpr int kGradientTag = 1;    // backward: the gradient of that output, back

// The tag of a message to the receiver's chunk `chunk`: chunk 0's are the two above; 2 is the
// tied gradient's (dist/tied_gradient.cpp), so chunk c's are kind + 4 c.
int chunk_tag(int kind_tag, int chunk) { return kind_tag + 4 * chunk; }

// The lowest free of `slots` slots (marked used in `used`).
int take_slot(std::vector<bool>& used, int slots) {
  for (size_t i = 0; i < used.size(); ++i)
    if (!used[i]) {
      used[i] = true;
      return static_cast<int>(i);
    }
  if (static_cast<int>(used.size()) >= slots)
    MEMFIT_THROW(DistError, "pipeline", "more than the {} micro-batches in flight counted",
                 slots);
  used.push_back(true);
  return static_cast<int>(used.size()) - 1;
}

int64_t aligned(int64_t bytes) {
  return static_cast<int64_t>(MemoryPool::round_up(static_cast<size_t>(bytes)));
}

}  // namespace

int64_t pipeline_boundary_floats(const ModelConfig& config, const ActivationOptions& options,
                                 int B, int T) {
  return sequence_rows(config, options, int64_t{B} * T) * config.d_model;
}

PipelineBuffers pipeline_buffers(PipeSchedule schedule, int stage, int stages,
                                 int micro_batches, int64_t boundary_bytes,
                                 int virtual_stages) {
  const int V = virtual_stages, S = stages * V;
  const std::vector<ChunkOp> ops = chunk_stage_ops(schedule, V, stage, stages, micro_batches);
  auto previous = [&](int c) { return c * stages + stage > 0; };
  auto next = [&](int c) { return c * stages + stage + 1 < S; };
  const int kept_in = chunk_in_flight(ops, previous), kept_out = chunk_in_flight(ops, next);
  PipelineBuffers b;
  if (kept_in > 0) {
    b.activations += aligned(kept_in * boundary_bytes);  // pp.inputs
    b.comm += aligned(boundary_bytes);                   // pp.grad.send
  }
  if (kept_out > 0) {
    b.comm += aligned(kept_out * boundary_bytes);  // pp.send
    b.comm += aligned(boundary_bytes);             // pp.grad.recv
  }
  return b;
}

PipelineRunner::PipelineRunner(Communicator& pipe, PipeSchedule schedule, int micro_batches,
                               int64_t boundary_floats, MemoryPool& pool, int virtual_stages)
    : pipe_(pipe), stage_(pipe.rank()), stages_(pipe.size()), virtual_(virtual_stages),
      micro_batches_(micro_batches), n_(boundary_floats),
      ops_(chunk_stage_ops(schedule, virtual_stages, pipe.rank(), pipe.size(), micro_batches)) {
  if (boundary_floats < 1)
    MEMFIT_THROW(DistError, "pipeline", "a boundary of {} floats between stages",
                 boundary_floats);
  kept_inputs_ = chunk_in_flight(ops_, [&](int c) { return has_previous(c); });
  kept_sends_ = chunk_in_flight(ops_, [&](int c) { return has_next(c); });
  const auto bytes = static_cast<size_t>(n_) * sizeof(float);
  if (kept_inputs_ > 0) {
    inputs_ = pool.allocate(bytes * static_cast<size_t>(kept_inputs_), Category::activations,
                            "pp.inputs");
    grad_send_ = pool.allocate(bytes, Category::comm, "pp.grad.send");
  }
  if (kept_sends_ > 0) {
    sends_ =
        pool.allocate(bytes * static_cast<size_t>(kept_sends_), Category::comm, "pp.send");
    grad_recv_ = pool.allocate(bytes, Category::comm, "pp.grad.recv");
  }
}

std::span<float> PipelineRunner::slot(Allocation& a, int i) const {
  if (!a) return {};
  return {static_cast<float*>(a.data()) + static_cast<int64_t>(i) * n_, static_cast<size_t>(n_)};
}

void PipelineRunner::run(const PipelineStageFns& fns) {
  if (virtual_ != 1)
    MEMFIT_THROW(DistError, "pipeline", "run() of one chunk a rank, with {} chunks (run_chunks)",
                 virtual_);
  run_chunks({[&](int, int m, std::span<const float> in, std::span<float> out) {
                fns.forward(m, in, out);
              },
              [&](int, int m, std::span<const float> in, std::span<const float> dout,
                  std::span<float> din) { fns.backward(m, in, dout, din); }});
}

void PipelineRunner::run_chunks(const PipelineChunkFns& fns) {
  const int64_t bytes = n_ * static_cast<int64_t>(sizeof(float));
  const int P = stages_;
  const int previous_rank = (stage_ + P - 1) % P, next_rank = (stage_ + 1) % P;
  // Each (chunk, micro-batch)'s slots, from its forward to its backward.
  const auto key = [&](int chunk, int m) {
    return static_cast<size_t>(chunk) * static_cast<size_t>(micro_batches_) +
           static_cast<size_t>(m);
  };
  std::vector<int> in_slot(static_cast<size_t>(virtual_ * micro_batches_), -1);
  std::vector<int> out_slot(in_slot.size(), -1);
  std::vector<bool> in_used, out_used;
  // The forward sends in flight, one per slot; the last backward's gradient send.
  std::vector<std::unique_ptr<Request>> fwd_sends(static_cast<size_t>(kept_sends_));
  std::unique_ptr<Request> grad_send;
  for (const ChunkOp& op : ops_) {
    const int c = op.chunk, m = op.micro;
    const size_t k = key(c, m);
    const bool prev = has_previous(c), next = has_next(c);
    if (op.kind == PipeOp::Kind::forward) {
      if (prev) in_slot[k] = take_slot(in_used, kept_inputs_);
      if (next) out_slot[k] = take_slot(out_used, kept_sends_);
      std::span<float> in = prev ? slot(inputs_, in_slot[k]) : std::span<float>{};
      if (prev) pipe_.recv(in.data(), bytes, previous_rank, chunk_tag(kActivationTag, c));
      std::span<float> out = next ? slot(sends_, out_slot[k]) : std::span<float>{};
      // The slot's last send held a micro-batch whose backward has run here, so the next
      // virtual stage has received it: this wait returns at once.
      if (next) {
        if (auto& s = fwd_sends[static_cast<size_t>(out_slot[k])]) s->wait();
      }
      fns.forward(c, m, in, out);
      if (next)
        fwd_sends[static_cast<size_t>(out_slot[k])] = pipe_.send_async(
            out.data(), bytes, next_rank,
            chunk_tag(kActivationTag, (virtual_stage(stage_, c, P) + 1) / P));
    } else {
      std::span<const float> in = prev ? slot(inputs_, in_slot[k]) : std::span<float>{};
      std::span<float> dout = next ? slot(grad_recv_, 0) : std::span<float>{};
      if (next) pipe_.recv(dout.data(), bytes, next_rank, chunk_tag(kGradientTag, c));
      std::span<float> din = prev ? slot(grad_send_, 0) : std::span<float>{};
      if (grad_send) grad_send->wait();  // the previous gradient has left
      fns.backward(c, m, in, dout, din);
      if (prev) {
        grad_send = pipe_.send_async(
            din.data(), bytes, previous_rank,
            chunk_tag(kGradientTag, (virtual_stage(stage_, c, P) - 1) / P));
        in_used[static_cast<size_t>(in_slot[k])] = false;
      }
      if (next) out_used[static_cast<size_t>(out_slot[k])] = false;
    }
  }
  for (auto& s : fwd_sends)
    if (s) s->wait();
  if (grad_send) grad_send->wait();
}

void PipelineRunner::run_forwards(
    int n,
    const std::function<void(int m, std::span<const float> in, std::span<float> out)>& forward) {
  if (virtual_ != 1)
    MEMFIT_THROW(DistError, "pipeline",
                 "the forwards alone (an evaluation) over {} chunks a rank are not built",
                 virtual_);
  const int64_t bytes = n_ * static_cast<int64_t>(sizeof(float));
  const bool first = stage_ == 0, last = stage_ + 1 == stages_;
  std::span<float> in = slot(inputs_, 0), out = slot(sends_, 0);
  for (int m = 0; m < n; ++m) {
    if (!first) pipe_.recv(in.data(), bytes, stage_ - 1, kActivationTag);
    forward(m, in, out);
    if (!last) pipe_.send(out.data(), bytes, stage_ + 1, kActivationTag);
  }
}

void PipelineRunner::run_chunk_forwards(
    int n, const std::function<void(int chunk, int m, std::span<const float> in,
                                    std::span<float> out)>& forward) {
  const int64_t bytes = n_ * static_cast<int64_t>(sizeof(float));
  const int P = stages_;
  const int previous_rank = (stage_ + P - 1) % P, next_rank = (stage_ + 1) % P;
  std::span<float> in = slot(inputs_, 0), out = slot(sends_, 0);
  for (int m = 0; m < n; ++m)
    for (int c = 0; c < virtual_; ++c) {
      const bool prev = has_previous(c), next = has_next(c);
      if (prev) pipe_.recv(in.data(), bytes, previous_rank, chunk_tag(kActivationTag, c));
      forward(c, m, prev ? in : std::span<float>{}, next ? out : std::span<float>{});
      if (next)
        pipe_.send(out.data(), bytes, next_rank,
                   chunk_tag(kActivationTag, (virtual_stage(stage_, c, P) + 1) / P));
    }
}

}  // namespace memfit::dist
