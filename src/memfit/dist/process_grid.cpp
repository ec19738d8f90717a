#include "memfit/dist/process_grid.h"

#include <fmt/format.h>

#include "memfit/core/error.h"

namespace memfit::dist {

namespace {

int& coordinate(GridCoords& c, Axis axis) {
  switch (axis) {
    case Axis::data: return c.data;
    case Axis::pipeline: return c.pipeline;
    case Axis::tensor: return c.tensor;
  }
  MEMFIT_THROW(DistError, "grid", "axis {} out of range", static_cast<int>(axis));
}

void check_shape(const GridShape& shape) {
  for (Axis a : kAxes)
    if (shape.along(a) < 1)
      MEMFIT_THROW(DistError, "grid", "{} ranks along {}; every dimension is 1 or more",
                   shape.along(a), axis_name(a));
}

}  // namespace

std::string_view axis_name(Axis axis) {
  switch (axis) {
    case Axis::data: return "data";
    case Axis::pipeline: return "pipeline";
    case Axis::tensor: return "tensor";
  }
  return "?";
}

int GridShape::along(Axis axis) const {
  GridCoords dims{data, pipeline, tensor};
  return coordinate(dims, axis);
}

std::string GridShape::describe() const {
  return fmt::format("{} data x {} pipeline x {} tensor", data, pipeline, tensor);
}

int GridCoords::along(Axis axis) const {
  GridCoords c = *this;
  return coordinate(c, axis);
}

int grid_rank(const GridShape& shape, const GridCoords& at) {
  check_shape(shape);
  for (Axis a : kAxes)
    if (at.along(a) < 0 || at.along(a) >= shape.along(a))
      MEMFIT_THROW(DistError, "grid", "{} index {} outside a grid of {}", axis_name(a),
                   at.along(a), shape.describe());
  return (at.data * shape.pipeline + at.pipeline) * shape.tensor + at.tensor;
}

GridCoords grid_coords(const GridShape& shape, int rank) {
  check_shape(shape);
  if (rank < 0 || rank >= shape.size())
    MEMFIT_THROW(DistError, "grid", "rank {} outside a grid of {} ({} ranks)", rank,
                 shape.describe(), shape.size());
  GridCoords c;
  c.tensor = rank % shape.tensor;
  c.pipeline = rank / shape.tensor % shape.pipeline;
  c.data = rank / (shape.tensor * shape.pipeline);
  return c;
}

std::vector<int> group_ranks(const GridShape& shape, Axis axis, int rank) {
  GridCoords c = grid_coords(shape, rank);
  std::vector<int> ranks;
  for (int i = 0; i < shape.along(axis); ++i) {
    coordinate(c, axis) = i;
    ranks.push_back(grid_rank(shape, c));
  }
  return ranks;
}

int group_color(const GridShape& shape, Axis axis, int rank) {
  GridCoords c = grid_coords(shape, rank);
  coordinate(c, axis) = 0;
  return grid_rank(shape, c);
}

ProcessGrid::ProcessGrid(Communicator& world, GridShape shape) : world_(&world), shape_(shape) {
  check_shape(shape_);
  if (shape_.size() != world.size())
    MEMFIT_THROW(DistError, "grid", "a grid of {} is {} ranks; the world has {}",
                 shape_.describe(), shape_.size(), world.size());
  coords_ = grid_coords(shape_, world.rank());
  // The same decisions in the same order on every rank (they depend on the shape alone), so
  // the splits, which are collectives, match.
  for (Axis a : kAxes) {
    const size_t i = static_cast<size_t>(a);
    const int n = shape_.along(a);
    if (n == world.size()) {
      groups_[i] = &world;
      continue;
    }
    if (n == 1) {
      owned_groups_[i] = make_single_communicator();
      owned_groups_[i]->set_timeout(world.timeout());
    } else {
      owned_groups_[i] = world.split(group_color(shape_, a, world.rank()), coords_.along(a));
    }
    groups_[i] = owned_groups_[i].get();
    if (groups_[i]->size() != n || groups_[i]->rank() != coords_.along(a))
      MEMFIT_THROW(DistError, "grid",
                   "the {} group of rank {} has {} ranks and numbers it {}; a grid of {} wants "
                   "{} and {}",
                   axis_name(a), world.rank(), groups_[i]->size(), groups_[i]->rank(),
                   shape_.describe(), n, coords_.along(a));
  }
}

ProcessGrid::ProcessGrid(std::unique_ptr<Communicator> world, GridShape shape)
    : ProcessGrid(*world, shape) {
  owned_world_ = std::move(world);
}

ProcessGrid::ProcessGrid(Communicator& world) : ProcessGrid(world, GridShape{world.size()}) {}

}  // namespace memfit::dist
