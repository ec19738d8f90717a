// The links of the step-time model (plan/link_model.h, Note [Step-time model], "Links"): what
// --link parses to, which groups of the grid span two nodes, and that a collective whose ranks
// cross nodes is priced on the inter link, one within a node on the intra link (this host's
// copy rate by default, which keeps the one-host estimate what it was).
#include "memfit/plan/link_model.h"

#include <gtest/gtest.h>

#include "memfit/core/error.h"
#include "memfit/dist/process_grid.h"
#include "memfit/plan/calibration.h"
#include "memfit/plan/step_time.h"
#include "memfit/plan/tensor_comm.h"

namespace memfit {
namespace {

using dist::Axis;
using dist::GridShape;

Calibration rates() {
  Calibration r;
  r.gemm = {{384, 1e11, 1e11, 2e11, 2e11}, {768, 1.2e11, 1.2e11, 2.4e11, 2.4e11}};
  r.attention_f32 = 5e10;
  r.attention_bf16 = 8e10;
  r.elementwise_bytes_per_s = 1e10;
  r.stream_bytes_per_s = 2e10;
  r.copy_bytes_per_s = 1e10;
  return r;
}

TEST(LinkModel, ParsesBandwidthAndLatencyWithOrWithoutUnits) {
  LinkModel m;
  parse_link("inter=25GB/s,5us", m);
  EXPECT_DOUBLE_EQ(m.inter.bytes_per_s, 25e9);
  EXPECT_DOUBLE_EQ(m.inter.latency_s, 5e-6);
  EXPECT_TRUE(m.inter_given);
  EXPECT_FALSE(m.intra_given);
  parse_link("intra=300,0.5", m);  // GB/s and microseconds
  EXPECT_DOUBLE_EQ(m.intra.bytes_per_s, 300e9);
  EXPECT_DOUBLE_EQ(m.intra.latency_s, 0.5e-6);
  parse_link("inter=200Gb/s,2000ns", m);
  EXPECT_DOUBLE_EQ(m.inter.bytes_per_s, 25e9);
  EXPECT_DOUBLE_EQ(m.inter.latency_s, 2e-6);
  parse_link("inter=1GiB/s,1ms", m);
  EXPECT_DOUBLE_EQ(m.inter.bytes_per_s, 1073741824.0);
  EXPECT_DOUBLE_EQ(m.inter.latency_s, 1e-3);
  for (const char* bad : {"fast=1,1", "inter=25", "inter=x,5", "inter=25GB,5us", "inter=0,5",
                          "inter=25,5s", "25,5"}) {
    try {
      parse_link(bad, m);
      ADD_FAILURE() << bad << " parsed";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--link"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

TEST(LinkModel, DefaultsAreThisHostsCopyRateAndAnInterEstimate) {
  const LinkModel m;
  const Calibration r = rates();
  // The shared-memory transport copies each byte in and out: half the copy rate is sent.
  EXPECT_DOUBLE_EQ(link_bytes_per_s(m.intra, r), r.copy_bytes_per_s / 2);
  EXPECT_DOUBLE_EQ(m.intra.latency_s, kDefaultIntraLatency);
  EXPECT_EQ(m.inter, kDefaultInterLink);
  EXPECT_DOUBLE_EQ(link_bytes_per_s(m.inter, r), 25e9);
  // One node unless told: nothing crosses.
  EXPECT_FALSE(m.spans_nodes({0, 1000}));
  const std::string text = describe_links(m, r);
  EXPECT_NE(text.find("estimate"), std::string::npos) << text;
  EXPECT_NE(text.find("copy rate"), std::string::npos) << text;
}

TEST(LinkModel, TheGridsGroupsSpanNodesWhereTheirRanksDo) {
  LinkModel m;
  m.ranks_per_node = 8;
  EXPECT_FALSE(m.spans_nodes({0, 1, 7}));
  EXPECT_TRUE(m.spans_nodes({6, 7, 8}));
  // 2 data x 1 pipeline x 8 tensor on nodes of 8: a tensor group is one node, a data group two.
  const GridShape dp_tp{2, 1, 8};
  EXPECT_EQ(&m.axis_link(dp_tp, Axis::tensor), &m.intra);
  EXPECT_EQ(&m.axis_link(dp_tp, Axis::data), &m.inter);
  // 16 tensor ranks: the tensor group crosses nodes.
  EXPECT_EQ(&m.axis_link(GridShape{1, 1, 16}, Axis::tensor), &m.inter);
  // An axis of one rank has nothing to send.
  EXPECT_EQ(&m.axis_link(dp_tp, Axis::pipeline), &m.intra);
  // 1 x 4 pipeline x 4 tensor on nodes of 8: stages 0|1 share node 0, 1|2 cross, 2|3 share
  // node 1.
  const GridShape pp_tp{1, 4, 4};
  EXPECT_EQ(&m.stage_link(pp_tp, 0), &m.intra);
  EXPECT_EQ(&m.stage_link(pp_tp, 1), &m.inter);
  EXPECT_EQ(&m.stage_link(pp_tp, 2), &m.intra);
  m.ranks_per_node = 0;
  EXPECT_EQ(&m.axis_link(dp_tp, Axis::data), &m.intra);
}

// The tensor group's collectives: within a node at the intra link's rate and latency, across
// nodes at the inter link's; a rank sends 2 (tp - 1)/tp of each all-reduce in 2 (tp - 1)
// messages, and sums (1 + 1/tp) of it at the streaming rate wherever it is.
TEST(LinkModel, ACollectiveCrossingNodesIsPricedOnTheInterLink) {
  const Calibration r = rates();
  TensorCommVolume v;
  v.all_reduce_count = 10;
  v.all_reduce_bytes = 10 * 4'000'000;
  const int tp = 4;
  const double sent = 2.0 * (tp - 1) / tp * 4e6, summed = 4e6 * (1 + 1.0 / tp);
  const Link intra{100e9, 1e-6}, inter{25e9, 5e-6};
  EXPECT_DOUBLE_EQ(tensor_comm_seconds(v, tp, r, intra),
                   10 * (sent / 100e9 + 6 * 1e-6 + summed / r.stream_bytes_per_s));
  EXPECT_DOUBLE_EQ(tensor_comm_seconds(v, tp, r, inter),
                   10 * (sent / 25e9 + 6 * 5e-6 + summed / r.stream_bytes_per_s));
  // This host's link without latency: the estimate before links, bytes copied at the copy rate.
  EXPECT_DOUBLE_EQ(tensor_comm_seconds(v, tp, r),
                   10 * (2 * sent / r.copy_bytes_per_s + summed / r.stream_bytes_per_s));

  // In the step: the same group priced as its ranks lie (4 tensor ranks, 2 a node: across).
  LinkModel m;
  m.intra = intra;
  m.ranks_per_node = 2;
  StepTimeInputs in;
  in.model = ModelConfig::preset("gpt2");
  in.model.set_tensor_parallel(tp);
  in.B = 1;
  in.T = 64;
  in.param_count = 1000;
  in.tensor_comm = v;
  in.tensor_link = m.axis_link(GridShape{1, 1, tp}, Axis::tensor);
  const double across = estimate_step_time(in, r).tensor_comm;
  EXPECT_DOUBLE_EQ(across, tensor_comm_seconds(v, tp, r, m.inter));
  m.ranks_per_node = 4;
  in.tensor_link = m.axis_link(GridShape{1, 1, tp}, Axis::tensor);
  const double within = estimate_step_time(in, r).tensor_comm;
  EXPECT_DOUBLE_EQ(within, tensor_comm_seconds(v, tp, r, intra));
  EXPECT_GT(across, within);
}

// The data group's collectives: the bytes a rank sends (half what it copies) on the group's
// link, a latency for each of the rings' messages, the sums at the streaming rate.
TEST(LinkModel, TheDataGroupsCollectivesArePricedOnItsLink) {
  const Calibration r = rates();
  dist::CommVolume v;
  v.all_reduce = 100'000'000;
  v.all_gather = 10'000'000;
  // 4 ranks, 25 MB buckets: 4 all-reduce buckets of 2 x 3 messages, 1 all-gather of 3.
  EXPECT_DOUBLE_EQ(ring_messages(v, 4, 25'000'000), 3.0 * (2 * 4 + 1));
  EXPECT_DOUBLE_EQ(ring_messages(v, 4, 0), 3.0 * (2 + 1));
  EXPECT_EQ(ring_messages(v, 1, 25'000'000), 0);
  StepTimeInputs in;
  in.model = ModelConfig::preset("gpt2-tiny");
  in.model.finalize();
  in.B = 1;
  in.T = 16;
  in.param_count = 1000;
  in.comm_copied_bytes = v.copied_bytes(4);
  in.comm_summed_bytes = v.summed_bytes(4);
  in.comm_messages = ring_messages(v, 4, 25'000'000);
  const double host = estimate_step_time(in, r).comm;
  EXPECT_DOUBLE_EQ(host, v.copied_bytes(4) / r.copy_bytes_per_s +
                             v.summed_bytes(4) / r.stream_bytes_per_s);  // Link{}: no latency
  in.data_link = kDefaultInterLink;
  EXPECT_DOUBLE_EQ(estimate_step_time(in, r).comm,
                   v.sent_bytes(4) / 25e9 + 27 * 5e-6 + v.summed_bytes(4) / r.stream_bytes_per_s);
}

}  // namespace
}  // namespace memfit
