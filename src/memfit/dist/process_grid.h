// Ranks in a grid: data x pipeline x tensor, with a communicator for each group, so that code
// which means "the data-parallel ranks" asks for them by name instead of taking the world. The
// tensor index varies fastest, as Megatron-LM orders ranks:
//   rank = ((data_index * pipeline) + pipeline_index) * tensor + tensor_index,
// so a tensor group is neighbouring ranks (one machine's, where its collectives in every layer
// are cheapest) and a data group the ranks furthest apart. memfit has data parallelism only
// today: tensor and pipeline are 1, the data group is the world itself and the other two are a
// single process each, so nothing a run does changes. Note [Process grid] in
// docs/notes/process-grid.md.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "memfit/dist/communicator.h"

namespace memfit::dist {

// The grid's dimensions, slowest-varying first.
enum class Axis : uint8_t { data, pipeline, tensor };
inline constexpr std::array<Axis, 3> kAxes = {Axis::data, Axis::pipeline, Axis::tensor};
std::string_view axis_name(Axis axis);  // "data", "pipeline", "tensor"

// Ranks along each axis.
struct GridShape {
  int data = 1, pipeline = 1, tensor = 1;

  int size() const { return data * pipeline * tensor; }
  int along(Axis axis) const;
  // "2 data x 1 pipeline x 2 tensor"
  std::string describe() const;
  bool operator==(const GridShape&) const = default;
};

// A rank's index along each axis.
struct GridCoords {
  int data = 0, pipeline = 0, tensor = 0;

  int along(Axis axis) const;
  bool operator==(const GridCoords&) const = default;
};

// The rank at `at`: ((at.data * pipeline) + at.pipeline) * tensor + at.tensor. DistError
// outside the shape.
int grid_rank(const GridShape& shape, const GridCoords& at);
// The inverse: `rank`'s coordinates. DistError unless 0 <= rank < shape.size().
GridCoords grid_coords(const GridShape& shape, int rank);
// The ranks of `rank`'s group along `axis` (those whose other coordinates are its), in the
// group's order: the i-th has index i along the axis, and rank i in the group's communicator.
std::vector<int> group_ranks(const GridShape& shape, Axis axis, int rank);
// What names that group among the others along `axis` (the split's color): the rank of its
// first member, the same for every member, different for every other group.
int group_color(const GridShape& shape, Axis axis, int rank);

class ProcessGrid {
 public:
  // `world` (the caller keeps it alive), of shape.size() ranks, arranged as `shape`.
  // Collective over the world: it is split once for each axis of more than one rank and fewer
  // than the world; an axis of the whole world is the world itself and one of one rank a single
  // process (no collective). Every rank must pass the same shape. DistError for a shape of
  // another size than the world, or any dimension under 1.
  ProcessGrid(Communicator& world, GridShape shape);
  // The same, owning the world.
  ProcessGrid(std::unique_ptr<Communicator> world, GridShape shape);
  // Data parallelism over the whole world (world.size() x 1 x 1): what memfit trains with.
  explicit ProcessGrid(Communicator& world);

  ProcessGrid(const ProcessGrid&) = delete;
  ProcessGrid& operator=(const ProcessGrid&) = delete;

  Communicator& world() const { return *world_; }
  Communicator& group(Axis axis) const { return *groups_[static_cast<size_t>(axis)]; }
  // The ranks that hold the same model part and see different rows of each batch: gradients,
  // losses and ZeRO's shards are summed and split over these.
  Communicator& data() const { return group(Axis::data); }
  Communicator& pipeline() const { return group(Axis::pipeline); }
  Communicator& tensor() const { return group(Axis::tensor); }

  const GridShape& shape() const { return shape_; }
  const GridCoords& coords() const { return coords_; }  // this rank's

 private:
  std::unique_ptr<Communicator> owned_world_;
  Communicator* world_;
  GridShape shape_;
  GridCoords coords_;
  std::array<std::unique_ptr<Communicator>, kAxes.size()> owned_groups_;
  std::array<Communicator*, kAxes.size()> groups_{};
};

}  // namespace memfit::dist
