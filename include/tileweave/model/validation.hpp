// Issue 17's validation grid on the host: the cases bench/bench_model_vs_ncu.cu runs on the GPU
// (fused FFN and plain GEMM on the tile executor's sm90 body, two shapes each, M in
// {256, ..., 4096}, six orders), their tile graphs and schedules rebuilt without CUDA, and the
// model's columns (simple and partitioned L2, predicted time) computed by ONE function that the
// bench and `tileweave validate` share. The bench checks that the graphs rebuilt here are the ones
// the executor runs (validation_graphs_match).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "tileweave/graph/tile_graph.hpp"
#include "tileweave/model/cache_model.hpp"
#include "tileweave/model/presets.hpp"
#include "tileweave/model/time_model.hpp"
#include "tileweave/order/schedule.hpp"

namespace tw {

struct ValidationShape {
  std::string op, name;  // op: "ffn" | "gemm"
  int64_t d = 0, f = 0;  // ffn: hidden, intermediate; gemm: N = f, K = d
};
// llama3-8b / qwen2-7b FFN, 8b-gate-up (4096 -> 28672) and 8b-down (14336 -> 4096) GEMM.
const std::vector<ValidationShape>& validation_shapes();
// "row_major", "col_major", "grouped:8", "hilbert", "kslices/col_major", "search".
const std::vector<std::string>& validation_orders();
const ValidationShape& find_validation_shape(const std::string& name);  // InvalidArgument if unknown

// The executor's tiling rules for the sm90 tile body, as host code: src/ops/ffn.cu and decode_gemm.cu
// run these functions, and the planner and the validation grid score them. `sms`: the SM count the
// tail slices and the splits are sized for.
// The sm90 FFN's down split: split_down when given, else 1 (no K split) when the down GEMM's output
// tiles keep at least 3/4 of the SMs busy, else 0 (slices of ~512 KiB x M/128 of weights).
// Measured on the H200 (bench/results/h200/ffn_split_down.json, 2026-11-24), unsplit against the
// slices: 8B M = 512 (64 tiles) 367.7 against 304.2 us; M = 1024 / 2048 / 4096 (128 / 256 / 512
// tiles) 516.6 / 1057.6 / 2091.1 against 545.6 / 1081.6 / 2180.9; 70B M = 512-4096 (128 tiles and
// up) 2.5-17% faster unsplit.
int ffn_down_split(const FfnShape& s, int split_down, int sms, int rows = 0);
// K slices for an op of the sm90 body (n_rows weight rows) whose tiles, in slices of ~target_kib of
// weights, would leave over half the SMs idle: enough to give 3/4 of them a tile (each slice at least
// two stages, at most kMaxSlices); 0 when the size rule already does. Shapes no model table names
// need it: a plain MLP with F = 2432 at M = 256 has 19 first-GEMM tiles, which streamed its weights
// on 19 SMs at 0.33x cuBLASLt. Measured on the sweep (H200, seed 16, against the build before):
// ops of 19-65 tiles gained (0.33 -> 0.49x, 0.39 -> 0.74x, 0.78 -> 1.09x, ...), ops of 70-90 tiles
// split in two lost to the reduction (1.05 -> 0.90x at 70): hence the half.
int fill_split(int64_t m, int64_t n_rows, int64_t k, int64_t target_kib, int sms, int rows = 0);
// `rows` (in every rule here): the tile's activation rows; 0 = fit_act_rows(m), the default heights.
Tiling sm90_op_tiling(int64_t m, int64_t n, int64_t k, int64_t target_kib, int split, const std::string& slices, int sms,
                      int rows = 0);
// The tile height a tile_rows option names (FfnOptions / DecodeGemmOptions::tile_rows): "fit" (the
// default; fit_act_rows: multiples of 32 above 64 rows, sized to M), "pow2" (act_rows_for: 8, 16,
// ..., 256), or a number the body runs (is_tile_rows). InvalidArgument naming anything else.
int sm90_tile_rows(int64_t m, const std::string& tile_rows);
// FusedFfn's tiling on sm90 (src/ops/ffn.cu runs it; the defaults are FfnOptions'): gate/up in ~4 MiB
// slices, down in ~512 KiB x rows/128 with "tail:1" slices, either split further when its tiles would
// not fill 3/4 of the SMs (fill_split); split_gate_up / split_down > 0 and down_slices as
// FfnOptions::split_gate_up / split_down / down_slices.
FfnTiling sm90_ffn_tiling(const FfnShape& s, int sms, int split_gate_up = 0, int split_down = 0,
                          const std::string& down_slices = "tail:1", int rows = 0);
// Stream-K (FfnOptions::order "streamk"): each op in even K slices, fine enough that cutting it into
// `sms` tickets of equal K work (Schedule::units) leaves every ticket within a slice of its share --
// a slice about 1/8 of a ticket's share, at least 2 stages, at most the body's 64 slices. A ticket's
// consecutive slices of one output tile are one partial sum in the body, so fine slices cost no
// reductions of their own.
int stream_k_split(int64_t m, int64_t n_rows, int64_t k, int sms, int rows = 0);
FfnTiling sm90_ffn_stream_k_tiling(const FfnShape& s, int sms, int rows = 0);
// FusedFfn's order names as make_order specs: "op_by_op_column" / "op_by_op" are col_major /
// row_major, "streamk" is streamk:<grid>/row_major; any other spec is itself.
std::string ffn_order_spec(const std::string& order, int grid);
bool is_stream_k_order(const std::string& order);  // "streamk" or "streamk:<U>/..."

// DecodeGemm's options (the defaults are DecodeGemmOptions'): Y[m, n] = X[m, k] W[n, k]^T, split to
// one wave of `sms` tiles; split_k > 0 and k_slices as DecodeGemmOptions::split_k / k_slices.
TileGraph decode_gemm_graph(int64_t m, int64_t n, int64_t k, int sms, int split_k = 0, const std::string& k_slices = "even",
                            int rows = 0);

// One case of the grid: the graph the executor runs, a schedule of it, the grid (tiles in flight).
struct ValidationCase {
  ValidationShape shape;
  int64_t m = 0;
  TileGraph graph;
  Schedule schedule;
  int grid = 0;
};
// `spec`: a make_order spec as the ops take it ("op_by_op"/"op_by_op_column" and FusedFfn's plain
// "dataflow" included). The search's orders are specs too (the bench records their names).
ValidationCase make_validation_case(const ValidationShape& shape, int64_t m, const std::string& spec, int sms = 132);

// True iff the two graphs have the same tensors, ops, tilings and tiles (regions, K ranges and
// dependencies); else false with the first difference in *why.
bool validation_graphs_match(const TileGraph& a, const TileGraph& b, std::string* why = nullptr);

// The model's columns of one case.
struct ValidationModel {
  TrafficReport simple;       // the simple LRU model
  TrafficReport partitioned;  // the partitioned L2 model (preset.l2)
  TimePrediction time;        // from the partitioned model's bytes (the simple one's with time_from_simple)
};
// The cache the model runs for a launch of `grid` tiles in flight on `preset`: preset.l2_bytes,
// sectors of 32 B, the simple LRU model or the partitioned one (preset.l2).
CacheConfig validation_cache_config(const GpuPreset& preset, int grid, bool partitioned);
// Both caches of validation_cache_config.
ValidationModel model_validation_case(const TileGraph& g, const Schedule& s, int grid, const GpuPreset& preset,
                                      bool time_from_simple = false);

// A tile timeline the executor recorded for one case of the grid, as `tileweave validate --timelines`
// replays it: the FFN's (bench_ffn --trace, benchmark "ffn_trace") or the plain GEMM's
// (bench_model_vs_ncu --trace-dir, benchmark "gemm_trace"). Both benches write one format
// (bench/tile_trace.cuh): per tile its id, coordinates (op, tm, tn, ks), SM and times; the header
// names the case.
struct RecordedTimeline {
  std::string file;
  std::string op;               // "ffn" | "gemm", as ValidationShape::op
  int64_t d = 0, f = 0, m = 0;  // as ValidationShape: ffn hidden / intermediate; gemm K / N
  std::string order;            // the schedule's spec (the bench's "schedule" column)
  std::vector<TileSpan> spans;  // by tile id: the SM, [ready, computed), done
  std::vector<std::array<int64_t, 4>> coords;  // by tile id: op, tm, tn, ks; -1 where a tile is missing
};
// Every timeline file (*.json of benchmark ffn_trace or gemm_trace) in `dir`; other JSON files and
// plain (ungated) FFNs, which the grid has none of, are left out. InvalidArgument naming the folder
// or the file when it is missing or malformed.
std::vector<RecordedTimeline> load_recorded_timelines(const std::string& dir);
// The timeline recorded for a case (op, shape, M and order spec), or nullptr.
const RecordedTimeline* find_recorded_timeline(const std::vector<RecordedTimeline>& timelines, const ValidationShape& shape,
                                               int64_t m, const std::string& order);
// The partitioned model's replay of a case with its recorded timeline in place of drawn drift
// (`cache` with l2 = Partitioned, e.g. validation_cache_config(preset, c.grid, true)). The recorded
// tiles must be the case's graph, tile by tile (the host rebuilds the executor's graph; a timeline of
// another tiling would replay nonsense): InvalidArgument naming the file and the first tile that differs.
TrafficReport replay_recorded_timeline(const ValidationCase& c, const RecordedTimeline& t, CacheConfig cache);

}  // namespace tw
