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
// contents in LRU order (with dirty bits), so a memo over that state is exact. Blocks no remaining
// tile touches ("dead") matter only through their size and dirty bit, so they enter the key as that:
// orders that differ only in which dead block sits where share a state.
class ExactSearch {
 public:
  ExactSearch(const TileGraph& g, const CacheConfig& c, const ExactOptions& o)
      : g_(g), model_(g, c), opt_(o), capacity_(c.capacity_bytes) {
    const int n = g.num_tiles();
    readers_.assign(model_.num_blocks(), 0);
    writers_.assign(model_.num_blocks(), 0);
    read_first_.assign(model_.num_blocks(), false);
    for (int t = 0; t < n; ++t) {
      deps_mask_.push_back(0);
      for (int d : g.tile(t).deps) deps_mask_[t] |= uint64_t{1} << d;
      for (bool reduces : {false, true}) {
        accesses_[reduces].push_back(model_.tile_accesses(t, reduces));
        std::vector<bool> written(model_.num_blocks(), false);
        for (const auto& a : accesses_[reduces].back()) {
          (a.write ? writers_ : readers_)[a.block] |= uint64_t{1} << t;
          if (a.write) written[a.block] = true;
          // A block this tile reads before writing it (a split-K accumulator) is filled from DRAM
          // when not cached, even if tiles still to run write it.
          if (!a.write && !written[a.block]) read_first_[a.block] = true;
        }
      }
      // The other split-K slices of the same output block: the last of them to finish reduces.
      const Tile& tile = g.tile(t);
      const Op& op = g.op(tile.op);
      uint64_t siblings = 0;
      for (int64_t ks = 0; ks < op.tiling.split_k; ++ks)
        if (ks != tile.ks) siblings |= uint64_t{1} << g.tile_id(tile.op, tile.tm, tile.tn, ks);
      siblings_.push_back(op.workspace >= 0 ? siblings : 0);
    }
    // Only blocks that some tile both reads first and writes are filled before a write; a block that
    // consumers read after its producer wrote it (h) is not.
    for (int64_t b = 0; b < model_.num_blocks(); ++b)
      if (read_first_[b] && !(readers_[b] & writers_[b])) read_first_[b] = false;
    full_ = n == 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1;
    for (int64_t b = 0; b < model_.num_blocks(); ++b) bytes_.push_back(model_.block_bytes(b));
    detect_symmetry();
  }

  void detect_symmetry() {
    if (g_.ops().size() != 1) return;
    const Op& op = g_.op(0);
    if (op.kind != OpKind::Gemm || op.tiling.split_k != 1 || op.m % op.tiling.bm || op.n % op.tiling.bn) return;
    gm_ = static_cast<int>(op.grid_m);
    gn_ = static_cast<int>(op.grid_n);
    role_.assign(model_.num_blocks(), {2, 0, 0});
    for (int64_t b = 0; b < model_.num_blocks(); ++b) {
      const BlockRef ref = model_.block_ref(b);
      const BlockGrid& bg = model_.grid(ref.tensor);
      if (ref.tensor != op.a && ref.tensor != op.b) continue;  // C is never read: always dead
      const int64_t per_tile = (ref.tensor == op.a ? op.tiling.bm : op.tiling.bn) / bg.block_rows;
      role_[b] = {ref.tensor == op.a ? 0 : 1, static_cast<int>(ref.block_row / per_tile),
                  (ref.block_row % per_tile) * bg.num_cols + ref.block_col};
    }
    symmetric_ = true;
  }

  // upper_bound: DRAM bytes of a known order (it prunes; a wrong one only costs a second pass).
  ExactResult run(int64_t upper_bound) {
    t0_ = last_progress_ = Clock::now();
    Lru lru;
    Entry root = solve(0, lru, upper_bound);
    if (!root.exact()) root = solve(0, lru, std::numeric_limits<int64_t>::max());
    ExactResult r;
    r.traffic = root.cost;
    r.num_optimal = root.count;
    r.count_saturated = root.count == std::numeric_limits<uint64_t>::max();
    r.states = static_cast<int64_t>(memo_.size());
    r.best.name = "exact";
    // Walk one optimal path: at each state take the first tile whose cost plus the optimum of the
    // state it leads to equals this state's optimum (all memoised).
    uint64_t done = 0;
    int64_t left = root.cost;
    for (int i = 0; i < g_.num_tiles(); ++i) {
      for (int t = 0; t < g_.num_tiles(); ++t) {
        const uint64_t bit = uint64_t{1} << t;
        if ((done & bit) || (deps_mask_[t] & ~done)) continue;
        Lru next = lru;
        const int64_t here = apply(t, done, next);
        if (here > left) continue;
        const Entry e = solve(done | bit, next, left - here);
        if (!e.exact() || here + e.cost != left) continue;
        r.best.order.push_back(t);
        lru = std::move(next);
        done |= bit;
        left = e.cost;
        break;
      }
    }
    return r;
  }

 private:
  struct Entry {
    int64_t cost;    // DRAM bytes from here to the end (final flush included), minimal; a lower bound if count == 0
    uint64_t count;  // number of orders of the remaining tiles reaching it; 0: cut, cost inexact
    bool exact() const { return count > 0; }
  };
  struct Slot {
    int64_t block;
    bool dirty;
  };
  using Lru = std::vector<Slot>;  // most recent first

  bool live(int64_t b, uint64_t done) const { return ((readers_[b] | writers_[b]) & ~done) != 0; }

  std::string key(uint64_t done, const Lru& lru) const {
    if (symmetric_) return symmetric_key(done, lru);
    std::string k(reinterpret_cast<const char*>(&done), sizeof done);
    for (const Slot& s : lru) {
      const int64_t v = 2 * (live(s.block, done) ? s.block : -1 - bytes_[s.block]) + s.dirty;
      k.append(reinterpret_cast<const char*>(&v), sizeof v);
    }
    return k;
  }

  // One GEMM with whole tiles: permuting tile rows (A panels) or tile columns (B panels) maps every
  // state to one with the same future, so states are keyed after relabelling rows and columns:
  // those in the cache by recency, the others by their pattern of done tiles. Not a full canonical
  // form, but any relabelling is sound; this one merges most symmetric states.
  std::string symmetric_key(uint64_t done, const Lru& lru) const {
    std::vector<int> row_label(gm_, -1), col_label(gn_, -1);
    int rows = 0, cols = 0;
    for (const Slot& s : lru) {
      if (!live(s.block, done)) continue;
      const Role& r = role_[s.block];
      if (r.kind == 0 && row_label[r.index] < 0) row_label[r.index] = rows++;
      if (r.kind == 1 && col_label[r.index] < 0) col_label[r.index] = cols++;
    }
    auto is_done = [&](int64_t tm, int64_t tn) { return (done >> (tm * gn_ + tn)) & 1; };
    // Unlabelled columns by their done pattern over labelled rows, then by their done count.
    std::vector<std::pair<uint64_t, int>> rest;
    for (int tn = 0; tn < gn_; ++tn) {
      if (col_label[tn] >= 0) continue;
      uint64_t sig = 0;
      for (int tm = 0; tm < gm_; ++tm)
        if (row_label[tm] >= 0 && is_done(tm, tn)) sig |= uint64_t{1} << (63 - row_label[tm]);
      int count = 0;
      for (int tm = 0; tm < gm_; ++tm) count += static_cast<int>(is_done(tm, tn));
      rest.push_back({sig | uint64_t(count), tn});
    }
    std::sort(rest.begin(), rest.end());
    for (auto& [sig, tn] : rest) col_label[tn] = cols++;
    rest.clear();
    for (int tm = 0; tm < gm_; ++tm) {
      if (row_label[tm] >= 0) continue;
      uint64_t sig = 0;
      for (int tn = 0; tn < gn_; ++tn)
        if (is_done(tm, tn)) sig |= uint64_t{1} << (63 - col_label[tn]);
      rest.push_back({sig, tm});
    }
    std::sort(rest.begin(), rest.end());
    for (auto& [sig, tm] : rest) row_label[tm] = rows++;
    uint64_t mask = 0;
    for (int tm = 0; tm < gm_; ++tm)
      for (int tn = 0; tn < gn_; ++tn)
        if (is_done(tm, tn)) mask |= uint64_t{1} << (row_label[tm] * gn_ + col_label[tn]);
    std::string k(reinterpret_cast<const char*>(&mask), sizeof mask);
    for (const Slot& s : lru) {
      const Role& r = role_[s.block];
      int64_t v;
      if (!live(s.block, done))
        v = -1 - bytes_[s.block];
      else
        v = (int64_t{r.kind} << 56) | (int64_t{r.kind == 0 ? row_label[r.index] : col_label[r.index]} << 40) | r.sub;
      v = 2 * v + s.dirty;
      k.append(reinterpret_cast<const char*>(&v), sizeof v);
    }
    return k;
  }

  // Runs tile t on the LRU list; returns the DRAM bytes it causes (read misses and write-backs of
  // evicted dirty blocks). Mirrors CacheModel: hits move to the front, misses and writes insert at
  // the front after evicting from the back, writes mark dirty; a block larger than the cache
  // streams through (a write of one goes straight to DRAM).
  int64_t apply(int t, uint64_t done, Lru& lru) const {
    const bool reduces = siblings_[t] && (siblings_[t] & ~done) == 0;
    int64_t cost = 0, used = 0;
    for (const Slot& s : lru) used += bytes_[s.block];
    for (const auto& a : accesses_[reduces][t]) {
      auto it = std::find_if(lru.begin(), lru.end(), [&](const Slot& s) { return s.block == a.block; });
      if (it != lru.end()) {
        it->dirty = it->dirty || a.write;
        std::rotate(lru.begin(), it, it + 1);
        continue;
      }
      const int64_t bytes = bytes_[a.block];
      if (!a.write) cost += bytes;
      if (bytes > capacity_) {
        if (a.write) cost += bytes;
        continue;
      }
      while (used + bytes > capacity_) {
        used -= bytes_[lru.back().block];
        if (lru.back().dirty) cost += bytes_[lru.back().block];
        lru.pop_back();
      }
      lru.insert(lru.begin(), Slot{a.block, a.write});
      used += bytes;
    }
    return cost;
  }

  // The least DRAM bytes of completing `done` from cache state `lru` (final flush included), and how
  // many orders reach it (exact), if that least cost is <= budget. Otherwise an inexact entry whose
  // cost is a lower bound > budget: the branch is cut, and its memo entry cuts it again under smaller
  // budgets.
  Entry solve(uint64_t done, const Lru& lru, int64_t budget) {
    if (done == full_) {
      int64_t flush = 0;
      for (const Slot& s : lru) flush += s.dirty ? bytes_[s.block] : 0;
      return {flush, 1};
    }
    std::string k = key(done, lru);
    auto it = memo_.find(k);
    if (it != memo_.end() && (it->second.exact() || it->second.cost > budget)) return it->second;
    if (it == memo_.end() && static_cast<int64_t>(memo_.size()) >= opt_.max_states)
      throw InvalidArgument("exact search: more than " + std::to_string(opt_.max_states) +
                            " states; the grid is too large for it (use the heuristic search)");
    if ((++visits_ & 4095) == 0) check_time();
    const Outlook look = outlook(done, lru);
    Entry best{std::numeric_limits<int64_t>::max(), 0};
    if (look.no_evictions) {
      best = {look.min_cost, linear_extensions(done)};
    } else if (look.min_cost > budget) {
      best = {look.min_cost, 0};
    } else {
      int64_t cut_bound = std::numeric_limits<int64_t>::max();  // least lower bound among cut branches
      for (int t = 0; t < g_.num_tiles(); ++t) {
        const uint64_t bit = uint64_t{1} << t;
        if ((done & bit) || (deps_mask_[t] & ~done)) continue;
        Lru next = lru;
        const int64_t here = apply(t, done, next);
        // Ties with the best so far must still be counted, hence <= best.cost, not <.
        const int64_t allowed = std::min(budget, best.cost);
        if (here > allowed) {
          cut_bound = std::min(cut_bound, here);
          continue;
        }
        const Entry rest = solve(done | bit, next, allowed - here);
        const int64_t cost = here + rest.cost;
        if (!rest.exact() || cost > allowed) {  // a memoised exact entry may exceed the budget too
          cut_bound = std::min(cut_bound, cost);
        } else if (cost < best.cost) {
          best = {cost, rest.count};
        } else if (cost == best.cost) {
          best.count = saturating_add(best.count, rest.count);
        }
      }
      if (best.cost > budget) best = {cut_bound, 0};
    }
    if (it != memo_.end())
      it->second = best;
    else
      memo_.emplace(std::move(k), best);
    return best;
  }

  static uint64_t saturating_add(uint64_t a, uint64_t b) {
    return a > std::numeric_limits<uint64_t>::max() - b ? std::numeric_limits<uint64_t>::max() : a + b;
  }

  // Orders of the remaining tiles that respect dependencies.
  uint64_t linear_extensions(uint64_t done) {
    if (done == full_) return 1;
    if (auto it = extensions_.find(done); it != extensions_.end()) return it->second;
    uint64_t count = 0;
    for (int t = 0; t < g_.num_tiles(); ++t) {
      const uint64_t bit = uint64_t{1} << t;
      if (!(done & bit) && !(deps_mask_[t] & ~done)) count = saturating_add(count, linear_extensions(done | bit));
    }
    extensions_.emplace(done, count);
    return count;
  }

  // A lower bound on the remaining DRAM bytes: blocks still to be read at least once (not cached,
  // and either not written by a remaining tile first or filled before being written), plus every
  // block that is dirty now or will be written (each is written back at least once). When every
  // block the remaining tiles touch fits beside what is cached, nothing is evicted any more: the
  // bound is then exact for every order of the rest, and all of them are optimal.
  struct Outlook {
    int64_t min_cost = 0;
    bool no_evictions = false;
  };
  Outlook outlook(uint64_t done, const Lru& lru) const {
    int64_t used = 0;
    std::vector<uint8_t> cached(bytes_.size(), 0);  // 1 clean, 2 dirty
    for (const Slot& s : lru) used += bytes_[s.block], cached[s.block] = s.dirty ? 2 : 1;
    Outlook o;
    int64_t fresh = 0;
    for (size_t b = 0; b < bytes_.size(); ++b) {
      const bool read_later = readers_[b] & ~done, written_later = writers_[b] & ~done;
      if (cached[b] == 2 || written_later) o.min_cost += bytes_[b];
      if (cached[b] || !(read_later || written_later)) continue;
      fresh += bytes_[b];
      if (read_later && (!written_later || read_first_[b])) o.min_cost += bytes_[b];
    }
    o.no_evictions = used + fresh <= capacity_;
    return o;
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
  std::vector<uint64_t> deps_mask_, readers_, writers_, siblings_;
  std::vector<bool> read_first_;
  std::unordered_map<uint64_t, uint64_t> extensions_;
  std::vector<std::vector<CacheModel::Access>> accesses_[2];  // [reduces][tile]
  std::vector<int64_t> bytes_;
  std::unordered_map<std::string, Entry> memo_;
  struct Role {
    int kind;       // 0: part of an A row panel, 1: part of a B column panel, 2: other
    int index;      // tile row (A) or tile column (B)
    int64_t sub;    // which part of the panel
  };
  bool symmetric_ = false;
  int gm_ = 0, gn_ = 0;
  std::vector<Role> role_;
  Clock::time_point t0_, last_progress_;
  int64_t visits_ = 0;
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
  int64_t upper_bound = std::numeric_limits<int64_t>::max();
  for (const std::string& name : named_orders(g))
    upper_bound = std::min(upper_bound, simulate(g, make_order(g, name), c).dram_total());
  return ExactSearch(g, c, o).run(upper_bound);
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
  auto out_of_time = [&] {
    return (o.time_limit_s > 0 && seconds_since(t0) >= o.time_limit_s) ||
           (o.time_limit_s == 0 && o.max_evaluations == 0) || (o.max_evaluations > 0 && r.evaluations >= o.max_evaluations);
  };
  auto try_spec = [&](const std::string& spec) {
    Schedule s = make_order(g, spec);
    const int64_t cost = traffic_of(g, s, quiet);
    ++r.evaluations;
    if (cost < r.traffic) r.traffic = cost, r.best = std::move(s);
    return cost;
  };

  // Phase 1, parameter sweep: one grid order per op, chosen op by op (coordinate descent) from the
  // named grid orders and the swizzle widths / group heights that fit the op's grid; for chains also
  // chain_rows:k for every k. Cheap, and on large grids it finds far more than local moves can.
  {
    const int nops = static_cast<int>(g.ops().size());
    std::vector<std::string> spec(nops, "row_major");
    int64_t spec_cost = std::numeric_limits<int64_t>::max();
    for (const auto& info : order_catalog())
      if (!info.chain_only) {
        if (out_of_time()) break;
        const int64_t cost = try_spec(info.spec);
        if (cost < spec_cost) spec_cost = cost, spec.assign(nops, info.spec);
      }
    auto joined = [&] {
      std::string s;
      for (const auto& x : spec) s += (s.empty() ? "" : "+") + x;
      return s;
    };
    for (int op = 0; op < nops && nops > 1; ++op) {
      std::vector<std::string> candidates;
      for (const auto& info : order_catalog())
        if (!info.chain_only) candidates.push_back(info.spec);
      for (int64_t v = 2; v <= std::max(g.op(op).grid_m, g.op(op).grid_n) && v <= 64; v += (v < 8 ? 1 : v / 4)) {
        if (v <= g.op(op).grid_m) candidates.push_back("grouped:" + std::to_string(v));
        if (v <= g.op(op).grid_n) candidates.push_back("swizzle:" + std::to_string(v));
      }
      for (const auto& c : candidates) {
        if (out_of_time()) break;
        const std::string keep = spec[op];
        if (c == keep) continue;
        spec[op] = c;
        const int64_t cost = try_spec(joined());
        if (cost < spec_cost)
          spec_cost = cost;
        else
          spec[op] = keep;
      }
    }
    if (nops == 1) {
      const Op& op = g.op(0);
      for (int64_t v = 2; v <= std::max(op.grid_m, op.grid_n) && v <= 64 && !out_of_time(); ++v) {
        if (v <= op.grid_m) try_spec("grouped:" + std::to_string(v));
        if (v <= op.grid_n && !out_of_time()) try_spec("swizzle:" + std::to_string(v));
      }
    } else {
      // The best op-by-op spec with consumers pulled up to their producers (as the executor can run it).
      for (const std::string& lag : {std::string(), ":" + std::to_string(c.in_flight)})
        if (!out_of_time()) try_spec("dataflow" + lag + "/" + joined());
      for (int64_t k = 1; k <= g.op(0).grid_m && k <= 64 && !out_of_time(); ++k) try_spec("chain_rows:" + std::to_string(k));
    }
    if (o.progress)
      *o.progress << "search: parameter sweep done after " << r.evaluations << " orders, best " << r.best.name << " "
                  << r.traffic << " B\n";
  }

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
  while (!out_of_time()) {
    const double elapsed = seconds_since(t0);
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
