// The decode step as the benchmarks run it: a timed step's state, and the tile timelines they print and
// record (DecodeStepOptions::trace).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "tileweave/ops/decode_step.hpp"
#include "tileweave/runtime/device_plan.hpp"

namespace tw::bench {

// Random weights and caches; every sequence's cache holds kv_len - 1 tokens and the step appends the
// kv_len-th, the sequences inactive (their lengths do not advance), so every timed launch is the same step.
inline void prepare_timed_step(DecodeStep& st, int kv_len, uint64_t weight_seed, uint64_t cache_seed) {
  const int B = st.shape().batch;
  st.random_weights(weight_seed);
  st.fill_cache_random(cache_seed);
  st.set_lengths(std::vector<int>(B, kv_len - 1));
  st.set_active(std::vector<uint8_t>(B, 0));
  st.set_tokens(std::vector<int32_t>(B, 1));
}

// Per op of the last step (tile timelines; a tensor-parallel rank's step is several launches): when its first ticket was taken and its last tile done,
// the mean tile time from the consumers' start to the publication, the mean wait for producers, and
// the mean time from the math's end to the publication (the epilogue and the release);
// every tile of layers 0 and 1 (and the embedding), and of the LM head and the sample.
// Any traced executor launch: the plan and its graph (the DiT chain's too; its op names are not a step's,
// so every op is printed).
inline nlohmann::json op_timeline(const runtime::DevicePlan& plan, const tw::TileGraph& g) {
  const auto times = plan.read_trace();
  nlohmann::json ops = nlohmann::json::array(), tiles = nlohmann::json::array(), lm_tiles = nlohmann::json::array();
  std::printf("  %-24s %6s %9s %9s %9s %9s %9s\n", "op", "tiles", "first_us", "last_us", "tile_us", "wait_us", "epi_us");
  for (int op = 0; op < int(g.ops().size()); ++op) {
    const tw::Op& o = g.op(op);
    double first = 1e30, last = 0, busy = 0, wait = 0, epi = 0;
    int n = 0, nw = 0, ne = 0;
    for (int t = o.first_tile; t < o.first_tile + o.num_tiles; ++t) {
      const auto& x = times[t];
      if (x.taken < 0) continue;
      first = std::min(first, x.taken);
      last = std::max(last, x.done);
      if (x.started >= 0 && x.done >= 0) busy += x.done - x.started, ++n;
      if (x.ready >= 0) wait += x.ready - x.taken, ++nw;
      if (x.computed >= 0 && x.done >= 0) epi += x.done - x.computed, ++ne;  // the epilogue and the release
    }
    const bool early = o.name.rfind("layers.0.", 0) == 0 || o.name.rfind("layers.1.", 0) == 0 || o.name == "embed";
    if (early || o.name == "lm_head" || o.name == "sample")
      for (int t = o.first_tile; t < o.first_tile + o.num_tiles; ++t) {
        const auto& x = times[t];
        (early ? tiles : lm_tiles).push_back({t, op, x.sm, x.taken, x.ready, x.started, x.computed, x.done, x.mark1, x.mark2});
      }
    ops.push_back({{"op", o.name}, {"tiles", o.num_tiles}, {"first_us", first}, {"last_us", last},
                   {"tile_us", n ? busy / n : 0.0}, {"wait_us", nw ? wait / nw : 0.0}, {"epilogue_us", ne ? epi / ne : 0.0}});
    if (n == 0) continue;  // a collective (tensor parallelism): run on the stream between launches
    const bool show = o.name.rfind("layers.", 0) != 0 || o.name.rfind("layers.0.", 0) == 0 || o.name.rfind("layers.1.", 0) == 0;
    if (show)
      std::printf("  %-24s %6d %9.1f %9.1f %9.2f %9.2f %9.2f\n", o.name.c_str(), o.num_tiles, first, last, n ? busy / n : 0.0,
                  nw ? wait / nw : 0.0, ne ? epi / ne : 0.0);
  }
  const nlohmann::json columns = {"tile", "op", "sm", "taken", "ready", "started", "computed", "done", "mark1", "mark2"};
  return {{"ops", ops},
          {"tiles_layers_0_1", {{"columns", columns}, {"rows", tiles}}},
          {"tiles_lm_head", {{"columns", columns}, {"rows", lm_tiles}}}};
}
inline nlohmann::json op_timeline(const tw::DecodeStep& st) { return op_timeline(st.plan(), st.graph().graph); }

}  // namespace tw::bench
