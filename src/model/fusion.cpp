#include "tileweave/model/fusion.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

namespace tw {

const char* to_string(EdgeClass c) {
  switch (c) {
    case EdgeClass::OneToOne: return "one-to-one";
    case EdgeClass::Reorganize: return "reorganize";
    case EdgeClass::Shuffle: return "shuffle";
    case EdgeClass::OneToMany: return "one-to-many";
    case EdgeClass::ManyToMany: return "many-to-many";
  }
  return "?";
}

namespace {

bool same_rect(const Region& a, const Region& b) {
  return a.tensor == b.tensor && a.r0 == b.r0 && a.r1 == b.r1 && a.c0 == b.c0 && a.c1 == b.c1;
}

// Do the producer tiles' output cells (tm, tn) form one filled rectangle of the producer's grid?
bool is_rectangle(const TileGraph& g, const std::vector<int>& tiles) {
  std::set<std::pair<int64_t, int64_t>> cells;
  for (int t : tiles) cells.insert({g.tile(t).tm, g.tile(t).tn});
  int64_t m0 = INT64_MAX, m1 = -1, n0 = INT64_MAX, n1 = -1;
  for (auto [m, n] : cells) m0 = std::min(m0, m), m1 = std::max(m1, m), n0 = std::min(n0, n), n1 = std::max(n1, n);
  return static_cast<int64_t>(cells.size()) == (m1 - m0 + 1) * (n1 - n0 + 1);
}

struct Acc {
  std::map<int, std::vector<int>> producers_of;  // consumer tile -> producer tiles it waits on here
  std::map<int, int> fan_out;                    // producer tile -> consumer tiles it feeds here
  bool exact = true;                             // every consumer read equals its one producer's write
};

// Elements of tensor t that op `po` wrote, and how many times the consumer tiles read them: both on a
// grid of the distinct row and column edges of the writes and reads (overlapping writes, e.g.
// split-K slices or attention tiles sharing a pair, count once), read counts by 2-D prefix sums.
double reads_per_element(const TileGraph& g, const Op& po, int t, const std::map<int, std::vector<int>>& readers) {
  std::vector<Region> writes, reads;
  for (int i = po.first_tile; i < po.first_tile + po.num_tiles; ++i)
    for (const Region& w : g.tile(i).writes)
      if (w.tensor == t) writes.push_back(w);
  for (const auto& [ct, ps] : readers)
    for (const Region& r : g.tile(ct).reads)
      if (r.tensor == t) reads.push_back(r);
  std::vector<int64_t> rs, cs;
  for (const auto* list : {&writes, &reads})
    for (const Region& x : *list) rs.insert(rs.end(), {x.r0, x.r1}), cs.insert(cs.end(), {x.c0, x.c1});
  for (auto* v : {&rs, &cs}) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
  }
  const size_t nr = rs.size(), nc = cs.size();
  auto at = [](const std::vector<int64_t>& v, int64_t x) { return std::lower_bound(v.begin(), v.end(), x) - v.begin(); };
  std::vector<uint8_t> covered((nr - 1) * (nc - 1), 0);
  for (const Region& w : writes)
    for (auto i = at(rs, w.r0); i < at(rs, w.r1); ++i)
      for (auto j = at(cs, w.c0); j < at(cs, w.c1); ++j) covered[i * (nc - 1) + j] = 1;
  // sum[i][j]: written elements in rows [rs[0], rs[i]) x columns [cs[0], cs[j]).
  std::vector<double> sum(nr * nc, 0.0);
  double wrote = 0;
  for (size_t i = 1; i < nr; ++i)
    for (size_t j = 1; j < nc; ++j) {
      const double cell = covered[(i - 1) * (nc - 1) + (j - 1)] ? double(rs[i] - rs[i - 1]) * double(cs[j] - cs[j - 1]) : 0.0;
      wrote += cell;
      sum[i * nc + j] = cell + sum[(i - 1) * nc + j] + sum[i * nc + j - 1] - sum[(i - 1) * nc + j - 1];
    }
  double read = 0;
  for (const Region& r : reads) {
    const auto i0 = at(rs, r.r0), i1 = at(rs, r.r1), j0 = at(cs, r.c0), j1 = at(cs, r.c1);
    read += sum[i1 * nc + j1] - sum[i0 * nc + j1] - sum[i1 * nc + j0] + sum[i0 * nc + j0];
  }
  return wrote > 0 ? read / wrote : 0.0;
}

std::string meaning(const FusionEdge& e) {
  const std::string k = std::to_string(e.fan_in_max), n = std::to_string(e.producer_tiles);
  switch (e.cls) {
    case EdgeClass::OneToOne:
      return "consumer tile i can start when producer tile i is done: fuse into the producer's epilogue, the data need "
             "not leave the SM";
    case EdgeClass::Reorganize:
      return "each consumer tile waits on " + (e.fan_in_max == 1 ? std::string("one producer tile") : "a block of up to " + k + " neighbouring producer tiles") +
             " and reads each element once: tile-level waits, the data can stay in L2";
    case EdgeClass::Shuffle:
      return "each consumer tile waits on up to " + k +
             " producer tiles scattered over the grid: tile-level waits; an order that runs them together keeps the data "
             "in L2";
    case EdgeClass::OneToMany:
      return "each consumer tile waits on one producer tile whose output " + std::to_string(e.fan_out_max) +
             " consumer tiles read: tile-level waits (or recompute the producer tile per consumer)";
    case EdgeClass::ManyToMany:
      if (e.barrier)
        return "a consumer tile waits on all " + n +
               " producer tiles: a barrier between the ops; fusing saves the launch and overlaps only the producer's tail";
      return "each consumer tile waits on " + std::to_string(e.fan_in_min) + ".." + k + " of " + n +
             " producer tiles: the first consumer can start after " + std::to_string(e.fan_in_min) +
             " producer tiles (an order that finishes them first), then overlap";
  }
  return "";
}

}  // namespace

std::vector<FusionEdge> fusion_report(const TileGraph& g) {
  std::map<std::tuple<int, int, int>, Acc> acc;  // (producer op, consumer op, tensor)
  for (int c = 0; c < g.num_tiles(); ++c) {
    const Tile& ct = g.tile(c);
    for (int d : ct.deps) {
      const Tile& pt = g.tile(d);
      std::set<int> tensors;
      for (const Region& w : pt.writes)
        for (const Region& r : ct.reads)
          if (r.overlaps(w)) {
            tensors.insert(w.tensor);
            if (!same_rect(r, w)) acc[{pt.op, ct.op, w.tensor}].exact = false;
          }
      for (int t : tensors) {
        Acc& a = acc[{pt.op, ct.op, t}];
        a.producers_of[c].push_back(d);
        ++a.fan_out[d];
      }
    }
  }
  std::vector<FusionEdge> out;
  for (auto& [key, a] : acc) {
    const auto [p, c, t] = key;
    FusionEdge e;
    e.producer = p, e.consumer = c, e.tensor = t;
    const Op &po = g.op(p), &co = g.op(c);
    e.producer_tiles = po.num_tiles;
    e.consumer_tiles = co.num_tiles;
    e.fan_in_min = INT32_MAX;
    bool rectangles = true;
    for (auto& [ct, ps] : a.producers_of) {
      const int k = static_cast<int>(ps.size());
      e.pairs += k;
      e.fan_in_min = std::min(e.fan_in_min, k);
      e.fan_in_max = std::max(e.fan_in_max, k);
      e.barrier = e.barrier || (k == po.num_tiles && po.num_tiles > 1);
      rectangles = rectangles && is_rectangle(g, ps);
    }
    e.fan_in_mean = double(e.pairs) / double(a.producers_of.size());
    e.fan_out_min = INT32_MAX;
    for (auto& [pt, n] : a.fan_out) e.fan_out_min = std::min(e.fan_out_min, n), e.fan_out_max = std::max(e.fan_out_max, n);
    e.fan_out_mean = double(e.pairs) / double(a.fan_out.size());
    e.reads_per_element = reads_per_element(g, po, t, a.producers_of);
    const bool once = e.reads_per_element <= 1.0 + 1e-9;
    if (once && e.fan_in_max == 1 && e.fan_out_max == 1 && a.exact) e.cls = EdgeClass::OneToOne;
    else if (once && rectangles) e.cls = EdgeClass::Reorganize;
    else if (once) e.cls = EdgeClass::Shuffle;
    else if (e.fan_in_max == 1) e.cls = EdgeClass::OneToMany;
    else e.cls = EdgeClass::ManyToMany;
    e.meaning = meaning(e);
    out.push_back(e);
  }
  std::sort(out.begin(), out.end(), [](const FusionEdge& x, const FusionEdge& y) {
    return std::tie(x.producer, x.consumer, x.tensor) < std::tie(y.producer, y.consumer, y.tensor);
  });
  return out;
}

}  // namespace tw
