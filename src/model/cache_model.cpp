#include "tileweave/model/cache_model.hpp"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "tileweave/model/l2_model.hpp"

namespace tw {

const char* to_string(L2Kind k) { return k == L2Kind::Simple ? "simple" : "partitioned"; }

L2Kind parse_l2_kind(const std::string& name) {
  if (name == "simple") return L2Kind::Simple;
  if (name == "partitioned") return L2Kind::Partitioned;
  throw InvalidArgument("unknown L2 model '" + name + "' (known: simple, partitioned)");
}

const char* to_string(L2EvictFirst k) { return k == L2EvictFirst::Push ? "push" : "room"; }

L2EvictFirst parse_l2_evict_first(const std::string& name) {
  if (name == "push") return L2EvictFirst::Push;
  if (name == "room") return L2EvictFirst::Room;
  throw InvalidArgument("unknown evict-first model '" + name + "' (known: push, room)");
}

void CacheConfig::validate() const {
  if (line_bytes <= 0) throw InvalidArgument("line size must be positive, got " + std::to_string(line_bytes));
  if (capacity_bytes < line_bytes)
    throw InvalidArgument("cache capacity " + std::to_string(capacity_bytes) + " B is smaller than one line (" +
                          std::to_string(line_bytes) + " B)");
  if (in_flight < 1) throw InvalidArgument("tiles in flight (P) must be at least 1, got " + std::to_string(in_flight));
  if (in_flight > 1000000) throw InvalidArgument("tiles in flight (P) " + std::to_string(in_flight) + " is absurd");
  if (sets < 1) throw InvalidArgument("number of cache sets must be at least 1, got " + std::to_string(sets));
  if (capacity_bytes / sets < line_bytes)
    throw InvalidArgument("cache sets " + std::to_string(sets) + " leave less than one line per set");
  if (l2 != L2Kind::Partitioned) return;
  if (part.partitions != 1 && part.partitions != 2)
    throw InvalidArgument("L2 partitions must be 1 or 2, got " + std::to_string(part.partitions));
  if (part.line_bytes <= 0 || part.line_bytes > (1 << 20))
    throw InvalidArgument("L2 line size " + std::to_string(part.line_bytes) + " must be in [1, 1048576]");
  if (part.ways < 0 || part.ways > 1024)
    throw InvalidArgument("L2 ways " + std::to_string(part.ways) + " must be in [0, 1024] (0: fully associative)");
  const int64_t per_part = capacity_bytes / part.partitions;
  if (per_part < part.line_bytes * std::max(part.ways, 1))
    throw InvalidArgument("cache capacity " + std::to_string(capacity_bytes) + " B holds less than one set of " +
                          std::to_string(std::max(part.ways, 1)) + " lines of " + std::to_string(part.line_bytes) +
                          " B per partition");
  if (!(part.step_jitter >= 0 && part.step_jitter < 1))
    throw InvalidArgument("step jitter " + to_text(part.step_jitter) + " must be in [0, 1)");
  if (!(part.sm_skew >= 0 && part.sm_skew < 1))
    throw InvalidArgument("SM speed skew " + to_text(part.sm_skew) + " must be in [0, 1)");
  if (!(part.weight_push >= 0 && part.weight_push <= 1))
    throw InvalidArgument("L2 weight push " + to_text(part.weight_push) + " must be in [0, 1]");
  if (!(part.hit_time > 0 && part.hit_time <= 1))
    throw InvalidArgument("L2 hit time " + to_text(part.hit_time) + " must be in (0, 1]");
  if (!(part.set_fringe >= 0 && part.set_fringe <= 1e6))
    throw InvalidArgument("L2 set fringe " + to_text(part.set_fringe) + " must be in [0, 1e6] (0: Poisson)");
}

namespace {

// Every edge a tile touches along one axis must be a block edge: the block size is the gcd of all
// interior edges (0 and the tensor's extent are edges anyway).
struct EdgeGcd {
  int64_t extent, g = 0;
  void add(int64_t edge) {
    if (edge > 0 && edge < extent) g = std::gcd(g, edge);
  }
  int64_t block() const { return g ? g : extent; }
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

CacheModel::CacheModel(const TileGraph& g, const CacheConfig& c) : g_(&g), cfg_(c) {
  cfg_.validate();
  const int nt = static_cast<int>(g.tensors().size());
  std::vector<EdgeGcd> rows, cols;
  for (const Tensor& t : g.tensors()) {
    rows.push_back({t.rows});
    cols.push_back({t.cols});
  }
  auto add_region = [&](const Region& r, int64_t step) {
    rows[r.tensor].add(r.r0);
    rows[r.tensor].add(r.r1);
    cols[r.tensor].add(r.c0);
    cols[r.tensor].add(r.c1);
    if (step > 0 && step < r.cols()) cols[r.tensor].add(step);  // with c0, every c0 + s*step is an edge
  };
  for (const Tile& t : g.tiles()) {
    for (const Region& r : t.reads) add_region(r, t.step_cols);
    for (const Region& r : t.writes) add_region(r, 0);
  }
  grids_.resize(nt);
  first_block_.resize(nt + 1);
  int64_t nblocks = 0;
  for (int t = 0; t < nt; ++t) {
    BlockGrid& bg = grids_[t];
    bg.block_rows = rows[t].block();
    bg.block_cols = cols[t].block();
    bg.num_rows = ceil_div(g.tensor(t).rows, bg.block_rows);
    bg.num_cols = ceil_div(g.tensor(t).cols, bg.block_cols);
    first_block_[t] = nblocks;
    nblocks += bg.num_rows * bg.num_cols;
  }
  first_block_[nt] = nblocks;
  // Unaligned tile sizes (say BN 100 read in BK 64 steps) make tiny blocks; refuse a grid that would
  // not fit in memory rather than thrash.
  if (nblocks > (int64_t{1} << 27))
    throw InvalidArgument("the tiles' edges cut the tensors into " + std::to_string(nblocks) +
                          " blocks (max 2^27): use tile sizes that divide each other");
  blocks_.resize(nblocks);
  const int64_t line = cfg_.line_bytes;
  for (int t = 0; t < nt; ++t) {
    const Tensor& T = g.tensor(t);
    const BlockGrid& bg = grids_[t];
    const int64_t e = T.elem_bytes, pitch = T.cols * e;
    for (int64_t br = 0; br < bg.num_rows; ++br)
      for (int64_t bc = 0; bc < bg.num_cols; ++bc) {
        const int64_t r0 = br * bg.block_rows, r1 = std::min(T.rows, r0 + bg.block_rows);
        const int64_t c0 = bc * bg.block_cols * e, c1 = std::min(T.cols, (bc + 1) * bg.block_cols) * e;
        int64_t bytes = 0;
        if (pitch % line == 0) {
          bytes = (r1 - r0) * ((c1 - 1) / line - c0 / line + 1) * line;
        } else {  // rows start at different offsets within a line: count each row
          for (int64_t r = r0; r < r1; ++r) bytes += ((r * pitch + c1 - 1) / line - (r * pitch + c0) / line + 1) * line;
        }
        blocks_[first_block_[t] + br * bg.num_cols + bc] = {t, bytes};
      }
  }
  plan_begin_.push_back(0);
  for (const Tile& t : g.tiles()) {
    for (const Region& r : t.reads) {
      const BlockGrid& bg = grids_[r.tensor];
      const int64_t br0 = r.r0 / bg.block_rows, bc0 = r.c0 / bg.block_cols;
      const int64_t cols = (r.c1 - 1) / bg.block_cols - bc0 + 1;
      // Step edges are block edges (the grid includes them), so a step is a whole number of block columns.
      const int64_t per_step = t.step_cols > 0 && t.step_cols < r.cols() ? t.step_cols / bg.block_cols : cols;
      plans_.push_back({block_id(r.tensor, br0, bc0), (r.r1 - 1) / bg.block_rows - br0 + 1, bg.num_cols, cols, per_step});
    }
    plan_begin_.push_back(static_cast<int>(plans_.size()));
  }
  set_capacity_ = cfg_.capacity_bytes / cfg_.sets;
  reset();
}

void CacheModel::reset() {
  const int64_t n = static_cast<int64_t>(blocks_.size());
  prev_.assign(n + cfg_.sets, 0);
  next_.assign(n + cfg_.sets, 0);
  for (int s = 0; s < cfg_.sets; ++s) prev_[n + s] = next_[n + s] = n + s;  // empty circular lists
  resident_.assign(n, 0);
  dirty_.assign(n, 0);
  used_.assign(cfg_.sets, 0);
  arrivals_.assign(g_->num_tiles(), 0);
  per_tensor_.assign(g_->tensors().size(), {});
  for (size_t t = 0; t < per_tensor_.size(); ++t) {
    per_tensor_[t].name = g_->tensor(static_cast<int>(t)).name;
    per_tensor_[t].role = g_->tensor(static_cast<int>(t)).role;
  }
  read_ = write_ = hit_ = requested_ = 0;
}

int64_t CacheModel::block_id(int tensor, int64_t br, int64_t bc) const {
  return first_block_[tensor] + br * grids_[tensor].num_cols + bc;
}

int64_t CacheModel::block_bytes(const BlockRef& b) const {
  if (b.tensor < 0 || b.tensor >= static_cast<int>(grids_.size()) || b.block_row < 0 ||
      b.block_row >= grids_[b.tensor].num_rows || b.block_col < 0 || b.block_col >= grids_[b.tensor].num_cols)
    throw InvalidArgument("no block (" + std::to_string(b.tensor) + ", " + std::to_string(b.block_row) + ", " +
                          std::to_string(b.block_col) + ")");
  return blocks_[block_id(b.tensor, b.block_row, b.block_col)].bytes;
}

template <class F>
void CacheModel::for_blocks(const Region& r, F&& f) const {
  const BlockGrid& bg = grids_[r.tensor];
  for (int64_t br = r.r0 / bg.block_rows; br <= (r.r1 - 1) / bg.block_rows; ++br)
    for (int64_t bc = r.c0 / bg.block_cols; bc <= (r.c1 - 1) / bg.block_cols; ++bc) f(block_id(r.tensor, br, bc));
}

int CacheModel::set_of(int64_t id) const {
  if (cfg_.sets == 1) return 0;
  // Blocks of one tensor are consecutive ids: mix the bits so neighbours spread over the sets.
  uint64_t x = static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  return static_cast<int>(x % static_cast<uint64_t>(cfg_.sets));
}

void CacheModel::unlink(int64_t id) {
  next_[prev_[id]] = next_[id];
  prev_[next_[id]] = prev_[id];
}

void CacheModel::touch(int64_t id) {
  const int64_t head = static_cast<int64_t>(blocks_.size()) + set_of(id);
  if (next_[head] == id) return;
  unlink(id);
  prev_[id] = head;
  next_[id] = next_[head];
  prev_[next_[head]] = id;
  next_[head] = id;
}

// Makes room in the block's set (evicting least recently used blocks, writing back dirty ones), then
// links it at the front. A block larger than a whole set cannot stay: it streams through, not inserted.
void CacheModel::insert(int64_t id, TileResult& res) {
  const int s = set_of(id);
  const int64_t head = static_cast<int64_t>(blocks_.size()) + s;
  const int64_t bytes = blocks_[id].bytes;
  if (bytes > set_capacity_) return;
  while (used_[s] + bytes > set_capacity_) {
    const int64_t victim = prev_[head];
    unlink(victim);
    resident_[victim] = 0;
    used_[s] -= blocks_[victim].bytes;
    if (dirty_[victim]) {
      dirty_[victim] = 0;
      const int64_t vb = blocks_[victim].bytes;
      write_ += vb;
      res.dram_write += vb;
      per_tensor_[blocks_[victim].tensor].dram_write += vb;
    }
  }
  resident_[id] = 1;
  used_[s] += bytes;
  prev_[id] = head;
  next_[id] = next_[head];
  prev_[next_[head]] = id;
  next_[head] = id;
}

void CacheModel::read_block(int64_t id, TileResult& res) {
  const Block& b = blocks_[id];
  TensorTraffic& tt = per_tensor_[b.tensor];
  requested_ += b.bytes;
  res.requested_bytes += b.bytes;
  tt.requested_bytes += b.bytes;
  if (resident_[id]) {
    hit_ += b.bytes;
    res.hit_bytes += b.bytes;
    tt.hit_bytes += b.bytes;
    touch(id);
    return;
  }
  read_ += b.bytes;
  res.dram_read += b.bytes;
  tt.dram_read += b.bytes;
  insert(id, res);
}

// Write-allocate without a fill: a tile overwrites whole blocks.
void CacheModel::write_block(int64_t id, TileResult& res) {
  if (resident_[id]) {
    dirty_[id] = 1;
    touch(id);
    return;
  }
  insert(id, res);
  if (resident_[id]) {
    dirty_[id] = 1;
  } else {  // too large to cache: straight to DRAM
    const Block& b = blocks_[id];
    write_ += b.bytes;
    res.dram_write += b.bytes;
    per_tensor_[b.tensor].dram_write += b.bytes;
  }
}

int CacheModel::num_steps(int tile) const {
  const Tile& t = g_->tile(tile);
  if (t.step_cols <= 0) return 1;
  int64_t steps = 1;
  for (const Region& r : t.reads) steps = std::max(steps, ceil_div(r.cols(), t.step_cols));
  return static_cast<int>(steps);
}

template <class F>
void CacheModel::visit_step(int tile, int s, F&& f) const {
  for (int i = plan_begin_[tile]; i < plan_begin_[tile + 1]; ++i) {
    const ReadPlan& p = plans_[i];
    const int64_t c0 = s * p.per_step, c1 = std::min(p.cols, c0 + p.per_step);
    for (int64_t r = 0; r < p.rows; ++r)
      for (int64_t c = c0; c < c1; ++c) f(p.first_block + r * p.row_stride + c, false);
  }
}

// Split-K (as the executor does it): every slice adds its partial sums into one fp32 accumulator
// block with reductions performed at L2 (a read-modify-write there: a miss fills the block from
// DRAM, and it becomes dirty); the last slice of an output block to finish reads the sums, writes
// the output block once and zeroes the accumulator for the next launch (dirty again).
template <class F>
void CacheModel::visit_finish(int tile, bool reduces, F&& f, bool whole) const {
  const Tile& t = g_->tile(tile);
  const Op& op = g_->op(t.op);
  if (op.workspace < 0 || whole) {
    for (const Region& w : t.writes)
      if (w.tensor != op.workspace) for_blocks(w, [&](int64_t id) { f(id, true); });
    return;
  }
  for (const Region& w : t.writes)
    if (w.tensor == op.workspace) for_blocks(w, [&](int64_t id) { f(id, false), f(id, true); });
  if (!reduces) return;
  for (const Region& w : t.writes)
    if (w.tensor == op.workspace) for_blocks(w, [&](int64_t id) { f(id, false); });
  for (const Region& w : t.writes)
    if (w.tensor != op.workspace) for_blocks(w, [&](int64_t id) { f(id, true); });
  for (const Region& w : t.writes)
    if (w.tensor == op.workspace) for_blocks(w, [&](int64_t id) { f(id, true); });
}

TileResult CacheModel::step(int tile, int s) {
  TileResult res;
  res.tile = tile;
  visit_step(tile, s, [&](int64_t id, bool) { read_block(id, res); });
  return res;
}

TileResult CacheModel::finish(int tile, int slices) {
  const Tile& t = g_->tile(tile);
  const Op& op = g_->op(t.op);
  bool reduces = false;
  if (op.workspace >= 0) reduces = (arrivals_[g_->tile_id(t.op, t.tm, t.tn, 0)] += slices) == op.tiling.split_k;
  TileResult res;
  res.tile = tile;
  visit_finish(
      tile, reduces,
      [&](int64_t id, bool write) {
        if (write)
          write_block(id, res);
        else
          read_block(id, res);
      },
      slices == op.tiling.split_k);
  return res;
}

void CacheModel::step_accesses(int tile, int s, std::vector<Access>& out) const {
  visit_step(tile, s, [&](int64_t id, bool w) { out.push_back({id, w}); });
}

void CacheModel::finish_accesses(int tile, bool reduces, std::vector<Access>& out, bool whole) const {
  visit_finish(tile, reduces, [&](int64_t id, bool w) { out.push_back({id, w}); }, whole);
}

std::vector<CacheModel::Access> CacheModel::tile_accesses(int tile, bool reduces) const {
  std::vector<Access> out;
  const int steps = num_steps(tile);
  for (int s = 0; s < steps; ++s) visit_step(tile, s, [&](int64_t id, bool w) { out.push_back({id, w}); });
  visit_finish(tile, reduces, [&](int64_t id, bool w) { out.push_back({id, w}); });
  return out;
}

BlockRef CacheModel::block_ref(int64_t id) const {
  const int t = blocks_.at(id).tensor;
  const int64_t local = id - first_block_[t];
  return {t, local / grids_[t].num_cols, local % grids_[t].num_cols};
}

namespace {
void add_to(TileResult& acc, const TileResult& r) {
  acc.dram_read += r.dram_read;
  acc.dram_write += r.dram_write;
  acc.hit_bytes += r.hit_bytes;
  acc.requested_bytes += r.requested_bytes;
}
}  // namespace

TileResult CacheModel::run_tile(int tile) {
  if (tile < 0 || tile >= g_->num_tiles())
    throw InvalidArgument("tile " + std::to_string(tile) + " does not exist (the graph has " +
                          std::to_string(g_->num_tiles()) + " tiles)");
  TileResult res;
  res.tile = tile;
  const int steps = num_steps(tile);
  for (int s = 0; s < steps; ++s) add_to(res, step(tile, s));
  add_to(res, finish(tile));
  return res;
}

std::vector<TileResult> CacheModel::run_concurrent(const std::vector<int>& tiles) {
  std::vector<TileResult> res(tiles.size());
  int max_steps = 0;
  for (size_t i = 0; i < tiles.size(); ++i) {
    if (tiles[i] < 0 || tiles[i] >= g_->num_tiles())
      throw InvalidArgument("tile " + std::to_string(tiles[i]) + " does not exist");
    res[i].tile = tiles[i];
    max_steps = std::max(max_steps, num_steps(tiles[i]));
  }
  for (int s = 0; s < max_steps; ++s)
    for (size_t i = 0; i < tiles.size(); ++i) {
      const int n = num_steps(tiles[i]);
      if (s < n) add_to(res[i], step(tiles[i], s));
      if (s == n - 1) add_to(res[i], finish(tiles[i]));
    }
  return res;
}

TileResult CacheModel::flush() {
  TileResult res;
  for (size_t id = 0; id < blocks_.size(); ++id)
    if (resident_[id] && dirty_[id]) {
      dirty_[id] = 0;
      const Block& b = blocks_[id];
      write_ += b.bytes;
      res.dram_write += b.bytes;
      per_tensor_[b.tensor].dram_write += b.bytes;
    }
  return res;
}

std::vector<ResidentBlock> CacheModel::resident() const {
  std::vector<ResidentBlock> out;
  const int64_t n = static_cast<int64_t>(blocks_.size());
  // Sets interleaved by recency rank is not defined; list set by set, each most recent first.
  for (int s = 0; s < cfg_.sets; ++s)
    for (int64_t id = next_[n + s]; id != n + s; id = next_[id]) {
      out.push_back({block_ref(id), blocks_[id].bytes, dirty_[id] != 0});
    }
  return out;
}

int64_t CacheModel::resident_bytes() const { return std::accumulate(used_.begin(), used_.end(), int64_t{0}); }

TrafficReport CacheModel::report() const {
  TrafficReport r;
  r.dram_read = read_;
  r.dram_write = write_;
  r.hit_bytes = hit_;
  r.requested_bytes = requested_;
  r.per_tensor = per_tensor_;
  return r;
}

std::vector<int> writer_ops(const TileGraph& g) {
  std::vector<int> w(g.tensors().size(), static_cast<int>(g.ops().size()) - 1);
  for (int op = 0; op < static_cast<int>(g.ops().size()); ++op) {
    const Op& o = g.op(op);
    for (int t : {o.c, o.workspace})
      if (t >= 0) w[t] = op;
    for (int t : o.side_outputs) w[t] = op;
  }
  return w;
}

std::vector<OpTraffic> empty_op_traffic(const TileGraph& g) {
  std::vector<OpTraffic> v(g.ops().size());
  for (int op = 0; op < static_cast<int>(v.size()); ++op) {
    v[op].name = g.op(op).name;
    v[op].tiles = g.op(op).num_tiles;
    for (int t = g.op(op).first_tile; t < g.op(op).first_tile + g.op(op).num_tiles; ++t) v[op].flops += g.tile(t).flops;
  }
  return v;
}

TrafficReport simulate(const TileGraph& g, const Schedule& s, const CacheConfig& c) {
  if (c.l2 == L2Kind::Partitioned) return simulate_partitioned(g, s, c);
  validate(g, s);
  CacheModel model(g, c);
  std::vector<OpTraffic> per_op = empty_op_traffic(g);
  auto charge = [&](int tile, const TileResult& r) {
    OpTraffic& o = per_op[g.tile(tile).op];
    o.dram_read += r.dram_read;
    o.dram_write += r.dram_write;
    o.hit_bytes += r.hit_bytes;
    o.requested_bytes += r.requested_bytes;
  };
  const int n = g.num_tiles();
  const int slots = std::min(c.in_flight, std::max(n, 1));
  std::vector<uint8_t> done(n, 0);
  TicketDealer dealer(g, s);
  struct Slot {
    int tile = -1, step = 0, steps = 0;
    bool ready = false;  // all dependencies complete
    TicketDealer::Cursor at;
  };
  std::vector<Slot> slot(slots);
  std::vector<TraceStep> trace;
  // The slot's next tile: the rest of its ticket, else a new ticket (none: the slot idles).
  auto refill = [&](Slot& sl) {
    sl.tile = dealer.next(sl.at) ? dealer.tile(sl.at) : -1;
    sl.step = 0, sl.ready = false;
    if (sl.tile >= 0) sl.steps = model.num_steps(sl.tile);
  };
  for (Slot& sl : slot) refill(sl);
  // Every round each running tile whose producers are done does one step. The earliest ticket in
  // flight always has its producers done (the order is topological), so every round makes progress.
  for (bool running = true; running;) {
    running = false;
    for (Slot& sl : slot) {
      if (sl.tile < 0) continue;
      running = true;
      if (!sl.ready) {
        sl.ready = true;
        for (int d : g.tile(sl.tile).deps)
          if (!done[d]) {
            sl.ready = false;
            break;
          }
        if (!sl.ready) continue;
      }
      charge(sl.tile, model.step(sl.tile, sl.step));
      if (++sl.step < sl.steps) continue;
      if (!dealer.runs_on(sl.at.pos)) {  // a run of fused slices writes at its end, for all of them
        charge(sl.tile, model.finish(sl.tile, sl.at.run_slices()));
        for (int q = sl.at.run_begin; q <= sl.at.pos; ++q) done[s.order[q]] = 1;
        if (c.trace) {
          const TrafficReport now = model.report();
          for (int q = sl.at.run_begin; q <= sl.at.pos; ++q) {
            trace.push_back({s.order[q], now.dram_read, now.dram_write, now.hit_bytes, {}});
            if (c.trace_resident) trace.back().resident = model.resident();
          }
        }
      }
      refill(sl);
    }
  }
  // The final flush is charged to the op that wrote each dirty block.
  const std::vector<int> writer = writer_ops(g);
  for (const ResidentBlock& b : model.resident())
    if (b.dirty) per_op[writer[b.block.tensor]].dram_write += b.bytes;
  model.flush();
  TrafficReport r = model.report();
  r.order = s.name;
  r.trace = std::move(trace);
  r.per_op = std::move(per_op);
  return r;
}

}  // namespace tw
