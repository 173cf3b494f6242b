// The partitioned L2 model (include/tileweave/model/l2_model.hpp says what it assumes).
//
// State: every block of the tile graph is up to four entries -- its half homed in partition 0, its
// half homed in partition 1, and the copies of those halves held in the other partition. Each
// partition keeps its entries in LRU order as timestamps in a Fenwick tree of their sizes, so the
// bytes touched since an entry's last use (its stack distance) is one prefix sum. Nothing is ever
// evicted explicitly: an access pays DRAM for the fraction of the entry that the hashed sets would
// have evicted at that stack distance (l2_survival), which for a fully associative cache is the
// simple model's LRU exactly.
#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>
#include <string>
#include <tuple>

#include "tileweave/model/l2_model.hpp"

namespace tw {

// P(Poisson(lambda) <= n - 1).
static double poisson_below(double lambda, int n) {
  if (lambda <= 0) return 1.0;
  double sum = 0;
  if (lambda < 600) {  // terms by recurrence: e^-lambda lambda^k / k!
    double term = std::exp(-lambda);
    for (int k = 0; k < n; ++k) {
      sum += term;
      term *= lambda / (k + 1);
    }
  } else {  // e^-lambda underflows: sum the terms in logs
    for (int k = 0; k < n; ++k) sum += std::exp(-lambda + k * std::log(lambda) - std::lgamma(k + 1.0));
  }
  return std::min(1.0, sum);
}

// P(N <= n - 1) for the number N of lines (mean lambda) that fell into one set. fringe = 0: all at
// random, Poisson(lambda). fringe > 0: at most `fringe` of them at random, Poisson(min(lambda,
// fringe)), and the rest evenly (every set its share: floor or ceil of the mean, the least spread an
// integer count can have).
double l2_set_count_below(double lambda, int n, double fringe) {
  if (n <= 0) return 0.0;
  if (!(fringe > 0) || lambda <= fringe) return poisson_below(lambda, n);
  const double even = lambda - fringe, fl = std::floor(even), f = even - fl;
  if (fl >= n) return 0.0;
  const int k = n - static_cast<int>(fl);  // the random part must be <= k - 1 (floor) or k - 2 (ceil)
  return (1 - f) * poisson_below(fringe, k) + (f > 0 && k > 1 ? f * poisson_below(fringe, k - 1) : 0.0);
}

double l2_survival(double x, int ways, double fringe) {
  if (ways == 0) return x <= 1.0 + 1e-12 ? 1.0 : 0.0;
  if (x <= 0) return 1.0;
  // P(N <= ways - 1): fewer than `ways` other lines fell into this line's set.
  return l2_set_count_below(x * ways, ways, fringe);
}

double l2_room_survival(double allocated, double own, double others, double capacity, int ways, double fringe) {
  const double room_bytes = std::max(capacity - others, 0.0);
  if (ways == 0) return allocated + own <= room_bytes + 1e-9 ? 1.0 : 0.0;
  // `room` ways of the line's set are left to evict-first lines (at least the one it took); the
  // allocations since fell into its set as Poisson(ways * allocated / capacity).
  const double room = std::max(1.0, ways * room_bytes / capacity);
  const int r = static_cast<int>(std::floor(room));
  const double f = room - r, lambda = allocated * ways / capacity;
  return l2_set_count_below(lambda, r, fringe) * (1 - f) + (f > 0 ? l2_set_count_below(lambda, r + 1, fringe) * f : 0.0);
}

namespace {

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// A deterministic draw in [0, 1) for (a, b).
double unit(uint64_t seed, uint64_t a, uint64_t b) {
  return double(mix(mix(seed ^ mix(a)) ^ b) >> 11) * (1.0 / 9007199254740992.0);
}

// LRU order of one partition's entries: timestamps in a Fenwick tree of entry sizes. Timestamps are
// renumbered (compacted) when they run out, so the tree stays twice the number of entries.
class LruStack {
 public:
  void init(int64_t max_entries) {
    size_ = 2 * max_entries + 1024;
    tree_.assign(size_ + 1, 0.0);
    owner_.assign(size_, -1);
    clock_ = 0;
    total_ = 0;
  }
  // Bytes of the entries used after time t.
  double after(int64_t t) const { return total_ - prefix(t + 1); }
  double total() const { return total_; }
  // Moves entry e (size bytes, last use `last`, -1 if absent) to the front; returns its new time.
  template <class Renumber>
  int64_t touch(int64_t e, int64_t last, double bytes, Renumber&& renumber) {
    if (last >= 0) {
      add(last, -bytes);
      owner_[last] = -1;
    } else {
      total_ += bytes;
    }
    if (clock_ == size_) compact(renumber);
    owner_[clock_] = e;
    add(clock_, bytes);
    return clock_++;
  }
  void remove(int64_t last, double bytes) {
    add(last, -bytes);
    owner_[last] = -1;
    total_ -= bytes;
  }

 private:
  void add(int64_t i, double v) {
    for (++i; i <= size_; i += i & -i) tree_[i] += v;
  }
  double prefix(int64_t n) const {  // sum over times [0, n)
    double s = 0;
    for (; n > 0; n -= n & -n) s += tree_[n];
    return s;
  }
  // renumber(entry, new_time, &bytes): the owner updates its timestamp and reports the entry's size.
  template <class Renumber>
  void compact(Renumber&& renumber) {
    std::vector<int64_t> live;
    for (int64_t t = 0; t < size_; ++t)
      if (owner_[t] >= 0) live.push_back(owner_[t]);
    std::fill(tree_.begin(), tree_.end(), 0.0);
    std::fill(owner_.begin(), owner_.end(), -1);
    clock_ = 0;
    for (int64_t e : live) {
      const double bytes = renumber(e, clock_);
      owner_[clock_] = e;
      add(clock_++, bytes);
    }
  }
  std::vector<double> tree_;
  std::vector<int64_t> owner_;
  int64_t size_ = 0, clock_ = 0;
  double total_ = 0;
};

struct Counters {
  double read = 0, write = 0, hit = 0, requested = 0;
};

class PartitionedCache {
 public:
  PartitionedCache(const TileGraph& g, const CacheConfig& c)
      : c_(c), dram_(g, c), occ_(g, occupancy_config(c)), parts_(c.part.partitions),
        kinds_(parts_ == 2 ? 4 : 1), half_(parts_ == 2 ? 0.5 : 1.0),
        cap_(double(c.capacity_bytes / parts_)) {
    const int64_t n = dram_.num_blocks();
    last_.assign(n * kinds_, -1);
    dirty_.assign(n * kinds_, 0.0);
    // Classes: 1 = streamed with the evict-first policy (weights, with L2Params::evict_first_weights), else 0.
    cls_.assign(n, 0);
    if (c.part.evict_first_weights)
      for (int64_t b = 0; b < n; ++b) cls_[b] = g.tensor(dram_.block_tensor(b)).role == TensorRole::Weight;
    room_ = c.part.evict_first_weights && c.part.evict_first == L2EvictFirst::Room;
    push_ = c.part.evict_first_weights && !room_;
    for (int p = 0; p < 2; ++p) {
      lru_[p][0].init(n * kinds_ / parts_);
      if (c.part.evict_first_weights) lru_[p][1].init(n * kinds_ / parts_);
      if (push_) all_[p].init(n * kinds_ / parts_);
    }
    if (push_) last_all_.assign(n * kinds_, -1);
    if (room_) allocated_at_.assign(n * kinds_, 0.0);
    per_tensor_.resize(g.tensors().size());
    per_op_.resize(g.ops().size());
  }
  const CacheModel& blocks() const { return dram_; }

  // A read of `block` by an SM of partition `near`. home_only: a reduction at L2 (split-K
  // accumulators), which is performed at the home partition and leaves no copy. Both halves (and a
  // copy) are looked up before any is touched: a block's lines are requested together, so its own
  // lines never count as used in between.
  // Returns the fraction of the block's bytes that came from DRAM.
  double read(int64_t block, int near, bool home_only, int op) {
    const double part = double(dram_.block_bytes(block)) * half_;
    double miss_bytes = 0;
    int64_t touch_home[2] = {-1, -1}, touch_copy = -1;
    for (int home = 0; home < parts_; ++home) {
      const int64_t h = entry(block, home);
      double m = 0, copy_miss = 0;  // copy_miss: the fraction of the near copy filled (0 without one)
      if (home == near || home_only || !c_.part.far_copies) {
        m = miss(h, home);
        touch_home[home] = h;
      } else {
        // Far half: the near partition's copy first, then the home partition, which sees the
        // request (and so uses the line) when the copy (mostly) missed.
        const int64_t copy = entry(block, 2 + near);
        const double mc = miss(copy, near);
        copy_miss = mc;
        m = mc > 0 ? mc * miss(h, home) : 0.0;
        if (mc >= 0.5) touch_home[home] = h;
        touch_copy = copy;
      }
      miss_bytes += part * m;
      write_back(h, part * m, op);
      dirty_[h] *= 1 - m;
      allocated_[home] += occupancy(h) * m;                                // the home's fill
      allocated_[near] += occupancy(h) * copy_miss;                        // the copy's
    }
    for (int home = 0; home < parts_; ++home)
      if (touch_home[home] >= 0) touch(touch_home[home], home);
    if (touch_copy >= 0) touch(touch_copy, near);
    const double bytes = part * parts_;
    for (Counters* x : {&per_tensor_[dram_.block_tensor(block)], &per_op_[op], &total_}) {
      x->read += miss_bytes;
      x->requested += bytes;
      x->hit += bytes - miss_bytes;
    }
    return bytes > 0 ? miss_bytes / bytes : 0.0;
  }

  // Write-allocate without a fill at the home partitions (the block is overwritten whole); copies of
  // the old data in the other partition are dropped.
  void write(int64_t block, int op) {
    const double part = double(dram_.block_bytes(block)) * half_;
    double m[2] = {0, 0};
    for (int home = 0; home < parts_; ++home) m[home] = miss(entry(block, home), home);
    for (int home = 0; home < parts_; ++home) {
      const int64_t h = entry(block, home);
      write_back(h, part * m[home], op);
      allocated_[home] += occupancy(h) * m[home];
      dirty_[h] = 1;
      touch(h, home);
      if (parts_ == 2) drop(entry(block, 2 + home), home);
    }
  }

  // Every dirty byte still held goes to DRAM, charged to the op that wrote the block.
  void flush(const std::vector<int>& writer) {
    for (int64_t b = 0; b < dram_.num_blocks(); ++b)
      for (int home = 0; home < parts_; ++home) {
        const int64_t h = entry(b, home);
        if (dirty_[h] > 0) write_back(h, double(dram_.block_bytes(b)) * half_, writer[dram_.block_tensor(b)]);
        dirty_[h] = 0;
      }
  }

  const Counters& total() const { return total_; }
  const std::vector<Counters>& per_tensor() const { return per_tensor_; }
  const std::vector<Counters>& per_op() const { return per_op_; }

 private:
  static CacheConfig occupancy_config(CacheConfig c) {
    c.l2 = L2Kind::Simple;
    c.line_bytes = c.part.line_bytes;
    c.capacity_bytes = std::max(c.capacity_bytes, c.line_bytes);
    return c;
  }
  int64_t entry(int64_t block, int kind) const { return block * kinds_ + kind; }
  // Kinds 0, 1: the halves homed in partitions 0, 1; 2, 3: copies held in partitions 0, 1.
  double occupancy(int64_t e) const { return double(occ_.block_bytes(e / kinds_)) * half_; }
  // The fraction of entry e (held in partition `part`) evicted since its last use. With
  // L2Params::evict_first_weights, weight lines (class 1) are chosen first as victims, so they never
  // push the other lines out: a class-0 line's stack distance counts class-0 bytes only, while a
  // weight line's counts everything touched since its last use (it is as exposed as under plain
  // LRU). Without it every line's distance counts everything (all entries are class 0).
  double miss(int64_t e, int part) const {
    if (last_[e] < 0) return 1.0;
    const bool weight = cls_[e / kinds_] != 0;
    if (room_ && weight)
      return 1.0 - l2_room_survival(allocated_[part] - allocated_at_[e], occupancy(e),
                                    std::min(cap_, lru_[part][0].total()), cap_, c_.part.ways, c_.part.set_fringe);
    double d = weight ? 0.0 : lru_[part][0].after(last_[e]);
    if (push_) {  // the weights' bytes count in part
      const double all = all_[part].after(last_all_[e]);
      d = weight ? all : d + c_.part.weight_push * (all - d);
    }
    return 1.0 - l2_survival((d + occupancy(e)) / cap_, c_.part.ways, c_.part.set_fringe);
  }
  // `bytes` of entry e's dirty data were evicted since its last use: they went to DRAM then.
  void write_back(int64_t e, double bytes, int op) {
    const double w = bytes * dirty_[e];
    if (w <= 0) return;
    per_tensor_[dram_.block_tensor(e / kinds_)].write += w;
    per_op_[op].write += w;
    total_.write += w;
  }
  void touch(int64_t e, int part) {
    if (room_) allocated_at_[e] = allocated_[part];
    last_[e] = lru_[part][cls_[e / kinds_]].touch(e, last_[e], occupancy(e), [&](int64_t x, int64_t t) {
      last_[x] = t;
      return occupancy(x);
    });
    if (!push_) return;
    last_all_[e] = all_[part].touch(e, last_all_[e], occupancy(e), [&](int64_t x, int64_t t) {
      last_all_[x] = t;
      return occupancy(x);
    });
  }
  void drop(int64_t e, int part) {
    if (last_[e] < 0) return;
    lru_[part][cls_[e / kinds_]].remove(last_[e], occupancy(e));
    last_[e] = -1;
    if (push_) all_[part].remove(last_all_[e], occupancy(e)), last_all_[e] = -1;
    dirty_[e] = 0;
  }

  CacheConfig c_;
  CacheModel dram_;  // blocks in sector-rounded bytes (what DRAM moves)
  CacheModel occ_;   // the same blocks in whole lines (what the cache holds)
  int parts_, kinds_;
  double half_, cap_;
  std::vector<int64_t> last_;
  std::vector<double> dirty_;  // fraction of the entry that is dirty
  std::vector<uint8_t> cls_;   // by block: 1 = evict-first (weights), 0 = the rest
  LruStack lru_[2][2];         // by partition and class
  LruStack all_[2];            // by partition, both classes (L2EvictFirst::Push's reuse distances)
  std::vector<int64_t> last_all_;
  bool push_ = false;          // evict-first weights, L2EvictFirst::Push
  // With L2EvictFirst::Room: bytes allocated in each partition so far (fills, copies, write
  // allocations), and by entry the count at its last use.
  bool room_ = false;
  double allocated_[2] = {0, 0};
  std::vector<double> allocated_at_;
  std::vector<Counters> per_tensor_, per_op_;
  Counters total_;
};

int64_t rounded(double x) { return std::llround(x); }

// The final flush, then the report.
TrafficReport report(const TileGraph& g, const Schedule& s, PartitionedCache& cache, std::vector<TraceStep> trace) {
  cache.flush(writer_ops(g));
  TrafficReport r;
  r.order = s.name;
  const auto& tot = cache.total();
  r.dram_read = rounded(tot.read);
  r.dram_write = rounded(tot.write);
  r.hit_bytes = rounded(tot.hit);
  r.requested_bytes = rounded(tot.requested);
  for (size_t t = 0; t < g.tensors().size(); ++t) {
    const Counters& x = cache.per_tensor()[t];
    r.per_tensor.push_back({g.tensor(static_cast<int>(t)).name, g.tensor(static_cast<int>(t)).role, rounded(x.read),
                            rounded(x.write), rounded(x.hit), rounded(x.requested)});
  }
  r.per_op = empty_op_traffic(g);
  for (size_t op = 0; op < r.per_op.size(); ++op) {
    const Counters& x = cache.per_op()[op];
    r.per_op[op].dram_read = rounded(x.read);
    r.per_op[op].dram_write = rounded(x.write);
    r.per_op[op].hit_bytes = rounded(x.hit);
    r.per_op[op].requested_bytes = rounded(x.requested);
  }
  r.trace = std::move(trace);
  return r;
}

// The replay of a recorded timeline (L2Params::timeline): every K-step and every tile's writes as
// events at their recorded times, in time order (a step before a write at the same time). A split
// tile's slices reduce in the order they were done; the last one takes the sums.
void replay_timeline(const TileGraph& g, const Schedule& s, const CacheConfig& c, PartitionedCache& cache,
                     std::vector<TraceStep>* trace) {
  const std::vector<TileSpan>& tl = *c.part.timeline;
  const int n = g.num_tiles();
  if (int64_t(tl.size()) != n)
    throw InvalidArgument("timeline: " + std::to_string(tl.size()) + " tile spans for a graph of " + std::to_string(n) +
                          " tiles");
  if (!s.units.empty()) throw InvalidArgument("timeline: schedules of several tiles a ticket are not replayed");
  const CacheModel& blocks = cache.blocks();
  struct Event {
    double t;
    int kind, tile, step;  // kind 0: a K-step's reads, 1: the tile's writes
    bool operator>(const Event& o) const { return std::tie(t, kind, tile, step) > std::tie(o.t, o.kind, o.tile, o.step); }
  };
  std::vector<Event> ev;
  for (int id = 0; id < n; ++id) {
    const TileSpan& sp = tl[size_t(id)];
    if (sp.sm < 0 || !(sp.end >= sp.begin) || !(sp.done >= sp.end))
      throw InvalidArgument("timeline: tile " + std::to_string(id) + " has no valid span (sm " + std::to_string(sp.sm) +
                            ", begin " + std::to_string(sp.begin) + ", end " + std::to_string(sp.end) + ", done " +
                            std::to_string(sp.done) + ")");
    const int steps = blocks.num_steps(id);
    for (int k = 0; k < steps; ++k) ev.push_back({sp.begin + (sp.end - sp.begin) * (k + 0.5) / steps, 0, id, k});
    ev.push_back({sp.done, 1, id, 0});
  }
  std::sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return b > a; });
  std::vector<int> arrivals(size_t(n), 0);
  std::vector<CacheModel::Access> acc;
  for (const Event& e : ev) {
    const Tile& tile = g.tile(e.tile);
    const Op& op = g.op(tile.op);
    const int near = tl[size_t(e.tile)].sm % c.part.partitions;
    acc.clear();
    if (e.kind == 0) {
      blocks.step_accesses(e.tile, e.step, acc);
      for (const auto& a : acc) cache.read(a.block, near, false, tile.op);
      continue;
    }
    bool reduces = false;
    if (op.workspace >= 0) reduces = ++arrivals[size_t(g.tile_id(tile.op, tile.tm, tile.tn, 0))] == op.tiling.split_k;
    blocks.finish_accesses(e.tile, reduces, acc, op.tiling.split_k <= 1);
    for (const auto& a : acc) {
      if (a.write)
        cache.write(a.block, tile.op);
      else
        cache.read(a.block, near, blocks.block_tensor(a.block) == op.workspace, tile.op);
    }
    if (trace) {
      const auto& tot = cache.total();
      trace->push_back({e.tile, std::llround(tot.read), std::llround(tot.write), std::llround(tot.hit), {}});
    }
  }
}

}  // namespace

// The replay: P slots (slot i on SM i, near partition i % partitions). Events are (time, slot): a
// slot issues its tile's next K-step, which lasts its nominal time (the bytes it reads) scaled by
// the slot's speed and a per-step draw; the tile's writes happen with its last step, and the slot
// takes the next ticket when that step ends. A tile whose producers are not all complete waits and
// is woken when the last of them completes. With equal steps and no jitter the events come in
// rounds, slot by slot, as in the simple model's lockstep replay.
TrafficReport simulate_partitioned(const TileGraph& g, const Schedule& s, const CacheConfig& c) {
  c.validate();
  validate(g, s);
  PartitionedCache cache(g, c);
  const CacheModel& blocks = cache.blocks();
  const int n = g.num_tiles();
  if (c.part.timeline) {
    std::vector<TraceStep> trace;
    replay_timeline(g, s, c, cache, c.trace ? &trace : nullptr);
    return report(g, s, cache, std::move(trace));
  }
  const int slots = std::min(c.in_flight, std::max(n, 1));
  struct Slot {
    int tile = -1, step = 0, steps = 0, pending = 0;
    TicketDealer::Cursor at;
    double speed = 1;
  };
  std::vector<Slot> slot(slots);
  for (int i = 0; i < slots; ++i) slot[i].speed = 1 + c.part.sm_skew * (2 * unit(c.part.seed, 0xabcdef, i) - 1);
  std::vector<uint8_t> done(n, 0);
  TicketDealer dealer(g, s);
  std::vector<std::vector<int>> waiters(n);  // by producer tile: slots waiting on it
  std::vector<int> arrivals(n, 0);           // split-K slices finished, by tile id of slice 0
  using Event = std::pair<double, int>;      // (time, slot)
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events;
  // The slot's next tile: the rest of its ticket (a fused run goes on), else a new ticket.
  auto start = [&](int i, double t) {
    Slot& sl = slot[i];
    if (!dealer.next(sl.at)) return;
    sl.tile = dealer.tile(sl.at);
    sl.step = 0;
    sl.steps = blocks.num_steps(sl.tile);
    sl.pending = 0;
    for (int d : g.tile(sl.tile).deps)
      if (!done[d]) {
        ++sl.pending;
        waiters[d].push_back(i);
      }
    if (sl.pending == 0) events.push({t, i});
  };
  for (int i = 0; i < slots; ++i) start(i, 0.0);

  std::vector<TraceStep> trace;
  std::vector<CacheModel::Access> acc;
  while (!events.empty()) {
    const auto [t, i] = events.top();
    events.pop();
    Slot& sl = slot[i];
    const Tile& tile = g.tile(sl.tile);
    const Op& op = g.op(tile.op);
    const int near = i % c.part.partitions;
    acc.clear();
    blocks.step_accesses(sl.tile, sl.step, acc);
    double nominal = 0;
    for (const auto& a : acc) {  // a hit byte takes hit_time of a missed one
      const double m = cache.read(a.block, near, false, tile.op);
      nominal += double(blocks.block_bytes(a.block)) * (c.part.hit_time + (1 - c.part.hit_time) * m);
    }
    const double jitter = 1 + c.part.step_jitter * (2 * unit(c.part.seed, sl.tile, sl.step) - 1);
    const double end = t + std::max(nominal, 1.0) * sl.speed * jitter;
    if (++sl.step < sl.steps) {
      events.push({end, i});
      continue;
    }
    if (dealer.runs_on(sl.at.pos)) {  // the run's next slice goes on summing: no partial sum, no writes yet
      sl.tile = -1;
      start(i, end);
      continue;
    }
    const int run = sl.at.run_slices();
    bool reduces = false;
    if (op.workspace >= 0) reduces = (arrivals[g.tile_id(tile.op, tile.tm, tile.tn, 0)] += run) == op.tiling.split_k;
    acc.clear();
    blocks.finish_accesses(sl.tile, reduces, acc, run == op.tiling.split_k);
    for (const auto& a : acc) {
      const bool reduction = blocks.block_tensor(a.block) == op.workspace;
      if (a.write)
        cache.write(a.block, tile.op);
      else
        cache.read(a.block, near, reduction, tile.op);
    }
    for (int q = sl.at.run_begin; q <= sl.at.pos; ++q) {
      const int finished = s.order[q];
      done[finished] = 1;
      if (c.trace) {
        const auto& tot = cache.total();
        trace.push_back({finished, rounded(tot.read), rounded(tot.write), rounded(tot.hit), {}});
      }
      for (int w : waiters[finished])
        if (--slot[w].pending == 0) events.push({end, w});
      waiters[finished].clear();
    }
    sl.tile = -1;
    start(i, end);
  }

  return report(g, s, cache, std::move(trace));
}

}  // namespace tw
