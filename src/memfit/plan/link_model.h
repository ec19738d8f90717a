// The links a step's transfers cross, for step-time estimates of layouts larger than this host
// (issue 43, item 5): a link within a node (`--link intra=BW,LAT`) and one between nodes
// (`--link inter=BW,LAT`), with `--ranks-per-node N` saying where the grid's ranks lie (rank r
// on node r / N). Each collective and each point-to-point transfer is priced on the link its
// ranks span: the slower one as soon as a group holds ranks of two nodes. The defaults: intra
// from this host's measured copy rate (the shared-memory transport's), inter an estimate
// (InfiniBand HDR-like); neither is a measurement of the cluster a run would use. Note
// [Step-time model], "Links" (docs/notes/planner.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

// Declared, not included: run_spec.h holds a LinkModel, and is included widely.
namespace memfit::dist {
struct GridShape;
enum class Axis : uint8_t;
}  // namespace memfit::dist

namespace memfit {

struct Calibration;

// One direction of a link: the bytes a rank sends per second, and the latency of one message.
// bytes_per_s 0: this host's shared-memory transport, priced from the calibration (below).
struct Link {
  double bytes_per_s = 0;
  double latency_s = 0;
  bool operator==(const Link&) const = default;
};

// The default inter-node link: 25 GB/s and 5 us a message, an InfiniBand HDR-like estimate
// (200 Gb/s), not a measurement.
inline constexpr Link kDefaultInterLink{25e9, 5e-6};
// The default intra-node latency: about a shared-memory MPI message's (1 us).
inline constexpr double kDefaultIntraLatency = 1e-6;

struct LinkModel {
  // Within a node; bytes_per_s 0: this host's (sent_bytes_per_s's default).
  Link intra{0, kDefaultIntraLatency};
  Link inter = kDefaultInterLink;
  int ranks_per_node = 0;  // 0: every rank on this one node (nothing crosses `inter`)
  bool intra_given = false, inter_given = false;  // --link given (else the defaults above)

  // Whether `ranks` lie on more than one node.
  bool spans_nodes(const std::vector<int>& ranks) const;
  // The link a group of `ranks` spans: inter where it holds ranks of two nodes, else intra.
  const Link& link(const std::vector<int>& ranks) const {
    return spans_nodes(ranks) ? inter : intra;
  }
  // The link of the groups along `axis` of `shape`: inter where any of them spans nodes (they
  // run at once; the step waits for the slowest).
  const Link& axis_link(const dist::GridShape& shape, dist::Axis axis) const;
  // The link between pipeline stages `stage` and `stage + 1`: inter where any pipeline group's
  // two ranks there lie on two nodes.
  const Link& stage_link(const dist::GridShape& shape, int stage) const;
  bool operator==(const LinkModel&) const = default;
};

// `--link intra=BW,LAT` / `--link inter=BW,LAT` into `model`: BW in GB/s (a number, or with the
// unit GB/s, GiB/s or Gb/s), LAT in microseconds (a number, or with the unit ns, us or ms):
// "inter=25GB/s,5us", "intra=300,0.5". ConfigError naming --link and the text otherwise.
void parse_link(std::string_view text, LinkModel& model);

// A link's sending rate: its own, or for this host's (bytes_per_s 0) half the calibrated
// memory-copy rate: the shared-memory transport copies each byte twice (the sender in, the
// receiver out), and a rank in a ring sends and receives at once.
double link_bytes_per_s(const Link& link, const Calibration& rates);

// Seconds to send `bytes` from each rank over `messages` sequential messages on `link`.
double link_seconds(const Link& link, double bytes, double messages, const Calibration& rates);

// "intra 11.6 GB/s, 1 us (this host's copy rate); inter 25 GB/s, 5 us (an estimate, InfiniBand
// HDR-like), 8 ranks a node": what the plan prints beside the numbers it priced on them.
std::string describe_links(const LinkModel& model, const Calibration& rates);

}  // namespace memfit
