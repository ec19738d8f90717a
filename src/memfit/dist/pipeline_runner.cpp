#include "memfit/dist/pipeline_runner.h"

#include "memfit/core/error.h"
#include "memfit/model/sequence_parallel.h"

namespace memfit::dist {

namespace {

constexpr int kActivationTag = 0;  // forward: a stage's output to the next
constexpr int kGradientTag = 1;    // backward: the gradient of that output, back

int64_t aligned(int64_t bytes) {
  return static_cast<int64_t>(MemoryPool::round_up(static_cast<size_t>(bytes)));
}

}  // namespace

int64_t pipeline_boundary_floats(const ModelConfig& config, const ActivationOptions& options,
                                 int B, int T) {
  return sequence_rows(config, options, int64_t{B} * T) * config.d_model;
}

PipelineBuffers pipeline_buffers(PipeSchedule schedule, int stage, int stages,
                                 int micro_batches, int64_t boundary_bytes) {
  const int kept = pipe_in_flight(pipe_stage_ops(schedule, stage, stages, micro_batches));
  PipelineBuffers b;
  if (stage > 0) {
    b.activations += aligned(kept * boundary_bytes);  // pp.inputs
    b.comm += aligned(boundary_bytes);                // pp.grad.send
  }
  if (stage + 1 < stages) {
    b.comm += aligned(kept * boundary_bytes);  // pp.send
    b.comm += aligned(boundary_bytes);         // pp.grad.recv
  }
  return b;
}

PipelineRunner::PipelineRunner(Communicator& pipe, PipeSchedule schedule, int micro_batches,
                               int64_t boundary_floats, MemoryPool& pool)
    : pipe_(pipe), stage_(pipe.rank()), stages_(pipe.size()), n_(boundary_floats),
      ops_(pipe_stage_ops(schedule, pipe.rank(), pipe.size(), micro_batches)),
      kept_(pipe_in_flight(ops_)) {
  if (boundary_floats < 1)
    MEMFIT_THROW(DistError, "pipeline", "a boundary of {} floats between stages",
                 boundary_floats);
  const auto bytes = static_cast<size_t>(n_) * sizeof(float);
  if (stage_ > 0) {
    inputs_ =
        pool.allocate(bytes * static_cast<size_t>(kept_), Category::activations, "pp.inputs");
    grad_send_ = pool.allocate(bytes, Category::comm, "pp.grad.send");
  }
  if (stage_ + 1 < stages_) {
    sends_ = pool.allocate(bytes * static_cast<size_t>(kept_), Category::comm, "pp.send");
    grad_recv_ = pool.allocate(bytes, Category::comm, "pp.grad.recv");
  }
}

std::span<float> PipelineRunner::slot(Allocation& a, int i) const {
  if (!a) return {};
  return {static_cast<float*>(a.data()) + static_cast<int64_t>(i) * n_, static_cast<size_t>(n_)};
}

void PipelineRunner::run(const PipelineStageFns& fns) {
  const int64_t bytes = n_ * static_cast<int64_t>(sizeof(float));
  const bool first = stage_ == 0, last = stage_ + 1 == stages_;
  // The forward sends in flight, one per slot; the last backward's gradient send.
  std::vector<std::unique_ptr<Request>> fwd_sends(static_cast<size_t>(kept_));
  std::unique_ptr<Request> grad_send;
  for (const PipeOp& op : ops_) {
    const int m = op.micro, k = m % kept_;
    std::span<float> in = slot(inputs_, k);  // empty on the first stage
    if (op.kind == PipeOp::Kind::forward) {
      if (!first) pipe_.recv(in.data(), bytes, stage_ - 1, kActivationTag);
      std::span<float> out = slot(sends_, k);
      // The slot's last send held micro-batch m - kept_, whose backward has run here, so the
      // next stage has received it: this wait returns at once.
      if (auto& s = fwd_sends[static_cast<size_t>(k)]) s->wait();
      fns.forward(m, in, out);
      if (!last)
        fwd_sends[static_cast<size_t>(k)] =
            pipe_.send_async(out.data(), bytes, stage_ + 1, kActivationTag);
    } else {
      std::span<float> dout = slot(grad_recv_, 0);
      if (!last) pipe_.recv(dout.data(), bytes, stage_ + 1, kGradientTag);
      std::span<float> din = slot(grad_send_, 0);
      if (grad_send) grad_send->wait();  // the previous gradient has left
      fns.backward(m, in, dout, din);
      if (!first) grad_send = pipe_.send_async(din.data(), bytes, stage_ - 1, kGradientTag);
    }
  }
  for (auto& s : fwd_sends)
    if (s) s->wait();
  if (grad_send) grad_send->wait();
}

void PipelineRunner::run_forwards(
    int n,
    const std::function<void(int m, std::span<const float> in, std::span<float> out)>& forward) {
  const int64_t bytes = n_ * static_cast<int64_t>(sizeof(float));
  const bool first = stage_ == 0, last = stage_ + 1 == stages_;
  std::span<float> in = slot(inputs_, 0), out = slot(sends_, 0);
  for (int m = 0; m < n; ++m) {
    if (!first) pipe_.recv(in.data(), bytes, stage_ - 1, kActivationTag);
    forward(m, in, out);
    if (!last) pipe_.send(out.data(), bytes, stage_ + 1, kActivationTag);
  }
}

}  // namespace memfit::dist
