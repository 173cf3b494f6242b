#include "tileweave/model/time_model.hpp"

#include "tileweave/kernels/sm90/tile_shape.hpp"
#include "tileweave/model/prefill_traffic.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tw {

void TimeParams::validate() const {
  if (!(read_tbps > 0)) throw InvalidArgument("read bandwidth must be positive, got " + to_text(read_tbps) + " TB/s");
  if (!(gemm_tflops > 0)) throw InvalidArgument("GEMM peak must be positive, got " + to_text(gemm_tflops) + " TFLOP/s");
  if (!(sm_stream_gbps > 0)) throw InvalidArgument("per-SM streaming rate must be positive, got " + to_text(sm_stream_gbps) + " GB/s");
  if (!(launch_us >= 0)) throw InvalidArgument("launch cost must be >= 0, got " + to_text(launch_us) + " us");
  if (slots < 1) throw InvalidArgument("tiles in flight must be at least 1, got " + std::to_string(slots));
  if (!(tile_tflops >= 0)) throw InvalidArgument("tile mainloop rate must be >= 0, got " + to_text(tile_tflops) + " TFLOP/s");
  if (!(tile_fixed_base_us >= 0 || tile_fixed_base_us == -1))
    throw InvalidArgument("per-tile fixed latency at no rows must be >= 0 or -1, got " + to_text(tile_fixed_base_us) + " us");
  if (!(tile_fixed_us >= 0)) throw InvalidArgument("per-tile fixed latency must be >= 0, got " + to_text(tile_fixed_us) + " us");
  if (!(overlap_power >= 0)) throw InvalidArgument("compute/memory overlap power must be >= 0, got " + to_text(overlap_power));
  if (!(reduce_block_gbps >= 0)) throw InvalidArgument("same-block reduction rate must be >= 0, got " + to_text(reduce_block_gbps) + " GB/s");
  if (!(slice_restart_us >= 0)) throw InvalidArgument("slice restart latency must be >= 0, got " + to_text(slice_restart_us) + " us");
  if (split_finisher_rows < 0) throw InvalidArgument("split finisher rows must be >= 0, got " + std::to_string(split_finisher_rows));
  if (!(reduce_tbps >= 0)) throw InvalidArgument("split-K reduction rate must be >= 0, got " + to_text(reduce_tbps) + " TB/s");
}

TimeParams time_params(const GpuPreset& gpu, int slots) {
  TimeParams p;
  p.read_tbps = gpu.read_tbps;
  p.gemm_tflops = gpu.gemm_tflops;
  p.sm_stream_gbps = gpu.sm_stream_gbps;
  p.launch_us = gpu.launch_us;
  p.slots = slots;
  p.tile_tflops = gpu.tile_tflops;
  p.tile_fixed_us = gpu.tile_fixed_us;
  p.tile_fixed_base_us = gpu.tile_fixed_base_us;
  p.reduce_tbps = gpu.reduce_tbps;
  p.overlap_power = gpu.overlap_power;
  p.reduce_block_gbps = gpu.reduce_block_gbps;
  p.slice_restart_us = gpu.slice_restart_us;
  p.split_finisher_rows = gpu.split_finisher_rows;
  return p;
}

// Times in microseconds: bytes / (TB/s * 1e6), FLOPs / (TFLOP/s * 1e6).
OpTime op_time(const std::string& name, int tiles, double bytes, double flops, const TimeParams& p) {
  p.validate();
  OpTime o;
  o.name = name;
  o.tiles = tiles;
  o.bytes = bytes;
  o.flops = flops;
  o.intensity = bytes > 0 ? flops / bytes : 0;
  o.compute_bound = o.intensity > p.gemm_tflops / p.read_tbps;
  o.memory_us = bytes / (p.read_tbps * 1e6);
  o.compute_us = flops / (p.gemm_tflops * 1e6);
  if (tiles <= 0) return o;
  const int64_t full = tiles / p.slots, rest = tiles % p.slots;
  o.waves = double(tiles) / p.slots;
  o.tail_efficiency = double(tiles) / (double(full + (rest > 0)) * p.slots);
  // A wave of r tiles moves r tiles' share of the bytes at min(floor, r SMs' streaming rate), and
  // computes r tiles' share of the FLOPs on r of the P SMs' share of the peak.
  auto wave_us = [&](int64_t r) {
    const double tbps = std::min(p.read_tbps, r * p.sm_stream_gbps / 1000.0);
    const double mem = bytes * r / tiles / (tbps * 1e6);
    const double comp = flops * r / tiles / (p.gemm_tflops * 1e6 * r / p.slots);
    return std::max(mem, comp);
  };
  o.roofline_us = full * wave_us(p.slots) + (rest > 0 ? wave_us(rest) : 0.0);
  return o;
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// What the replay needs of every tile (by tile id).
struct TileCost {
  int64_t steps = 1;
  double step_us = 0;     // one K-step at the mainloop's rate (compute)
  double step_bytes = 0;  // DRAM bytes per K-step (the op's bytes spread over its K-steps)
  double reduce_bytes = 0;
  int group = -1;         // split-K output block (index into the group table), -1 if unsplit
  double fixed_us = -1;   // latency before the first step; -1: the GEMM tile's (TimeParams::tile_fixed_us)
  bool last_k = false;    // a split tile of more than split_finisher_rows rows holding its block's last K range
  bool finisher_op = false;  // its op's tiles are that tall (TimeParams::split_finisher_rows)
};

struct Costs {
  std::vector<TileCost> tile;
  std::vector<int> group_slices;  // slices per split-K output block
};

Costs tile_costs(const TileGraph& g, const TrafficReport& r, const TimeParams& p) {
  Costs c;
  c.tile.resize(g.num_tiles());
  const double tflops = p.tile_tflops > 0 ? p.tile_tflops : p.gemm_tflops;
  const double sm_flops_per_us = tflops * 1e6 / p.slots;
  std::vector<double> op_steps(g.ops().size(), 0.0);
  for (int id = 0; id < g.num_tiles(); ++id) {
    const Tile& t = g.tile(id);
    TileCost& tc = c.tile[id];
    tc.steps = t.step_cols > 0 ? std::max<int64_t>(1, (t.k1 - t.k0 + t.step_cols - 1) / t.step_cols) : 1;
    tc.step_us = t.flops / tc.steps / sm_flops_per_us;
    const Op& o = g.op(t.op);
    if (o.kind == OpKind::Gemm || o.kind == OpKind::GemmSiluMul) {
      // The mainloop computes whole tiles: rows and columns past the op's edge (zero-filled) take as
      // long as real ones (M = 200 in a 256-row tile computes 256).
      for (const Region& w : t.writes)
        if (w.tensor == o.c && w.rows() > 0 && w.cols() > 0)
          tc.step_us *= double(o.tiling.bm) / double(w.rows()) * double(o.tiling.bn) / double(w.cols());
      constexpr int64_t kRows = sm90::kMaxActRows;  // the rows tile_fixed_us was fitted on
      if (p.tile_fixed_base_us >= 0)
        tc.fixed_us = p.tile_fixed_base_us +
                      (p.tile_fixed_us - p.tile_fixed_base_us) * double(std::min(o.tiling.bm, kRows)) / double(kRows);
    }
    if (o.kind == OpKind::PrefillAttention && t.reads.size() >= 2) {
      // An attention item is not a GEMM tile: its fixed cost and its cost per key row (whole key
      // tiles of bk rows) from prefill attention's fitted model (model/prefill_traffic.hpp, bf16).
      PrefillAttentionShape s;
      s.head_dim = int(o.tiling.bn);
      const PrefillTimeModel m = prefill_time_model(s);
      const int64_t keys = (t.reads[1].rows() + o.tiling.bk - 1) / o.tiling.bk * o.tiling.bk;
      tc.step_us = m.us_per_item + m.us_per_key_row * double(keys);
      tc.fixed_us = 0;  // in us_per_item
    }
    op_steps[t.op] += double(tc.steps);
  }
  // Split-K groups: the slices of one output block, keyed by (op, tm, tn).
  for (size_t op = 0; op < g.ops().size(); ++op) {
    const Op& o = g.ops()[op];
    const double bytes = op < r.per_op.size() ? double(r.per_op[op].dram_read + r.per_op[op].dram_write) : 0.0;
    const bool split = o.workspace >= 0 && o.tiling.split_k > 1;
    const int first_group = static_cast<int>(c.group_slices.size());
    if (split) c.group_slices.resize(c.group_slices.size() + size_t(o.grid_m * o.grid_n), 0);
    for (int id = o.first_tile; id < o.first_tile + o.num_tiles; ++id) {
      const Tile& t = g.tile(id);
      TileCost& tc = c.tile[id];
      tc.step_bytes = op_steps[op] > 0 ? bytes / op_steps[op] : 0.0;
      if (!split) continue;
      for (const Region& w : t.writes)
        if (w.tensor == o.workspace) tc.reduce_bytes += double(w.rows() * w.cols()) * g.tensor(w.tensor).elem_bytes;
      tc.group = first_group + static_cast<int>(t.tm * o.grid_n + t.tn);
      ++c.group_slices[tc.group];
      tc.finisher_op = p.split_finisher_rows > 0 && o.tiling.bm > p.split_finisher_rows;
      tc.last_k = tc.finisher_op && t.ks == o.tiling.split_k - 1;
    }
  }
  return c;
}

// The replay of the tiles of `s` (ticket u runs positions [s.ticket_begin(u), s.ticket_end(u)) in
// turn on one slot); dependencies on tiles outside `s` count as met at time 0. Consecutive K slices
// of one output block in a ticket (fused_with_next) are one run: the fixed latency once, one partial
// sum, and their outputs complete together at its end. Fills take/start/end of the tiles in `s`;
// returns the time the last one ends.
double replay(const TileGraph& g, const Schedule& s, const Costs& c, const TimeParams& p, TileTimes& out) {
  const std::vector<int>& order = s.order;
  TicketDealer dealer(g, s);
  const double floor_bpus = p.read_tbps * 1e6;          // bytes per us
  const double sm_bpus = p.sm_stream_gbps * 1e3;        // bytes per us
  const double reduce_bpus = p.reduce_tbps * 1e6;
  const double block_bpus = p.reduce_block_gbps * 1e3;
  std::vector<double> block_free(c.group_slices.size(), 0.0);
  std::vector<char> in_set(g.num_tiles(), 0);
  for (int id : order) in_set[id] = 1;
  std::vector<double> done(g.num_tiles(), -1.0);        // output complete (-1: not yet)
  for (int id = 0; id < g.num_tiles(); ++id)
    if (!in_set[id]) done[id] = 0.0;
  std::vector<int> group_left = c.group_slices;
  for (int id = 0; id < g.num_tiles(); ++id)
    if (!in_set[id] && c.tile[id].group >= 0) --group_left[c.tile[id].group];
  // The split finisher applies where every block's last-K slice comes last in the order, as the
  // executor requires; the others' sums are then served by group_served, and a finisher that
  // arrives first waits (its position in pending).
  const bool finisher = p.split_finisher_rows > 0 && split_finisher_last(g, s);
  std::vector<double> group_served(c.group_slices.size(), 0.0);
  std::vector<int> pending(c.group_slices.size(), -1);

  enum Phase { Wait, Main, Epi };
  struct Run {
    TicketDealer::Cursor at;  // the tile's position, its ticket's end, its run's first position
    Phase phase;
    double ready;  // Wait: the fixed latency's end
    double left;   // Main: K-steps left
    double rate;   // Main: K-steps per us now
    double end;    // Epi: when the slot is free (kInf: a finisher waiting for its block's other slices)
    double out;    // Epi: when its output is complete (at or after end; the reductions a slot left behind)
    double main_end;  // Epi: when its K-steps ended
  };
  auto id_of = [&](const Run& a) { return order[a.at.pos]; };
  // A slot's next tile (the rest of its ticket, else a new ticket): its fixed latency runs from now.
  auto take = [&](Run& a, double now) {
    const int id = order[a.at.pos];
    out.take[id] = now;
    a.phase = Wait;
    a.ready = now + (c.tile[id].fixed_us >= 0 ? c.tile[id].fixed_us : p.tile_fixed_us);
  };
  std::vector<Run> active;
  active.reserve(p.slots);
  double now = 0, reduce_free = 0, makespan = 0;
  for (int slot = 0; slot < p.slots; ++slot) {
    Run a{};
    if (!dealer.next(a.at)) break;
    take(a, now);
    active.push_back(a);
  }

  auto deps_done = [&](int id, double& when) {
    when = 0;
    for (int d : g.tile(id).deps) {
      if (done[d] < 0) return false;
      when = std::max(when, done[d]);
    }
    return true;
  };
  const double eps = 1e-9;
  while (!active.empty()) {
    // Wait -> Main once the fixed latency is over and the producers are done.
    for (Run& a : active) {
      double dep = 0;
      if (a.phase == Wait && a.ready <= now + eps && deps_done(id_of(a), dep) && dep <= now + eps) {
        a.phase = Main;
        a.left = double(c.tile[id_of(a)].steps);
        out.start[id_of(a)] = now;
      }
    }
    // Rates. A K-step computes for step_us and moves step_bytes at the tile's share of the floor (the
    // floor split evenly over the tiles streaming now, at most one SM's streaming rate); the two
    // overlap imperfectly: step time = (compute^n + memory^n)^(1/n), n = overlap_power (the
    // roofline's max as n grows; their sum at n = 1).
    int streaming = 0;
    for (const Run& a : active) streaming += a.phase == Main && c.tile[id_of(a)].step_bytes > 0;
    const double share = streaming ? std::min(sm_bpus, floor_bpus / streaming) : sm_bpus;
    for (Run& a : active) {
      if (a.phase != Main) continue;
      const TileCost& tc = c.tile[id_of(a)];
      const double mem = tc.step_bytes / share, comp = tc.step_us;
      double step;
      if (p.overlap_power <= 0 || mem <= 0 || comp <= 0) {
        step = std::max(mem, comp);
      } else {
        const double hi = std::max(mem, comp), lo = std::min(mem, comp);
        step = hi * std::pow(1.0 + std::pow(lo / hi, p.overlap_power), 1.0 / p.overlap_power);
      }
      a.rate = step > 0 ? 1.0 / step : kInf;
    }
    // The next event.
    double t_ev = kInf;
    for (const Run& a : active) {
      if (a.phase == Wait) {
        double dep = 0;
        if (deps_done(id_of(a), dep)) t_ev = std::min(t_ev, std::max(a.ready, dep));
      } else if (a.phase == Main) {
        t_ev = std::min(t_ev, a.rate == kInf ? now : now + a.left / a.rate);
      } else {
        t_ev = std::min(t_ev, a.end);
      }
    }
    if (t_ev == kInf) throw InvalidArgument("time replay: no tile can make progress (a dependency outside the schedule?)");
    t_ev = std::max(t_ev, now);
    const double dt = t_ev - now;
    now = t_ev;
    for (Run& a : active) {
      if (a.phase != Main) continue;
      a.left = a.rate == kInf ? 0.0 : a.left - a.rate * dt;
      if (a.left > eps * double(c.tile[id_of(a)].steps)) continue;
      if (dealer.runs_on(a.at.pos)) {
        // The next slice of the same output block: the run goes on, with no epilogue between, but
        // its K-steps start only after slice_restart_us (GpuPreset says what was measured) -- except
        // in a run of every slice, which the executor runs as one ticket.
        dealer.next(a.at);
        out.take[id_of(a)] = now;
        a.phase = Wait;
        a.ready = now + (dealer.in_whole_run(a.at.pos) ? 0.0 : p.slice_restart_us);
        continue;
      }
      // K-steps done: the epilogue. A split-K run adds its partial sums at the L2 (shared by the
      // launch); the last run of its block to arrive then reads the sums back and re-zeroes them.
      // A run of every slice of its block stores its output as an unsplit tile does.
      const TileCost& tc = c.tile[id_of(a)];
      const int slices = a.at.run_slices();
      a.phase = Epi;
      a.end = a.main_end = now;
      if (tc.reduce_bytes > 0 && slices < c.group_slices[tc.group]) {
        const bool as_finisher = finisher && tc.finisher_op;
        const double read_back = 2 * tc.reduce_bytes / sm_bpus;
        if (as_finisher && tc.last_k) {
          // The finisher: no partial sums of its own; once the others' are served it reads them back.
          if ((group_left[tc.group] -= slices) == 0) a.end = std::max(now, group_served[tc.group]) + read_back;
          else a.end = kInf, pending[tc.group] = a.at.pos;
          a.out = a.end;
          continue;
        }
        double served = now;
        if (reduce_bpus > 0) served = reduce_free = std::max(reduce_free, now) + tc.reduce_bytes / reduce_bpus;
        if (block_bpus > 0) {
          double& b = block_free[tc.group];
          b = std::max(b, now) + tc.reduce_bytes / block_bpus;
          served = std::max(served, b);
        }
        const bool last = (group_left[tc.group] -= slices) == 0;
        if (as_finisher) {
          // The slot goes on at once; the finisher, waiting or to come, reads back after `served`.
          group_served[tc.group] = std::max(group_served[tc.group], served);
          a.out = served;
          if (last && pending[tc.group] >= 0)
            for (Run& f : active)
              if (f.phase == Epi && f.at.pos == pending[tc.group]) f.end = f.out = std::max(f.main_end, group_served[tc.group]) + read_back;
          continue;
        }
        a.end = served + (last ? read_back : 0.0);
      }
      a.out = a.end;
    }
    for (size_t i = 0; i < active.size();) {
      Run& a = active[i];
      if (a.phase == Epi && a.end <= now + eps) {
        for (int q = a.at.run_begin; q <= a.at.pos; ++q) done[order[q]] = out.end[order[q]] = a.out;
        makespan = std::max(makespan, a.out);
        if (dealer.next(a.at)) {  // the slot's next tile
          take(a, now);
          ++i;
          continue;
        }
        active[i] = active.back();
        active.pop_back();
      } else {
        ++i;
      }
    }
  }
  return makespan;
}

}  // namespace

TileTimes replay_tiles(const TileGraph& g, const Schedule& s, const TrafficReport& r, const TimeParams& p) {
  p.validate();
  validate(g, s);
  const Costs c = tile_costs(g, r, p);
  TileTimes t;
  t.take.assign(g.num_tiles(), 0.0);
  t.start.assign(g.num_tiles(), 0.0);
  t.end.assign(g.num_tiles(), 0.0);
  t.makespan = replay(g, s, c, p, t);
  return t;
}

TimePrediction predict_time(const TileGraph& g, const Schedule& s, const TrafficReport& r, const TimeParams& p) {
  p.validate();
  validate(g, s);
  if (r.per_op.size() != g.ops().size())
    throw InvalidArgument("predict_time: the traffic report has " + std::to_string(r.per_op.size()) + " ops, the graph " +
                          std::to_string(g.ops().size()));
  const Costs c = tile_costs(g, r, p);
  TimePrediction t;
  t.ridge = p.gemm_tflops / p.read_tbps;
  TileTimes all;
  all.take.assign(g.num_tiles(), 0.0);
  all.start.assign(g.num_tiles(), 0.0);
  all.end.assign(g.num_tiles(), 0.0);
  t.fused_us = replay(g, s, c, p, all) + p.launch_us;
  // Partial sums added at L2, by op: one per run of fused slices that is not its block's every slice.
  std::vector<double> reduce_bytes(g.ops().size(), 0.0);
  const std::vector<uint8_t> fused = fused_with_next(g, s);
  for (size_t i = 0, run = 1; i < s.order.size(); ++i, ++run) {
    if (fused[i]) continue;
    const TileCost& tc = c.tile[s.order[i]];
    if (tc.reduce_bytes > 0 && int(run) < c.group_slices[tc.group]) reduce_bytes[g.tile(s.order[i]).op] += tc.reduce_bytes;
    run = 0;
  }
  for (size_t op = 0; op < g.ops().size(); ++op) {
    const OpTraffic& o = r.per_op[op];
    OpTime ot = op_time(o.name, o.tiles, double(o.dram_read + o.dram_write), o.flops, p);
    ot.reduce_bytes = reduce_bytes[op];
    std::vector<uint8_t> keep(g.num_tiles(), 0);
    for (int id = 0; id < g.num_tiles(); ++id) keep[id] = g.tile(id).op == static_cast<int>(op);
    const Schedule mine = restrict_schedule(s, keep);
    if (!mine.order.empty()) {
      ot.start_us = kInf;
      for (int id : mine.order) ot.start_us = std::min(ot.start_us, all.take[id]), ot.end_us = std::max(ot.end_us, all.end[id]);
      TileTimes alone = all;
      ot.us = replay(g, mine, c, p, alone);
    }
    t.separate_us += ot.us + p.launch_us;
    t.ops.push_back(ot);
  }
  return t;
}

}  // namespace tw
