// The tracking pool: the one source of tensor memory in memfit. It aligns, counts current and
// peak bytes per category and in total, enforces a budget at allocation time and records an
// event log that later becomes a memory timeline. See docs/notes/memory-pool.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "memfit/core/error.h"
#include "memfit/memory/category.h"

namespace memfit {

inline constexpr size_t kUnlimited = std::numeric_limits<size_t>::max();
inline constexpr size_t kPoolAlignment = 64;

// Thrown when an allocation would pass the budget. Carries the numbers a caller (or the
// planner's advice) needs; the message prints the live breakdown in MiB.
class OutOfMemoryError : public Error {
 public:
  OutOfMemoryError(std::string_view where, size_t requested, Category category,
                   std::string_view tag, size_t budget, const CategoryBytes& live);
  // The planner's out-of-memory, before anything is allocated: no configuration it may choose
  // fits (`detail` says why); `requested` is the least footprint, `live` empty.
  OutOfMemoryError(std::string_view where, std::string_view detail, size_t requested,
                   Category category, size_t budget, const CategoryBytes& live);
  size_t requested() const { return requested_; }
  Category category() const { return category_; }
  size_t budget() const { return budget_; }
  const CategoryBytes& live() const { return live_; }
  size_t live_total() const;
  // Largest allocation that would still fit under the budget.
  size_t would_fit() const;
  // What would make the run fit, from the planner (plan/fit_advice.h): lines that the command
  // prints after the message. Empty unless a caller added it.
  const std::string& advice() const { return advice_; }
  void set_advice(std::string advice) { advice_ = std::move(advice); }

 private:
  size_t requested_;
  Category category_;
  size_t budget_;
  CategoryBytes live_;
  std::string advice_;
};

struct MemoryEvent {
  enum class Kind : uint8_t { alloc, free };
  Kind kind;
  Category category;
  size_t bytes;
  size_t total_after;  // live bytes in all categories after this event
  uint64_t seq;        // event number, in order
  uint64_t ns;         // when: std::chrono::steady_clock, nanoseconds since its epoch
  std::string tag;     // e.g. "h.3.attn.qkv"
  std::string phase;   // e.g. "step 12/forward"
};

// What is live under one tag: the leak check (profile/leak_check.h) compares these between step
// boundaries.
struct TagBytes {
  std::string tag;
  Category category;
  size_t bytes = 0;    // accounted bytes live under (tag, category)
  size_t count = 0;    // live allocations
};

class MemoryPool;

// A block of pool memory; frees itself when destroyed. Move-only.
class Allocation {
 public:
  Allocation() = default;
  Allocation(Allocation&& o) noexcept { *this = std::move(o); }
  Allocation& operator=(Allocation&& o) noexcept;
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;
  ~Allocation() { release(); }

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Category category() const { return category_; }
  explicit operator bool() const { return data_ != nullptr; }
  void release();

 private:
  friend class MemoryPool;
  MemoryPool* pool_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;  // accounted bytes: the request rounded up to the alignment
  Category category_ = Category::workspace;
  std::string tag_;
};

class MemoryPool {
 public:
  explicit MemoryPool(size_t budget = kUnlimited);
  ~MemoryPool();
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  // Zero-filled memory of at least `bytes`, aligned to kPoolAlignment. Throws OutOfMemoryError
  // if the live total would pass the budget.
  Allocation allocate(size_t bytes, Category category, std::string_view tag);

  void set_budget(size_t budget);
  size_t budget() const;

  size_t bytes_current() const;
  size_t bytes_peak() const;
  size_t bytes_current(Category c) const;
  size_t bytes_peak(Category c) const;  // the category's own peak, whenever it happened
  CategoryBytes current_breakdown() const;
  // Bytes per category at the moment the total peaked: the breakdown that explains the peak.
  CategoryBytes peak_breakdown() const;
  uint64_t allocation_count() const;
  uint64_t allocation_count(Category c) const;
  size_t live_allocations() const;
  // Forget the peaks: the peak becomes what is live now.
  void reset_peak();

  // Live bytes by (tag, category), sorted by tag then category: always kept (one map update
  // per allocation and free; memfit allocates slabs, a few dozen a run).
  std::vector<TagBytes> live_by_tag() const;

  // Event log. Off by default (it grows with every allocation); phase labels every event. At
  // most `max_events` are kept (the first ones: a run allocates its slabs up front); the rest
  // are counted in events_dropped(), so the log's memory is bounded (about 100 bytes an event).
  void set_recording(bool on, size_t max_events = kDefaultMaxEvents);
  void set_phase(std::string phase);
  std::vector<MemoryEvent> events() const;
  uint64_t events_dropped() const;
  void clear_events();
  static constexpr size_t kDefaultMaxEvents = 100000;

  static size_t round_up(size_t bytes) {
    return (bytes + kPoolAlignment - 1) / kPoolAlignment * kPoolAlignment;
  }

 private:
  friend class Allocation;
  void free_block(void* data, size_t bytes, Category category, const std::string& tag);
  void record(MemoryEvent::Kind kind, Category c, size_t bytes, const std::string& tag);

  mutable std::mutex mu_;
  size_t budget_;
  size_t total_current_ = 0, total_peak_ = 0;
  CategoryBytes current_{}, peak_{}, at_total_peak_{};
  std::array<uint64_t, kNumCategories> count_{};
  size_t live_ = 0;
  bool recording_ = false;
  size_t max_events_ = kDefaultMaxEvents;
  uint64_t dropped_ = 0;
  std::string phase_;
  uint64_t seq_ = 0;
  std::vector<MemoryEvent> events_;
  std::map<std::pair<std::string, Category>, std::pair<size_t, size_t>> by_tag_;  // bytes, count
};

// Formats a byte count as MiB with one decimal: "12.5 MiB"; under 0.05 MiB, not zero, in bytes:
// "1024 bytes".
std::string format_mib(size_t bytes);
// Parses "2GiB", "512MiB", "1.5G", "1000000" (bytes). Throws ConfigError naming `what`.
size_t parse_bytes(std::string_view text, std::string_view what = "memory size");

}  // namespace memfit
