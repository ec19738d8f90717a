// Shape: up to 6 dimensions held inline, since shapes are made on every kernel call and a heap
// vector for four integers is waste. Prints as "(8, 256, 768)" for error messages.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include <fmt/format.h>

namespace memfit {

class Shape {
 public:
  static constexpr int kMaxRank = 6;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);

  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[i < 0 ? i + rank_ : i]; }
  int64_t& operator[](int i) { return dims_[i < 0 ? i + rank_ : i]; }
  int64_t numel() const;
  const int64_t* begin() const { return dims_.data(); }
  const int64_t* end() const { return dims_.data() + rank_; }
  void push_back(int64_t d);

  bool operator==(const Shape& other) const;
  std::string to_string() const;

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

}  // namespace memfit

template <>
struct fmt::formatter<memfit::Shape> : fmt::formatter<std::string> {
  auto format(const memfit::Shape& s, format_context& ctx) const {
    return fmt::formatter<std::string>::format(s.to_string(), ctx);
  }
};
