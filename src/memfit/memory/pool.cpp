#include "memfit/memory/pool.h"

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace memfit {

namespace {
std::string breakdown_text(const CategoryBytes& bytes) {
  std::string s;
  for (Category c : kAllCategories) {
    size_t b = bytes[static_cast<size_t>(c)];
    if (b == 0) continue;
    s += fmt::format("{}{} {}", s.empty() ? "" : ", ", category_name(c), format_mib(b));
  }
  return s.empty() ? "nothing" : s;
}
size_t sum(const CategoryBytes& bytes) {
  size_t t = 0;
  for (size_t b : bytes) t += b;
  return t;
}
}  // namespace

std::string format_mib(size_t bytes) {
  // A size that rounds to "0.0 MiB" but is not zero (`--mem-limit 1KiB`) says its bytes.
  if (bytes > 0 && bytes * 20 < (size_t{1} << 20)) return fmt::format("{} bytes", bytes);
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

size_t parse_bytes(std::string_view text, std::string_view what) {
  std::string t(text);
  char* end = nullptr;
  double value = std::strtod(t.c_str(), &end);
  std::string unit(end);
  for (auto& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  while (!unit.empty() && unit.back() == 'b' && unit != "b") unit.pop_back();  // "gib" -> "gi"
  double scale = 0;
  if (unit.empty() || unit == "b") scale = 1;
  else if (unit == "k" || unit == "ki") scale = 1024.0;
  else if (unit == "m" || unit == "mi") scale = 1024.0 * 1024;
  else if (unit == "g" || unit == "gi") scale = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "ti") scale = 1024.0 * 1024 * 1024 * 1024;
  if (end == t.c_str() || scale == 0 || !(value >= 0) || !std::isfinite(value))
    MEMFIT_THROW(ConfigError, "config",
                 "{}: cannot read '{}' as a size; expected a number with an optional unit "
                 "(B, KiB, MiB, GiB, TiB), e.g. 2GiB",
                 what, text);
  return static_cast<size_t>(value * scale);
}

OutOfMemoryError::OutOfMemoryError(std::string_view where, size_t requested, Category category,
                                   std::string_view tag, size_t budget, const CategoryBytes& live)
    : Error(where, "memory",
            fmt::format("out of memory: {} requested for {} ({}) with {} budget; live {} ({}); "
                        "at most {} more would fit",
                        format_mib(requested), category_name(category), tag, format_mib(budget),
                        format_mib(sum(live)), breakdown_text(live),
                        format_mib(budget > sum(live) ? budget - sum(live) : 0))),
      requested_(requested), category_(category), budget_(budget), live_(live) {}

OutOfMemoryError::OutOfMemoryError(std::string_view where, std::string_view detail,
                                   size_t requested, Category category, size_t budget,
                                   const CategoryBytes& live)
    : Error(where, "memory", detail),
      requested_(requested), category_(category), budget_(budget), live_(live) {}

size_t OutOfMemoryError::live_total() const { return sum(live_); }
size_t OutOfMemoryError::would_fit() const {
  return budget_ > live_total() ? budget_ - live_total() : 0;
}

Allocation& Allocation::operator=(Allocation&& o) noexcept {
  if (this != &o) {
    release();
    pool_ = o.pool_;
    data_ = o.data_;
    bytes_ = o.bytes_;
    category_ = o.category_;
    tag_ = std::move(o.tag_);
    o.pool_ = nullptr;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void Allocation::release() {
  if (data_ && pool_) pool_->free_block(data_, bytes_, category_, tag_);
  data_ = nullptr;
  pool_ = nullptr;
  bytes_ = 0;
}

MemoryPool::MemoryPool(size_t budget) : budget_(budget) {}
MemoryPool::~MemoryPool() = default;

Allocation MemoryPool::allocate(size_t bytes, Category category, std::string_view tag) {
  size_t rounded = round_up(bytes == 0 ? 1 : bytes);
  {
    std::lock_guard lock(mu_);
    if (total_current_ + rounded > budget_)
      throw OutOfMemoryError(detail::where(__FILE__, __LINE__), rounded, category, tag, budget_,
                             current_);
  }
  // Zero-filled and aligned. The memset touches every page now, so the resident set matches
  // the account from the first step on; memfit allocates slabs once and reuses them, so this
  // cost is paid once per run, not per step.
  void* data = std::aligned_alloc(kPoolAlignment, rounded);
  if (data == nullptr) {
    // Out of memory all the same (exit 3), below the budget: the machine has less than it.
    CategoryBytes live;
    {
      std::lock_guard lock(mu_);
      live = current_;
    }
    throw OutOfMemoryError(
        detail::where(__FILE__, __LINE__),
        fmt::format("the system refused {} for {} ({}) with {} live in the pool; give "
                    "--mem-limit (at most the machine's free memory) to plan within it",
                    format_mib(rounded), category_name(category), tag, format_mib(sum(live))),
        rounded, category, budget_, live);
  }
  std::memset(data, 0, rounded);

  Allocation a;
  a.pool_ = this;
  a.data_ = data;
  a.bytes_ = rounded;
  a.category_ = category;
  a.tag_ = std::string(tag);

  std::lock_guard lock(mu_);
  size_t i = static_cast<size_t>(category);
  current_[i] += rounded;
  total_current_ += rounded;
  ++count_[i];
  ++live_;
  if (current_[i] > peak_[i]) peak_[i] = current_[i];
  if (total_current_ > total_peak_) {
    total_peak_ = total_current_;
    at_total_peak_ = current_;
  }
  auto& live = by_tag_[{a.tag_, category}];
  live.first += rounded;
  ++live.second;
  record(MemoryEvent::Kind::alloc, category, rounded, a.tag_);
  return a;
}

void MemoryPool::free_block(void* data, size_t bytes, Category category, const std::string& tag) {
  std::free(data);
  std::lock_guard lock(mu_);
  size_t i = static_cast<size_t>(category);
  current_[i] -= bytes;
  total_current_ -= bytes;
  --live_;
  if (auto it = by_tag_.find({tag, category}); it != by_tag_.end()) {
    it->second.first -= bytes;
    if (--it->second.second == 0) by_tag_.erase(it);
  }
  record(MemoryEvent::Kind::free, category, bytes, tag);
}

void MemoryPool::record(MemoryEvent::Kind kind, Category c, size_t bytes, const std::string& tag) {
  if (!recording_) return;
  if (events_.size() >= max_events_) {
    ++dropped_;
    return;
  }
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count();
  events_.push_back(
      {kind, c, bytes, total_current_, seq_++, static_cast<uint64_t>(ns), tag, phase_});
}

void MemoryPool::set_budget(size_t budget) {
  std::lock_guard lock(mu_);
  budget_ = budget;
}
size_t MemoryPool::budget() const {
  std::lock_guard lock(mu_);
  return budget_;
}
size_t MemoryPool::bytes_current() const {
  std::lock_guard lock(mu_);
  return total_current_;
}
size_t MemoryPool::bytes_peak() const {
  std::lock_guard lock(mu_);
  return total_peak_;
}
size_t MemoryPool::bytes_current(Category c) const {
  std::lock_guard lock(mu_);
  return current_[static_cast<size_t>(c)];
}
size_t MemoryPool::bytes_peak(Category c) const {
  std::lock_guard lock(mu_);
  return peak_[static_cast<size_t>(c)];
}
CategoryBytes MemoryPool::current_breakdown() const {
  std::lock_guard lock(mu_);
  return current_;
}
CategoryBytes MemoryPool::peak_breakdown() const {
  std::lock_guard lock(mu_);
  return at_total_peak_;
}
uint64_t MemoryPool::allocation_count() const {
  std::lock_guard lock(mu_);
  uint64_t n = 0;
  for (auto c : count_) n += c;
  return n;
}
uint64_t MemoryPool::allocation_count(Category c) const {
  std::lock_guard lock(mu_);
  return count_[static_cast<size_t>(c)];
}
size_t MemoryPool::live_allocations() const {
  std::lock_guard lock(mu_);
  return live_;
}
void MemoryPool::reset_peak() {
  std::lock_guard lock(mu_);
  total_peak_ = total_current_;
  peak_ = current_;
  at_total_peak_ = current_;
}
std::vector<TagBytes> MemoryPool::live_by_tag() const {
  std::lock_guard lock(mu_);
  std::vector<TagBytes> out;
  out.reserve(by_tag_.size());
  for (const auto& [key, live] : by_tag_) out.push_back({key.first, key.second, live.first, live.second});
  return out;
}
void MemoryPool::set_recording(bool on, size_t max_events) {
  std::lock_guard lock(mu_);
  recording_ = on;
  max_events_ = max_events;
}
uint64_t MemoryPool::events_dropped() const {
  std::lock_guard lock(mu_);
  return dropped_;
}
void MemoryPool::set_phase(std::string phase) {
  std::lock_guard lock(mu_);
  phase_ = std::move(phase);
}
std::vector<MemoryEvent> MemoryPool::events() const {
  std::lock_guard lock(mu_);
  return events_;
}
void MemoryPool::clear_events() {
  std::lock_guard lock(mu_);
  events_.clear();
  dropped_ = 0;
}

}  // namespace memfit
