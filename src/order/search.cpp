#include "tileweave/order/search.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <ostream>
#include <random>
#include <unordered_map>

#include "tileweave/order/orders.hpp"

namespace tw {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// ---- exact search ----
//
// With one tile in flight the future cost depends only on which tiles are done and on the cache
// contents in LRU order. Every written block is written back exactly once whatever the order (it is
// written by one tile, and its write-back happens at eviction or at the final flush), so only read
// misses vary; dirty bits can be left out of the state. Blocks no remaining tile will read ("dead")
// matter only through their size, so they enter the key as their size: orders that differ only in
// which dead block sits where share a state.
class ExactSearch {
 public:
  ExactSearch(const TileGraph& g, const CacheConfig& c, const ExactOptions& o)
      : g_(g), model_(g, c), opt_(o), capacity_(c.capacity_bytes) {
    const int n = g.num_tiles();
    readers_.assign(model_.num_blocks(), 0);
    for (int t = 0; t < n; ++t) {
      deps_mask_.push_back(0);
      for (int d : g.tile(t).deps) deps_mask_[t] |= uint64_t{1} << d;
      for (bool reduces : {false, true}) {
        accesses_[reduces].push_back(model_.tile_accesses(t, reduces));
        for (const auto& a : accesses_[reduces].back())
          if (!a.write) readers_[a.block] |= uint64_t{1} << t;
      }
      // The other split-K slices of the same output block: the last of them to finish reduces.
      const Tile& tile = g.tile(t);
      const Op& op = g.op(tile.op);
      uint64_t siblings = 0;
      for (int64_t ks = 0; ks < op.tiling.split_k; ++ks)
        if (ks != tile.ks) siblings |= uint64_t{1} << g.tile_id(tile.op, tile.tm, tile.tn, ks);
      siblings_.push_back(op.workspace >= 0 ? siblings : 0);
    }
    full_ = n == 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1;
    for (int64_t b = 0; b < model_.num_blocks(); ++b) bytes_.push_back(model_.block_bytes(b));
  }

  ExactResult run() {
    t0_ = last_progress_ = Clock::now();
    std::vector<int64_t> lru;
    const Entry root = solve(0, lru);
    ExactResult r;
    r.traffic = root.cost + write_bytes_total();
    r.num_optimal = root.count;
    r.count_saturated = root.count == std::numeric_limits<uint64_t>::max();
    r.states = static_cast<int64_t>(memo_.size());
    r.best.name = "exact";
    uint64_t done = 0;
    for (int i = 0; i < g_.num_tiles(); ++i) {
      const int t = memo_.at(key(done, lru)).next;
      r.best.order.push_back(t);
      apply(t, done, lru);
      done |= uint64_t{1} << t;
    }
    return r;
  }

 private:
  struct Entry {
    int64_t cost;    // read-miss bytes from here to the end, minimal
    uint64_t count;  // number of orders of the remaining tiles reaching it
    int next;        // first tile of one of them
  };

  int64_t write_bytes_total() const {
    int64_t w = 0;
    std::vector<bool> seen(bytes_.size(), false);
    for (const auto& list : accesses_[1])
      for (const auto& a : list)
        if (a.write && !seen[a.block]) seen[a.block] = true, w += bytes_[a.block];
    return w;
  }

  std::string key(uint64_t done, const std::vector<int64_t>& lru) const {
    std::string k(reinterpret_cast<const char*>(&done), sizeof done);
    for (int64_t b : lru) {
      const bool live = (readers_[b] & ~done) != 0;
      const int64_t v = live ? b : -1 - bytes_[b];
      k.append(reinterpret_cast<const char*>(&v), sizeof v);
    }
    return k;
  }

  // Runs tile t on the LRU list (most recent first); returns its read-miss bytes. Mirrors
  // CacheModel's policy: hits move to the front, misses and writes insert at the front after
  // evicting from the back; a block larger than the cache streams through.
  int64_t apply(int t, uint64_t done, std::vector<int64_t>& lru) const {
    const bool reduces = siblings_[t] && (siblings_[t] & ~done) == 0;
    int64_t misses = 0, used = 0;
    for (int64_t b : lru) used += bytes_[b];
    for (const auto& a : accesses_[reduces][t]) {
      auto it = std::find(lru.begin(), lru.end(), a.block);
      if (it != lru.end()) {
        std::rotate(lru.begin(), it, it + 1);
        continue;
      }
      const int64_t bytes = bytes_[a.block];
      if (!a.write) misses += bytes;
      if (bytes > capacity_) continue;
      while (used + bytes > capacity_) used -= bytes_[lru.back()], lru.pop_back();
      lru.insert(lru.begin(), a.block);
      used += bytes;
    }
    return misses;
  }

  Entry solve(uint64_t done, const std::vector<int64_t>& lru) {
    if (done == full_) return {0, 1, -1};
    std::string k = key(done, lru);
    if (auto it = memo_.find(k); it != memo_.end()) return it->second;
    if (static_cast<int64_t>(memo_.size()) >= opt_.max_states)
      throw InvalidArgument("exact search: more than " + std::to_string(opt_.max_states) +
                            " states; the grid is too large for it (use the heuristic search)");
    if ((memo_.size() & 4095) == 0) check_time();
    Entry best{std::numeric_limits<int64_t>::max(), 0, -1};
    for (int t = 0; t < g_.num_tiles(); ++t) {
      const uint64_t bit = uint64_t{1} << t;
      if ((done & bit) || (deps_mask_[t] & ~done)) continue;
      std::vector<int64_t> next = lru;
      const int64_t here = apply(t, done, next);
      const Entry rest = solve(done | bit, next);
      const int64_t cost = here + rest.cost;
      if (cost < best.cost) {
        best = {cost, rest.count, t};
      } else if (cost == best.cost) {
        best.count = best.count > std::numeric_limits<uint64_t>::max() - rest.count ? std::numeric_limits<uint64_t>::max()
                                                                                    : best.count + rest.count;
      }
    }
    memo_.emplace(std::move(k), best);
    return best;
  }

  void check_time() {
    const double s = seconds_since(t0_);
    if (opt_.time_limit_s > 0 && s > opt_.time_limit_s)
      throw InvalidArgument("exact search: time limit " + std::to_string(opt_.time_limit_s) + " s reached after " +
                            std::to_string(memo_.size()) + " states");
    if (opt_.progress && seconds_since(last_progress_) >= 1.0) {
      *opt_.progress << "exact search: " << memo_.size() << " states, " << static_cast<int>(s) << " s\n";
      opt_.progress->flush();
      last_progress_ = Clock::now();
    }
  }

  const TileGraph& g_;
  CacheModel model_;
  ExactOptions opt_;
  int64_t capacity_;
  uint64_t full_ = 0;
  std::vector<uint64_t> deps_mask_, readers_, siblings_;
  std::vector<std::vector<CacheModel::Access>> accesses_[2];  // [reduces][tile]
  std::vector<int64_t> bytes_;
  std::unordered_map<std::string, Entry> memo_;
  Clock::time_point t0_, last_progress_;
};

}  // namespace

ExactResult exact_search(const TileGraph& g, const CacheConfig& c, const ExactOptions& o) {
  c.validate();
  if (c.in_flight != 1)
    throw InvalidArgument("exact search models one tile in flight (P = 1), got P = " + std::to_string(c.in_flight));
  if (c.sets != 1) throw InvalidArgument("exact search models a fully associative cache, got sets = " + std::to_string(c.sets));
  const int limit = std::min(o.max_tiles, 64);
  if (g.num_tiles() > limit)
    throw InvalidArgument("exact search handles at most " + std::to_string(limit) + " tiles, the graph has " +
                          std::to_string(g.num_tiles()));
  if (g.num_tiles() == 0) throw InvalidArgument("exact search: the graph has no tiles");
  return ExactSearch(g, c, o).run();
}

// ---- heuristic search ----

namespace {

int64_t traffic_of(const TileGraph& g, const Schedule& s, const CacheConfig& c) {
  return simulate(g, s, c).dram_total();
}

// Position-local dependency checks for the three moves (the rest of the order is unchanged).
bool depends_on_any(const TileGraph& g, int t, const std::vector<int>& pos, int lo, int hi) {
  for (int d : g.tile(t).deps)
    if (pos[d] >= lo && pos[d] <= hi) return true;
  return false;
}

}  // namespace

HeuristicResult heuristic_search(const TileGraph& g, const CacheConfig& c, const HeuristicOptions& o) {
  c.validate();
  if (o.time_limit_s < 0) throw InvalidArgument("time limit must be >= 0, got " + std::to_string(o.time_limit_s));
  CacheConfig quiet = c;
  quiet.trace = quiet.trace_resident = false;
  const auto t0 = Clock::now();
  HeuristicResult r;
  for (const std::string& name : named_orders(g)) {
    Schedule s = make_order(g, name);
    const int64_t cost = traffic_of(g, s, quiet);
    ++r.evaluations;
    if (r.seed_order.empty() || cost < r.seed_traffic) r.seed_order = name, r.seed_traffic = cost, r.best = s;
  }
  r.traffic = r.seed_traffic;
  const int n = g.num_tiles();
  if (n < 2) return r;

  // Consumers of every tile, for the move checks.
  std::vector<std::vector<int>> consumers(n);
  for (int t = 0; t < n; ++t)
    for (int d : g.tile(t).deps) consumers[d].push_back(t);
  auto has_consumer_in = [&](int t, const std::vector<int>& pos, int lo, int hi) {
    for (int u : consumers[t])
      if (pos[u] >= lo && pos[u] <= hi) return true;
    return false;
  };

  std::mt19937_64 rng(o.seed);
  Schedule cur = r.best;
  int64_t cur_cost = r.traffic;
  std::vector<int> pos(n);
  for (int i = 0; i < n; ++i) pos[cur.order[i]] = i;
  const double t_start = 0.01 * double(r.seed_traffic) / std::max(1, n);  // a few tiles' worth of bytes
  auto last_progress = Clock::now();
  const int max_span = std::max(2, std::min(n, 64));
  while (true) {
    const double elapsed = seconds_since(t0);
    if (o.time_limit_s > 0 && elapsed >= o.time_limit_s) break;
    if (o.time_limit_s == 0 && o.max_evaluations == 0) break;
    if (o.max_evaluations > 0 && r.evaluations >= o.max_evaluations) break;
    if (o.progress && seconds_since(last_progress) >= 1.0) {
      *o.progress << "search: " << static_cast<int>(elapsed) << " s, " << r.evaluations << " orders simulated, best "
                  << r.traffic << " B (" << r.seed_order << ": " << r.seed_traffic << " B)\n";
      o.progress->flush();
      last_progress = Clock::now();
    }
    Schedule cand = cur;
    std::uniform_int_distribution<int> pick(0, n - 1);
    const int i = pick(rng);
    const int span = 1 + static_cast<int>(rng() % max_span);
    const int j = std::min(n - 1, i + span);
    if (i == j) continue;
    const int move = static_cast<int>(rng() % 3);
    bool ok = true;
    if (move == 0) {  // reverse [i, j]: invalid if any tile there depends on another one there
      for (int p = i; p <= j && ok; ++p) ok = !depends_on_any(g, cur.order[p], pos, i, j);
      if (ok) std::reverse(cand.order.begin() + i, cand.order.begin() + j + 1);
    } else if (move == 1) {  // swap i and j
      const int a = cur.order[i], b = cur.order[j];
      ok = !has_consumer_in(a, pos, i + 1, j) && !depends_on_any(g, b, pos, i, j - 1);
      if (ok) std::swap(cand.order[i], cand.order[j]);
    } else {  // move the tile at i to j (later), shifting the others back
      ok = !has_consumer_in(cur.order[i], pos, i + 1, j);
      if (ok) std::rotate(cand.order.begin() + i, cand.order.begin() + i + 1, cand.order.begin() + j + 1);
    }
    if (!ok) continue;
    const int64_t cost = traffic_of(g, cand, quiet);
    ++r.evaluations;
    const double temp = t_start * std::max(0.0, 1.0 - (o.time_limit_s > 0 ? elapsed / o.time_limit_s : 0.0));
    const int64_t delta = cost - cur_cost;
    const bool accept = delta <= 0 || (temp > 0 && std::uniform_real_distribution<double>(0, 1)(rng) <
                                                        std::exp(-double(delta) / temp));
    if (!accept) continue;
    cur = std::move(cand);
    cur_cost = cost;
    for (int p = std::min(i, j); p <= std::max(i, j); ++p) pos[cur.order[p]] = p;
    if (cur_cost < r.traffic) {
      r.traffic = cur_cost;
      r.best = cur;
      r.best.name = "search";
    }
  }
  return r;
}

}  // namespace tw
