// DRAM traffic of prefill attention (ops/prefill_attention.hpp) for an order of its work items, on
// the host (issue 20 item 3: the order of (sequence, head, query tile) work from the traffic model).
//
// Every item (one query tile of one head) reads its Q tile once and then every K/V tile its rows
// see, in key order. K/V tiles are what items share: all query tiles of a head (and the heads of a
// GQA group) read the same ones, so the DRAM bytes depend on which items run side by side and
// whether the K/V they share is still in L2. The replay:
//  - `sms` persistent workers take items in the order's sequence, each from a queue as it frees up
//    (the kernel's work counter), and advance one K/V tile per step, all at one rate (a K/V tile
//    is the same work for every item; the causal diagonal is not modelled as cheaper);
//  - L2 holds K/V tiles with LRU over l2_bytes / kv_copies: both halves of Hopper's L2 hold a copy
//    of a line that SMs on both sides read (docs/model.md, "The partitioned L2"), and every K/V
//    tile is read from both sides when more than one SM reads it; Q is read once (evict-first in
//    the kernel) and not cached; the output is written once.
// No CUDA here: the CLI (`tileweave plan prefill`) prints it for the kernel's order and the others,
// with the time model below.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tileweave/graph/prefill_attention_graph.hpp"

namespace tw {

// Orders of the work items w = 0 .. tiles x heads - 1 (the plan's tiles, longest first):
//   heads: all query tiles of head 0, then head 1, ... (the kernel's: item w is tile w % tiles of
//          head w / tiles);
//   tiles: all heads of tile 0, then tile 1, ... (the heads of one query tile side by side).
enum class PrefillOrder { Heads, Tiles };
const char* to_string(PrefillOrder o);
PrefillOrder prefill_order_from_string(const std::string& s);  // InvalidArgument naming it

struct PrefillTraffic {
  int block_m = 0, block_n = 0;  // the op's query rows per item and keys per K/V tile
  int64_t items = 0;             // work items (tiles x query heads)
  int64_t kv_tile_reads = 0;     // K/V tiles read by all items
  int64_t kv_tile_misses = 0;    // of those, from DRAM
  double q_bytes = 0;            // Q, read once
  double kv_bytes = 0;           // K and V, each once (the compulsory part)
  double kv_read_bytes = 0;      // K and V from DRAM, as replayed
  double out_bytes = 0;          // the output, written once
  double read_bytes() const { return q_bytes + kv_read_bytes; }
  double compulsory_read_bytes() const { return q_bytes + kv_bytes; }
};

// The op's time: every item takes us_per_item + us_per_key_row x (the key rows it reads: its K/V
// tiles x keys per tile), the items run on `sms` SMs that take them in the kernel's order from its
// counter (list scheduling), plus a launch. Fitted per configuration on the H200 by
// bench/fit_prefill_time.py (bench/results/h200/dit_attention*.json: bf16 and fp8, H 8-48, L
// 1024-32760, fitted on the non-causal cases, the causal ones predicted): every case within 8%, most
// within 4%. The fixed cost per item says where an item's time goes besides its keys: 3.0 us at bf16
// d = 128, 10.4 us at fp8 (its scale loads and divides at the item's ends, and the first S GEMM
// with nothing to overlap at e4m3 rates), 0 at d = 64.
struct PrefillTimeModel {
  double us_per_key_row = 0, us_per_item = 0, launch_us = 3.0;
};
PrefillTimeModel prefill_time_model(const PrefillAttentionShape& s);  // the H200 fit for the configuration
// The costs plan_prefill_work weighs a tail with, in the configuration's key tiles (block_n keys at
// us_per_key_row): a piece's fixed cost, the fit's us_per_item but at least 2 us (Q's load and the
// epilogue are never free; the d = 64 fit reads 0), and a split piece's partial and merge, 3.4 us
// (1.5 key tiles at bf16 d = 128, where the tail's A/B runs put it, 2026-11-29).
PrefillPieceCosts prefill_piece_costs(const PrefillAttentionShape& s, int block_n);
double predict_prefill_us(const PrefillAttentionShape& s, const std::vector<int>& cu_seqlens_q,
                          const std::vector<int>& cu_seqlens_k, int sms, const PrefillTimeModel& m);

// The replay above for the op's plan of the shape (prefill_block_n / prefill_block_m on `sms` SMs;
// fp8: one byte an element). Validates the shape and offsets as the op does. kv_copies >= 1.
PrefillTraffic predict_prefill_traffic(const PrefillAttentionShape& s, const std::vector<int>& cu_seqlens_q,
                                       const std::vector<int>& cu_seqlens_k, PrefillOrder order, int sms,
                                       int64_t l2_bytes, double kv_copies = 2.0);

}  // namespace tw
