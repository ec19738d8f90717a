// The pipeline runner (dist/pipeline_runner.h) on whatever world runs the binary: alone, and
// under `mpirun -n 2` and `-n 4` (ctest's dist_mpi_2ranks and dist_mpi_4ranks) as every
// pipeline x data grid that tiles the world. Each stage is a toy layer y = w * x + sin(x)
// (elementwise), the last stage's loss sum(y^2) / 2; every stage's gradients, summed over the
// micro-batches, and every micro-batch's loss must be the bits one process gets running the
// stages in turn, micro-batch by micro-batch, under GPipe and 1F1B alike: the schedules run each
// stage's backwards in micro-batch order, so every sum adds the same terms in the same order.
// The runner's buffers are counted by pipeline_buffers exactly, by category. Interleaved (P of 2
// or more, V = 2 and 3 chunks a rank): the P x V toy stages one process runs in turn, rank r
// holding stages r, r + P, ...; the same bits, the same exact count.
#include "memfit/dist/pipeline_runner.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "memfit/core/error.h"
#include "memfit/dist/process_grid.h"

namespace memfit::dist {
namespace {

Communicator& world() {
  static std::unique_ptr<Communicator> w = make_world_communicator();
  return *w;
}

constexpr int64_t kN = 300;  // floats between stages

float weight(int stage, int64_t i) { return 0.5f + 0.01f * float(stage) - 0.003f * float(i % 17); }
float data(int replica, int m, int64_t i) {
  return std::sin(0.1f * float(i) + 0.7f * float(m) + 1.3f * float(replica));
}

// One stage of the toy model: its weights and its gradient sums.
struct ToyStage {
  int stage = 0, stages = 1, replica = 0;
  std::vector<float> w, g;
  std::vector<float> losses;  // the last stage's, per micro-batch
  ToyStage(int s, int P, int r, int m)
      : stage(s), stages(P), replica(r), w(kN), g(kN, 0.0f), losses(static_cast<size_t>(m)) {
    for (int64_t i = 0; i < kN; ++i) w[static_cast<size_t>(i)] = weight(s, i);
  }
  float x(int m, std::span<const float> in, int64_t i) const {
    return in.empty() ? data(replica, m, i) : in[static_cast<size_t>(i)];
  }
  float y(int m, std::span<const float> in, int64_t i) const {
    const float xi = x(m, in, i);
    return w[static_cast<size_t>(i)] * xi + std::sin(xi);
  }
  void forward(int m, std::span<const float> in, std::span<float> out) {
    if (stage + 1 < stages) {
      for (int64_t i = 0; i < kN; ++i) out[static_cast<size_t>(i)] = y(m, in, i);
      return;
    }
    float loss = 0;
    for (int64_t i = 0; i < kN; ++i) loss += 0.5f * y(m, in, i) * y(m, in, i);
    losses[static_cast<size_t>(m)] = loss;
  }
  void backward(int m, std::span<const float> in, std::span<const float> dout,
                std::span<float> din) {
    for (int64_t i = 0; i < kN; ++i) {
      const float xi = x(m, in, i);
      const float dy = dout.empty() ? y(m, in, i) : dout[static_cast<size_t>(i)];
      g[static_cast<size_t>(i)] += dy * xi;
      if (!din.empty()) din[static_cast<size_t>(i)] = dy * (w[static_cast<size_t>(i)] + std::cos(xi));
    }
  }
};

// One process: micro-batch by micro-batch, every stage's forward, then every backward.
std::vector<ToyStage> reference(int P, int replica, int m) {
  std::vector<ToyStage> st;
  for (int s = 0; s < P; ++s) st.emplace_back(s, P, replica, m);
  for (int mb = 0; mb < m; ++mb) {
    std::vector<std::vector<float>> ins(static_cast<size_t>(P));
    for (int s = 0; s < P; ++s) {
      std::vector<float> out(s + 1 < P ? kN : 0);
      st[static_cast<size_t>(s)].forward(mb, ins[static_cast<size_t>(s)], out);
      if (s + 1 < P) ins[static_cast<size_t>(s + 1)] = out;
    }
    std::vector<float> dout;
    for (int s = P - 1; s >= 0; --s) {
      std::vector<float> din(s > 0 ? kN : 0);
      st[static_cast<size_t>(s)].backward(mb, ins[static_cast<size_t>(s)], dout, din);
      dout = din;
    }
  }
  return st;
}

TEST(PipelineRunner, EveryScheduleGivesOneProcesssBitsOnEveryGridAndCountsItsBuffers) {
  Communicator& w = world();
  const int W = w.size();
  for (int P = 1; P <= W; ++P) {
    if (W % P) continue;
    ProcessGrid grid(w, GridShape{W / P, P, 1});
    const int s = grid.coords().pipeline, replica = grid.coords().data;
    for (PipeSchedule sched : {PipeSchedule::gpipe, PipeSchedule::one_f_one_b})
      for (int m : {1, 5}) {
        const std::string what = std::string(pipe_schedule_name(sched)) + ", " +
                                 grid.shape().describe() + ", m " + std::to_string(m);
        MemoryPool pool;
        ToyStage mine(s, P, replica, m);
        {
          PipelineRunner runner(grid.pipeline(), sched, m, kN, pool);
          runner.run({[&](int mb, std::span<const float> in, std::span<float> out) {
                        mine.forward(mb, in, out);
                      },
                      [&](int mb, std::span<const float> in, std::span<const float> dout,
                          std::span<float> din) { mine.backward(mb, in, dout, din); }});
          const PipelineBuffers planned = pipeline_buffers(sched, s, P, m, kN * 4);
          EXPECT_EQ(static_cast<int64_t>(pool.bytes_peak(Category::activations)),
                    planned.activations) << what;
          EXPECT_EQ(static_cast<int64_t>(pool.bytes_peak(Category::comm)), planned.comm) << what;
          EXPECT_EQ(static_cast<int64_t>(pool.bytes_peak()), planned.activations + planned.comm)
              << what;
        }
        const std::vector<ToyStage> ref = reference(P, replica, m);
        const ToyStage& want = ref[static_cast<size_t>(s)];
        int differ = 0;
        for (int64_t i = 0; i < kN; ++i)
          differ += mine.g[static_cast<size_t>(i)] != want.g[static_cast<size_t>(i)];
        EXPECT_EQ(differ, 0) << what << ": gradients of stage " << s;
        if (s + 1 == P) {
          for (int mb = 0; mb < m; ++mb) {
            EXPECT_EQ(mine.losses[static_cast<size_t>(mb)], want.losses[static_cast<size_t>(mb)])
                << what << ", micro-batch " << mb;
          }
        }
      }
  }
}

TEST(PipelineRunner, InterleavedChunksGiveOneProcesssBitsAndCountTheirBuffers) {
  Communicator& w = world();
  const int W = w.size();
  for (int P = 2; P <= W; ++P) {
    if (W % P) continue;
    ProcessGrid grid(w, GridShape{W / P, P, 1});
    const int r = grid.coords().pipeline, replica = grid.coords().data;
    for (int V : {2, 3})
      for (int m : {P, 2 * P, 3 * P}) {
        const std::string what = fmt::format("interleaved V {}, {}, m {}", V,
                                             grid.shape().describe(), m);
        const int S = P * V;
        MemoryPool pool;
        std::vector<ToyStage> mine;
        for (int c = 0; c < V; ++c) mine.emplace_back(virtual_stage(r, c, P), S, replica, m);
        {
          PipelineRunner runner(grid.pipeline(), PipeSchedule::one_f_one_b, m, kN, pool, V);
          runner.run_chunks(
              {[&](int c, int mb, std::span<const float> in, std::span<float> out) {
                 mine[static_cast<size_t>(c)].forward(mb, in, out);
               },
               [&](int c, int mb, std::span<const float> in, std::span<const float> dout,
                   std::span<float> din) {
                 mine[static_cast<size_t>(c)].backward(mb, in, dout, din);
               }});
          const PipelineBuffers planned =
              pipeline_buffers(PipeSchedule::one_f_one_b, r, P, m, kN * 4, V);
          EXPECT_EQ(static_cast<int64_t>(pool.bytes_peak(Category::activations)),
                    planned.activations) << what;
          EXPECT_EQ(static_cast<int64_t>(pool.bytes_peak(Category::comm)), planned.comm) << what;
        }
        const std::vector<ToyStage> ref = reference(S, replica, m);
        for (int c = 0; c < V; ++c) {
          const ToyStage& want = ref[static_cast<size_t>(virtual_stage(r, c, P))];
          const ToyStage& got = mine[static_cast<size_t>(c)];
          int differ = 0;
          for (int64_t i = 0; i < kN; ++i)
            differ += got.g[static_cast<size_t>(i)] != want.g[static_cast<size_t>(i)];
          EXPECT_EQ(differ, 0) << what << ": gradients of rank " << r << "'s chunk " << c;
          if (virtual_stage(r, c, P) + 1 == S) {
            for (int mb = 0; mb < m; ++mb)
              EXPECT_EQ(got.losses[static_cast<size_t>(mb)], want.losses[static_cast<size_t>(mb)])
                  << what << ", micro-batch " << mb;
          }
        }
      }
  }
}

int64_t up(int64_t bytes) { return static_cast<int64_t>(MemoryPool::round_up(static_cast<size_t>(bytes))); }

TEST(PipelineRunner, BuffersFollowTheSchedulesInFlightMicroBatches) {
  // 4 stages, 8 micro-batches of 1000 bytes: 1F1B keeps 4 - s inputs, GPipe 8.
  const PipelineBuffers first = pipeline_buffers(PipeSchedule::one_f_one_b, 0, 4, 8, 1000);
  EXPECT_EQ(first.activations, 0);  // the first stage's input is the tokens, the caller's
  EXPECT_EQ(first.comm, up(4 * 1000) + up(1000));
  const PipelineBuffers second = pipeline_buffers(PipeSchedule::one_f_one_b, 1, 4, 8, 1000);
  EXPECT_EQ(second.activations, up(3 * 1000));
  const PipelineBuffers last = pipeline_buffers(PipeSchedule::one_f_one_b, 3, 4, 8, 1000);
  EXPECT_EQ(last.activations, up(1000));
  EXPECT_EQ(last.comm, up(1000));
  EXPECT_EQ(pipeline_buffers(PipeSchedule::gpipe, 1, 4, 8, 1000).activations,
            up(8 * 1000));
  // Interleaved, 2 ranks of 2 chunks, 4 micro-batches: rank 0 keeps 2 inputs (chunk 1's) and 5
  // sends (both chunks'), rank 1 3 inputs and 3 sends (chunk 0's); both receive and send
  // gradients (each has a chunk on either side).
  const PipelineBuffers r0 = pipeline_buffers(PipeSchedule::one_f_one_b, 0, 2, 4, 1000, 2);
  EXPECT_EQ(r0.activations, up(2 * 1000));
  EXPECT_EQ(r0.comm, up(5 * 1000) + 2 * up(1000));
  const PipelineBuffers r1 = pipeline_buffers(PipeSchedule::one_f_one_b, 1, 2, 4, 1000, 2);
  EXPECT_EQ(r1.activations, up(3 * 1000));
  EXPECT_EQ(r1.comm, up(3 * 1000) + 2 * up(1000));
  EXPECT_THROW(pipeline_buffers(PipeSchedule::one_f_one_b, 0, 2, 3, 1000, 2), ConfigError);
}

}  // namespace
}  // namespace memfit::dist
