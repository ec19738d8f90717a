#include "memfit/core/shape.h"

#include "memfit/core/error.h"

namespace memfit {

Shape::Shape(std::initializer_list<int64_t> dims) {
  MEMFIT_CHECK_SHAPE(dims.size() <= kMaxRank, "shape", "rank {} exceeds {}", dims.size(), kMaxRank);
  for (int64_t d : dims) push_back(d);
}

void Shape::push_back(int64_t d) {
  MEMFIT_CHECK_SHAPE(rank_ < kMaxRank, "shape", "rank exceeds {}", kMaxRank);
  MEMFIT_CHECK_SHAPE(d >= 0, "shape", "negative dimension {}", d);
  dims_[rank_++] = d;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[i];
  return n;
}

bool Shape::operator==(const Shape& other) const {
  if (rank_ != other.rank_) return false;
  for (int i = 0; i < rank_; ++i)
    if (dims_[i] != other.dims_[i]) return false;
  return true;
}

std::string Shape::to_string() const {
  std::string s = "(";
  for (int i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string(dims_[i]);
  return s + (rank_ == 1 ? ",)" : ")");
}

}  // namespace memfit
