// The tile-traffic model: a schedule replayed over a cache of capacity S, with P tiles in flight
// interleaving their K-steps (as thread blocks do on a GPU), counting DRAM read and write bytes.
//
// Granularity: every tensor is cut into a uniform grid of blocks whose edges include every edge any
// tile touches (a tile's K-step reads exactly whole blocks). The cache holds whole blocks, sized in
// line-rounded bytes (a block row of c bytes costs ceil(c / line) lines). Replacement is LRU over
// blocks, fully associative by default, or `sets` LRU partitions with blocks hashed to a partition.
// Writes allocate (dirty); dirty blocks cost a DRAM write when evicted or at the end (flush).
// See docs/model.md for all the assumptions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tileweave/graph/tile_graph.hpp"
#include "tileweave/order/schedule.hpp"

namespace tw {

// Which L2 the replay assumes. Simple: one LRU cache of whole blocks, tiles in lockstep (the
// model every earlier result used). Partitioned: Hopper's L2 as it is built (model/l2_model.hpp).
enum class L2Kind { Simple, Partitioned };
const char* to_string(L2Kind k);
L2Kind parse_l2_kind(const std::string& name);  // "simple" | "partitioned"; else InvalidArgument

// How the partitioned model replaces evict-first (weight) lines: L2Params::evict_first.
enum class L2EvictFirst { Push, Room };
const char* to_string(L2EvictFirst k);
L2EvictFirst parse_l2_evict_first(const std::string& name);  // "push" | "room"; else InvalidArgument

// Parameters of the partitioned model (the GPU presets carry them; docs/model.md explains each).
// One tile's recorded progress (the executor's tile timeline, e.g. bench_ffn --trace): the SM it ran
// on, when its K-steps began (its producers ready) and ended (computed), and when it was done.
struct TileSpan {
  int sm = -1;
  double begin = 0, end = 0, done = 0;  // any one clock (us)
};

struct L2Params {
  int partitions = 2;         // 1 or 2 halves of the L2, each capacity / partitions
  bool far_copies = true;     // a line read by an SM whose near half is not the line's home is also held
                              // in the near half (so data read from both sides takes twice the space)
  int64_t line_bytes = 128;   // allocation unit (a tag); CacheConfig::line_bytes stays the sector DRAM moves
  int ways = 16;              // associativity of a hashed set; 0 = fully associative
  double step_jitter = 0.0;   // a K-step lasts its nominal time x (1 +- jitter), uniform
  double sm_skew = 0.0;       // each SM runs at 1 +- skew of the nominal speed, uniform, for the whole replay
  uint64_t seed = 1;          // of the jitter and skew draws (deterministic)
  // Weights are streamed with an evict-first L2 policy (the sm90 tile body's TMA cache hint): weight
  // lines are the victims of choice, so they never push activations, intermediates or outputs out
  // (those lines' reuse distance counts no weight bytes), while a weight line is as exposed as under
  // plain LRU (its distance counts everything touched since its last use).
  bool evict_first_weights = false;
  // With evict_first_weights: the share of the weight bytes touched since a non-weight line's last use
  // that still count in its reuse distance (0: weights never push other lines out, strict priority;
  // 1: plain LRU, as if there were no policy).
  double weight_push = 0.0;
  // How the evict-first weight lines are replaced (with evict_first_weights; l2_model.hpp, docs/model.md):
  // Push: a weight line is as exposed as under plain LRU and the weights push the other lines out with
  //   weight_push of their bytes (the presets' model until 2026-11-28).
  // Room: the victim of a set is its evict-first line whenever it holds one, so weights never push the
  //   other lines out, and a weight line lives in the ways the other lines leave it: once they fill its
  //   set, only until the next line is allocated there. weight_push is unused.
  L2EvictFirst evict_first = L2EvictFirst::Push;
  // A K-step's duration in the drawn-drift replay: its bytes, those that hit in L2 counted at hit_time
  // of a byte that comes from DRAM (1: every byte alike, as before). Below 1 a tile that finds its
  // operands in L2 catches up with the one that fetched them, so tiles sharing operands stay together.
  double hit_time = 1.0;
  // How the lines touched since a line's last use fall into its set: at most set_fringe lines per set
  // (in expectation) at random, Poisson, the rest evenly -- every set gets its share, floor or ceil,
  // as a set hash spreads whole tensors (a re-read near the capacity covers them) over all sets. A
  // short window (a weight line's life in the room, a few K-steps of scattered blocks) stays Poisson;
  // a long reuse distance gets a sharp cliff at the capacity. 0: every line at random (Poisson, the
  // model until 2026-11-28).
  double set_fringe = 0.0;
  // Recorded tile progress, by tile id (every tile of the graph): the replay then takes the tickets,
  // waits and drift as they happened -- tile t's K-steps evenly over [begin, end) on SM `sm` (near
  // partition sm % partitions), its writes at `done` -- instead of drawing them (jitter and skew are
  // unused). Schedules of one tile a ticket only.
  const std::vector<TileSpan>* timeline = nullptr;
};

struct CacheConfig {
  int64_t capacity_bytes = int64_t{60} << 20;  // S
  int64_t line_bytes = 32;                     // sector: the unit DRAM moves
  int in_flight = 1;                           // P: tiles running at once
  int sets = 1;                                // 1: fully associative LRU (simple model only)
  bool trace = false;                          // record cumulative counters after every tile
  bool trace_resident = false;                 // ... and the resident blocks (small graphs only; simple model)
  L2Kind l2 = L2Kind::Simple;
  L2Params part;                               // used when l2 == Partitioned
  void validate() const;                       // InvalidArgument naming the bad value
};

struct BlockRef {
  int tensor = -1;
  int64_t block_row = 0, block_col = 0;
};
struct ResidentBlock {
  BlockRef block;
  int64_t bytes = 0;
  bool dirty = false;
};
// The block grid of one tensor: blocks of block_rows x block_cols elements (edge blocks clipped),
// num_rows x num_cols of them.
struct BlockGrid {
  int64_t block_rows = 0, block_cols = 0;
  int64_t num_rows = 0, num_cols = 0;
};

struct TensorTraffic {
  std::string name;
  TensorRole role = TensorRole::Input;
  int64_t dram_read = 0, dram_write = 0;
  int64_t hit_bytes = 0;        // read bytes served by the cache
  int64_t requested_bytes = 0;  // read bytes asked for (hits + misses)
};

// Counters of one tile (or one call): DRAM bytes it caused and cache hits it got.
struct TileResult {
  int tile = -1;
  int64_t dram_read = 0, dram_write = 0, hit_bytes = 0, requested_bytes = 0;
};

struct TraceStep {
  int tile = -1;                      // the tile that just completed
  int64_t dram_read = 0, dram_write = 0, hit_bytes = 0;  // cumulative, after it
  std::vector<ResidentBlock> resident;  // only with CacheConfig::trace_resident
};

// DRAM bytes caused by one op's tiles (write-backs count for the tile whose access evicted them;
// the final flush for the op that wrote the block) and the FLOPs its tiles do.
struct OpTraffic {
  std::string name;
  int64_t dram_read = 0, dram_write = 0;
  int64_t hit_bytes = 0, requested_bytes = 0;
  double flops = 0;
  int tiles = 0;
};

struct TrafficReport {
  std::string order;
  std::vector<OpTraffic> per_op;          // by op id (simulate() fills it)
  int64_t dram_read = 0, dram_write = 0;
  int64_t hit_bytes = 0, requested_bytes = 0;
  std::vector<TensorTraffic> per_tensor;  // by tensor id
  std::vector<TraceStep> trace;           // by completion, with CacheConfig::trace
  int64_t dram_total() const { return dram_read + dram_write; }
  double hit_rate() const { return requested_bytes ? double(hit_bytes) / double(requested_bytes) : 0.0; }
};

// Step-by-step model (the explorer drives this one). Holds a pointer to the graph: keep it alive.
// Copyable: a copy is a snapshot (undo = keep copies).
class CacheModel {
 public:
  CacheModel(const TileGraph& g, const CacheConfig& c);
  void reset();

  // Runs one tile by itself: its K-steps in order, then its writes. A split-K slice adds into its
  // accumulator block (a read-modify-write at the cache); the last slice of an output block to
  // finish reads the sums, writes the output and zeroes the accumulator.
  TileResult run_tile(int tile);
  // Runs tiles side by side: step s of every tile, then step s+1, ...; a tile writes when its own
  // steps end. Results in the order given.
  std::vector<TileResult> run_concurrent(const std::vector<int>& tiles);

  // Lower-level, for schedulers that interleave tiles themselves (simulate() does).
  int num_steps(int tile) const;
  TileResult step(int tile, int step_index);  // reads of one K-step
  // Writes (+ split-K reduction). `slices`: the K slices of the tile's output block that this finish
  // stands for (a run of consecutive slices summed in registers, Schedule::units): one partial sum
  // for all; a run of every slice writes the output as an unsplit tile.
  TileResult finish(int tile, int slices = 1);

  // Writes back every dirty block (what happens eventually on a GPU); returns what it cost.
  TileResult flush();

  std::vector<ResidentBlock> resident() const;  // most recently used first
  int64_t resident_bytes() const;
  const BlockGrid& grid(int tensor) const { return grids_.at(tensor); }
  int64_t block_bytes(const BlockRef& b) const;  // line-rounded
  // Totals so far (dirty resident blocks are not counted until evicted or flushed).
  TrafficReport report() const;
  const CacheConfig& config() const { return cfg_; }
  const TileGraph& graph() const { return *g_; }

  // For searches that replay tiles on a compact cache state of their own (exact_search): the blocks
  // a tile touches, in the model's order. `reduces`: it is the last split-K slice of its block.
  struct Access {
    int64_t block;
    bool write;
  };
  std::vector<Access> tile_accesses(int tile, bool reduces) const;
  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  int64_t block_bytes(int64_t id) const { return blocks_.at(id).bytes; }
  int block_tensor(int64_t id) const { return blocks_[id].tensor; }
  BlockRef block_ref(int64_t id) const;
  // The block accesses of one K-step / of a tile's finish, appended to `out` (the partitioned
  // replay drives its own cache with these).
  void step_accesses(int tile, int s, std::vector<Access>& out) const;
  // whole: the finish of a run of every slice of the block (no accumulator traffic).
  void finish_accesses(int tile, bool reduces, std::vector<Access>& out, bool whole = false) const;

 private:
  struct Block {
    int tensor;
    int64_t bytes;
  };
  int64_t block_id(int tensor, int64_t br, int64_t bc) const;
  template <class F> void for_blocks(const Region& r, F&& f) const;
  // f(block id, is_write) for every block access of step s / of the tile's finish, in order.
  template <class F> void visit_step(int tile, int s, F&& f) const;
  template <class F> void visit_finish(int tile, bool reduces, F&& f, bool whole = false) const;
  void read_block(int64_t id, TileResult& res);
  void write_block(int64_t id, TileResult& res);
  void touch(int64_t id);
  void insert(int64_t id, TileResult& res);
  void unlink(int64_t id);
  int set_of(int64_t id) const;

  // Each read region of each tile as block-index ranges, so a K-step costs no divisions.
  struct ReadPlan {
    int64_t first_block;  // block id of the region's top-left block
    int64_t rows;         // block rows it spans
    int64_t row_stride;   // blocks per block row of the tensor
    int64_t cols;         // block columns it spans
    int64_t per_step;     // block columns per K-step
  };
  std::vector<ReadPlan> plans_;
  std::vector<int> plan_begin_;  // by tile, into plans_ (num_tiles + 1 entries)

  const TileGraph* g_;
  CacheConfig cfg_;
  std::vector<BlockGrid> grids_;
  std::vector<int64_t> first_block_;  // by tensor
  std::vector<Block> blocks_;
  // LRU lists, one per set: intrusive doubly linked over block ids; heads_[s] is a sentinel id.
  std::vector<int64_t> prev_, next_;
  std::vector<uint8_t> resident_, dirty_;
  std::vector<int64_t> used_;  // bytes per set
  int64_t set_capacity_ = 0;
  std::vector<int> arrivals_;  // split-K slices finished, by tile id of slice 0
  std::vector<TensorTraffic> per_tensor_;
  int64_t read_ = 0, write_ = 0, hit_ = 0, requested_ = 0;
};

// Replays `s` with CacheConfig::in_flight tiles in flight: tickets are taken in schedule order by
// free slots; every round each running tile whose dependencies are complete does one K-step; a
// tile that completes frees its slot. Ends with a flush. Validates the schedule first.
// With c.l2 == Partitioned it runs simulate_partitioned (model/l2_model.hpp) instead.
TrafficReport simulate(const TileGraph& g, const Schedule& s, const CacheConfig& c);

}  // namespace tw
