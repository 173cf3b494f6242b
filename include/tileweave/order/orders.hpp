// Named orders of a tile graph's tiles: grid orders of one op's output tiles (row/column-major,
// snake, CUTLASS swizzle, Triton grouped, Hilbert, Morton), chain orders that interleave a
// producer op with its consumers, and custom orders read from JSON. Every generated order is
// validated (a permutation that respects dependencies) before it is returned.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tileweave/graph/tile_graph.hpp"
#include "tileweave/order/schedule.hpp"

namespace tw {

struct Cell {
  int64_t tm = 0, tn = 0;
  bool operator==(const Cell& o) const { return tm == o.tm && tn == o.tn; }
};

// The cells of a grid_m x grid_n grid in the order named by `grid_spec`:
//   row_major | col_major | snake | hilbert | morton | swizzle:<W> | grouped:<G>
// swizzle:<W>  CUTLASS GemmIdentityThreadblockSwizzle<W>: bands of W tile columns, row by row in a band.
// grouped:<G>  Triton's GROUP_M = G: bands of G tile rows, column by column in a band.
// hilbert      generalized Hilbert curve, any rectangle (consecutive cells adjacent except at most
//              one diagonal step when both sides are odd).
std::vector<Cell> grid_order(const std::string& grid_spec, int64_t grid_m, int64_t grid_n);

// A schedule of the whole graph named by `spec`:
//   <grid spec>          ops one after another, each op's output cells in that grid order
//                        (for a chain: GEMM0 then GEMM1); split-K slices of a cell are consecutive.
//   <grid>+<grid>[+...]  ops one after another, one grid spec per op (e.g. grouped:16+hilbert).
//   dataflow[:<lag>]/<spec>  dataflow_order (schedule.hpp) of the order <spec>: every tile moved up to
//                        just after its producers (at least <lag> positions after them).
//   kslices/<spec>       <spec> with each op's split-K slices outermost (slice 0 of every output
//                        tile, then slice 1, ...): concurrent tiles then reduce into different
//                        accumulators. The ops come out one after another.
//   streamk:<U>/<spec>   each op's tiles in the order <spec> gives (its tiles must be consecutive
//                        there), cut into U tickets (Schedule::units) of about equal K work: with
//                        U = the SM count, every SM gets an equal share of the op whatever its
//                        tile count (stream-K). Split-K slices of one output block that a ticket
//                        holds one after another are one partial sum.
//   waves:<W>/<spec>     <spec> with the output blocks of each split-K op that fill whole waves of W
//                        tickets (all but the last blocks % W, by their earliest slice) each run as one
//                        ticket of all its K slices (Schedule::units; the executor sums them in
//                        registers, no partial sums), the last, partial wave's blocks slice by slice:
//                        the whole waves pay no split-K epilogue, the last wave is spread over the grid.
//                        Ops with fewer blocks than W keep every slice apart.
//   chain_rows:<k>       k row blocks of the first op (row-major), then every tile of later ops whose
//                        dependencies are now complete; repeat. k = 1 is "a GEMM0 row, then the
//                        matching GEMM1 row".
//   chain_half_rows      as chain_rows:1 but the first op's row block in two halves, each followed by
//                        the consumer tiles it completes (with split-K on GEMM1, the half rows feed
//                        the K-slices that read them).
// Unknown or malformed spec -> InvalidArgument naming it and listing the known names.
Schedule make_order(const TileGraph& g, const std::string& spec);

// Every named order that applies to `g` (chain orders only when g has more than one op).
std::vector<std::string> named_orders(const TileGraph& g);

struct OrderInfo {
  std::string spec, description;
  bool chain_only = false;
};
const std::vector<OrderInfo>& order_catalog();

// Custom orders as JSON: {"name": "...", "order": [...]} where every entry is a tile id (int) or
// [op, tm, tn] / [op, tm, tn, ks]. A bare array is accepted as the "order" list. An optional "units"
// list gives Schedule::units (ticket boundaries as positions).
// Malformed JSON, unknown tiles or a dependency violation -> InvalidArgument naming the first
// offending entry/tile.
Schedule schedule_from_json(const TileGraph& g, const std::string& json_text, const std::string& default_name = "custom");
Schedule load_order_file(const TileGraph& g, const std::string& path);
// {"name": ..., "order": [[op, tm, tn, ks], ...], "units": [...] if any} (readable by schedule_from_json).
std::string schedule_to_json(const TileGraph& g, const Schedule& s);

}  // namespace tw
