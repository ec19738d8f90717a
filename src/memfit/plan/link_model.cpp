// The links between ranks and their prices; see link_model.h.
#include "memfit/plan/link_model.h"

#include <charconv>
#include <initializer_list>
#include <utility>

#include <fmt/format.h>

#include "memfit/core/error.h"
#include "memfit/dist/process_grid.h"
#include "memfit/plan/calibration.h"

namespace memfit {

bool LinkModel::spans_nodes(const std::vector<int>& ranks) const {
  if (ranks_per_node <= 0) return false;
  for (int r : ranks)
    if (r / ranks_per_node != ranks.front() / ranks_per_node) return true;
  return false;
}

const Link& LinkModel::axis_link(const dist::GridShape& shape, dist::Axis axis) const {
  if (ranks_per_node <= 0 || shape.along(axis) <= 1) return intra;
  for (int r = 0; r < shape.size(); ++r)
    if (spans_nodes(dist::group_ranks(shape, axis, r))) return inter;
  return intra;
}

const Link& LinkModel::stage_link(const dist::GridShape& shape, int stage) const {
  if (ranks_per_node <= 0) return intra;
  for (int d = 0; d < shape.data; ++d)
    for (int t = 0; t < shape.tensor; ++t) {
      const int a = dist::grid_rank(shape, {d, stage, t});
      const int b = dist::grid_rank(shape, {d, stage + 1, t});
      if (spans_nodes({a, b})) return inter;
    }
  return intra;
}

namespace {

// A number at least 0 followed by one of `units` (each with its factor), or by nothing (the
// first unit's factor).
double parse_quantity(std::string_view text, std::string_view whole,
                      std::initializer_list<std::pair<std::string_view, double>> units) {
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  const std::string_view unit(end, static_cast<size_t>(text.data() + text.size() - end));
  double factor = unit.empty() ? units.begin()->second : 0;
  for (const auto& [name, f] : units)
    if (unit == name) factor = f;
  if (ec != std::errc{} || factor == 0 || !(value >= 0))
    MEMFIT_THROW(ConfigError, "link",
                 "--link {}: '{}' is not a number with a unit (want e.g. --link inter=25GB/s,5us "
                 "or --link intra=300,1: GB/s and microseconds)",
                 whole, text);
  return value * factor;
}

}  // namespace

void parse_link(std::string_view text, LinkModel& model) {
  const size_t eq = text.find('='), comma = text.find(',');
  const std::string_view name = text.substr(0, eq);
  if (eq == std::string_view::npos || comma == std::string_view::npos || comma < eq ||
      (name != "intra" && name != "inter"))
    MEMFIT_THROW(ConfigError, "link",
                 "--link {}: want intra=BW,LAT or inter=BW,LAT (BW in GB/s, LAT in "
                 "microseconds), e.g. --link inter=25GB/s,5us",
                 text);
  Link link;
  link.bytes_per_s = parse_quantity(text.substr(eq + 1, comma - eq - 1), text,
                                    {{"GB/s", 1e9}, {"GiB/s", 1073741824.0}, {"Gb/s", 1e9 / 8}});
  link.latency_s = parse_quantity(text.substr(comma + 1), text,
                                  {{"us", 1e-6}, {"ns", 1e-9}, {"ms", 1e-3}});
  if (!(link.bytes_per_s > 0))
    MEMFIT_THROW(ConfigError, "link", "--link {}: the bandwidth must be above 0", text);
  if (name == "intra") {
    model.intra = link;
    model.intra_given = true;
  } else {
    model.inter = link;
    model.inter_given = true;
  }
}

double link_bytes_per_s(const Link& link, const Calibration& rates) {
  return link.bytes_per_s > 0 ? link.bytes_per_s : rates.copy_bytes_per_s / 2;
}

double link_seconds(const Link& link, double bytes, double messages, const Calibration& rates) {
  if (bytes <= 0 && messages <= 0) return 0;
  return bytes / link_bytes_per_s(link, rates) + messages * link.latency_s;
}

std::string describe_links(const LinkModel& m, const Calibration& rates) {
  auto one = [&](const Link& l) {
    return fmt::format("{:.3g} GB/s, {:.3g} us", link_bytes_per_s(l, rates) / 1e9,
                       l.latency_s * 1e6);
  };
  std::string s = fmt::format(
      "intra {} ({}), inter {} ({})", one(m.intra),
      m.intra_given ? "--link" : "this host's measured copy rate, halved: each byte copied in and out",
      one(m.inter), m.inter_given ? "--link" : "an estimate, InfiniBand HDR-like, not measured");
  s += m.ranks_per_node > 0 ? fmt::format(", {} ranks a node", m.ranks_per_node)
                            : std::string(", every rank on one node (--ranks-per-node)");
  return s;
}

}  // namespace memfit
