// The executor's plan: the tile graph and schedule flattened into the tables the GPU reads.
// Host-only (no CUDA), so the mapping from graph to counters is tested on the CPU.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "tileweave/graph/tile_graph.hpp"
#include "tileweave/order/schedule.hpp"

namespace tw {

// How consumers of an op's output wait for it (CuSync's policies, per producer op):
//  Tile:    one counter per output block (tm, tn); a consumer waits for exactly the blocks it reads.
//  Row:     one counter per row of output blocks; a consumer waits for whole rows.
//  Strided: one counter per (tm, tn mod stride); a consumer waits for every block congruent to one
//           it reads (for producers whose consumers read column blocks at a fixed stride).
enum class SyncPolicy { Tile, Row, Strided };
struct SyncSpec {
  SyncPolicy policy = SyncPolicy::Tile;
  int stride = 1;
};
const char* to_string(SyncPolicy p);
SyncPolicy parse_sync_policy(const std::string& s);  // "tile", "row", "strided"

// 32 bytes; read once per ticket.
struct DeviceTile {
  int32_t op, tm, tn, ks;
  int32_t wait_begin, wait_end;  // range in ExecPlan::waits
  int32_t signal;                // counter this tile increments when its output is complete
  int32_t arrive;                // split-K arrival counter (-1 without split-K)
};
// Wait until counter `counter` has been incremented `count` times in this launch.
struct WaitEntry {
  int32_t counter;
  uint32_t count;
};

struct ExecPlan {
  std::vector<int32_t> order;      // position -> tile id
  std::vector<int32_t> units;      // Schedule::units (empty: ticket i is position i)
  std::vector<DeviceTile> tiles;   // by tile id
  std::vector<WaitEntry> waits;
  int num_signal_counters = 0;
  int num_arrive_counters = 0;
  int max_waits_per_tile = 0;
};

// Validates the schedule, then maps every dependency edge to a wait on the producer's counter
// under the producer op's policy (default Tile).
ExecPlan make_exec_plan(const TileGraph& g, const Schedule& s, const std::map<int, SyncSpec>& policy = {});

// Runs the K slices of the output tiles `whole` picks (from split-K ops; called with each tile's
// first slice) as one ticket each: the ticket of the tile's earliest slice in the order covers all of
// them (the kernel sums them in registers: no partial sums, no arrival; its DeviceTile keeps ks 0
// with arrive -1, waits for what any of the slices waited for, and publishes every slice's signal at
// once), and the other slices' tickets leave the order. A tile whose slices' dependencies are not all
// published before that ticket keeps its slices. Returns where each old position went (size order +
// 1; a dropped ticket maps to the next kept one), for callers holding ranges of tickets.
std::vector<int> run_slices_whole(ExecPlan& p, const TileGraph& g, const std::function<bool(const Tile&)>& whole);

// A plan whose multi-tile tickets (units) each hold every K slice of one output block, in order from
// slice 0 (the whole waves of order "waves:<W>/..."): those tickets become run_slices_whole tickets
// and the units go (the sm90 FFN body then streams each such tile's K range in one go, with no
// per-slice restart). Returns false, and leaves the plan as it was, where some unit holds anything
// else (stream-K units) or the plan has none.
bool run_whole_units(ExecPlan& p, const TileGraph& g);

}  // namespace tw
