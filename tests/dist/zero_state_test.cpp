// zero_model_state from a StatePlacement (Note [State placement]): the model gets the services
// the placement names and no others, the trainer gets the concrete ones, and a placement that
// is not this rank's, or a file or store that the placement does not name, is refused.
#include "memfit/dist/zero/zero_state.h"

#include <gtest/gtest.h>

#include "memfit/core/error.h"
#include "memfit/dist/communicator.h"
#include "memfit/model/model_config.h"
#include "memfit/model/transformer.h"
#include "memfit/state/state_placement.h"

namespace memfit {
namespace {

ModelConfig tiny() {
  ModelConfig c = ModelConfig::preset("gpt2-tiny");
  c.n_layer = 2;
  c.finalize();
  return c;
}

TEST(ZeroState, FromThePlacementTheModelGetsWhatItNames) {
  const ModelConfig c = tiny();
  const ParamLayout layout(c);
  OptimConfig oc;
  oc.n_head = c.n_head;
  const auto comm = dist::make_single_communicator();
  // bf16 gradients in one process: reduced per unit into a bf16 accumulator of their own.
  StateOptions bf16;
  bf16.grad_dtype = DType::bf16;
  bf16.bucket_bytes = 1 << 20;
  const StatePlacement units(layout, oc, bf16, {0, 1});
  MemoryPool pool;
  ZeroServices made;
  Transformer gpt(c, pool, {}, zero_model_state(units, *comm, nullptr, nullptr, &made));
  EXPECT_NE(made.grads, nullptr);
  EXPECT_EQ(made.weights, nullptr);
  EXPECT_TRUE(gpt.grads_per_unit());
  EXPECT_EQ(gpt.grad_store(), nullptr);  // a summing store is not the file store
  EXPECT_EQ(gpt.grad_sums_range(), units.whole());
  EXPECT_EQ(gpt.grad_sums().dtype(), DType::bf16);
  EXPECT_FALSE(gpt.params_sharded());
  // Everything in RAM: no service at all.
  const StatePlacement plain(layout, oc, StateOptions{}, {0, 1});
  MemoryPool pool2;
  ZeroServices none;
  Transformer whole(c, pool2, {}, zero_model_state(plain, *comm, nullptr, nullptr, &none));
  EXPECT_EQ(none.grads, nullptr);
  EXPECT_EQ(none.weights, nullptr);
  EXPECT_FALSE(whole.grads_per_unit());
}

TEST(ZeroState, APlacementNotThisRanksOrAFileItDoesNotNameIsRefused) {
  const ModelConfig c = tiny();
  const ParamLayout layout(c);
  OptimConfig oc;
  oc.n_head = c.n_head;
  const auto comm = dist::make_single_communicator();
  EXPECT_THROW(zero_model_state(StatePlacement(layout, oc, StateOptions{}, {1, 2}), *comm,
                                nullptr, nullptr),
               Error);
  StateOptions file;
  file.offload_optimizer = file.offload_grads = true;
  // The placement keeps the gradients in a file, but no store was given.
  EXPECT_THROW(zero_model_state(StatePlacement(layout, oc, file, {0, 1}), *comm, nullptr, nullptr),
               Error);
}

}  // namespace
}  // namespace memfit
