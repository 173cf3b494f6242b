// The partitioned L2 model: Hopper's L2 as it is built, for the replays where the simple model's
// single LRU cache and lockstep tiles are too kind (prefill sizes, orders that share operands
// across many tiles in flight). docs/model.md ("The partitioned L2") gives the reasoning.
//
// - Two partitions of capacity/2. Every 128-byte line has a home partition (addresses are hashed
//   over them, so half of every block is homed in each); every SM is wired to one partition (its
//   near half: the model gives slot i partition i % 2).
// - A read of a line homed in the far partition looks in the near partition first (a copy); on a
//   miss it goes to the home partition, and a line it brings back is held in both (with
//   L2Params::far_copies). So data read from both sides takes twice its size, and data read from
//   one side 1.5 times. Writes go to the home partition and drop the copies. Split-K reductions are
//   performed at the home partition (no copies).
// - Lines are allocated whole (L2Params::line_bytes); DRAM moves sectors (CacheConfig::line_bytes).
// - Sets: each partition's lines are hashed over sets of `ways` lines with LRU in each. A block's
//   lines spread over all sets, so the model keeps LRU order per partition at block granularity and
//   charges each access the fraction of lines that the hash evicted: with d bytes of other lines
//   touched since the block's last use (its LRU stack distance, plus the block's own lines), a line
//   survives iff fewer than `ways` of them fell into its set -- probability P(Poisson(d/line/sets)
//   <= ways - 1). ways = 0 is fully associative (hit iff d fits). With L2Params::set_fringe, at most
//   set_fringe lines per set fall at random and the rest evenly (the hash spreads the whole tensors
//   a long reuse distance covers over every set alike), so the cliff at the capacity is sharper.
//   Dirty data is carried as a fraction: the part that was evicted since the last touch was written
//   back.
// - Weights streamed evict-first (L2Params::evict_first_weights), two models (L2Params::evict_first):
//   Push: a weight line's reuse distance counts everything, every other line's counts only
//   weight_push of the weight bytes. Room: a set's victim is its evict-first line whenever it holds
//   one, so the other lines' distance counts no weight bytes (they are evicted only by each other),
//   and the weights live in the ways the others leave: the other lines never leave once allocated
//   (nothing but another non-weight line evicts them), so once they have filled the partition a
//   weight line holds the one way it took and survives only until the next allocation in its set.
// - A K-step's duration counts its L2 hits at L2Params::hit_time of a DRAM byte: a tile that finds
//   the operands another fetched runs faster and catches up (tiles sharing operands convoy).
// - Tiles do not advance in lockstep: an event-driven replay where a K-step lasts in proportion to
//   the bytes it reads, scaled by a per-SM speed (1 +- sm_skew) and a per-step draw (1 +- jitter);
//   a tile waiting on producers starts when the last of them finishes.
//
// With partitions = 1, ways = 0, no jitter or skew, a graph without waits replays exactly as the
// simple model does (tests/cpu/test_l2_model.cpp checks it).
#pragma once

#include <vector>

#include "tileweave/model/cache_model.hpp"

namespace tw {

// simulate() for CacheConfig::l2 == Partitioned. Validates the schedule first. Per-tile traces are
// recorded (cumulative counters) with CacheConfig::trace; resident blocks are not.
TrafficReport simulate_partitioned(const TileGraph& g, const Schedule& s, const CacheConfig& c);

// P(a line survives) given (d + own) / capacity of its partition = x, for `ways`-way sets.
// ways = 0: 1 if x <= 1 else 0. Exposed for tests.
// fringe: L2Params::set_fringe (0: all of the lines at random, as before).
double l2_survival(double x, int ways, double fringe = 0.0);

// P(N <= n - 1) for the number N of lines, mean lambda, that fell into one set: Poisson(lambda) with
// fringe 0, else Poisson(min(lambda, fringe)) plus the rest spread evenly (floor or ceil of its mean).
double l2_set_count_below(double lambda, int n, double fringe);

// With L2EvictFirst::Room: P(an evict-first line survives) when `allocated` bytes of lines were
// allocated in its partition since its last use, the line's block holds `own` bytes, and the other
// (not evict-first) lines have held `others` bytes of the partition's `capacity`. The others leave
// room = max(1, ways x (1 - others / capacity)) ways of a set; the line survives iff fewer than room
// of the allocations fell into its set: P(N <= room - 1) for N of mean ways x allocated / capacity
// (l2_set_count_below with `fringe`), interpolated between whole ways. ways = 0: 1 iff allocated +
// own <= capacity - others.
double l2_room_survival(double allocated, double own, double others, double capacity, int ways,
                        double fringe = 0.0);

// Helpers shared by both replays (cache_model.cpp).
std::vector<int> writer_ops(const TileGraph& g);            // by tensor: the op that writes it (last one)
std::vector<OpTraffic> empty_op_traffic(const TileGraph& g);  // names, tile counts, FLOPs

}  // namespace tw
