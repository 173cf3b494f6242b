// FfnOptions from a variant spec: key=value pairs joined by ',' (bench_ffn --variants, bench_sweep
// --also). Keys: mainloop, order, sync, bk, sg = split_gate_up, sd = split_down, bps = blocks_per_sm,
// ks = k_split_warps, ds = down_slices, pw = packed_weights (1), ov = overlap_previous (1),
// splits = model|rules, rows = tile_rows (pow2|fit|<n>), ww = whole_waves (0|1), tl = ticket_lead,
// sf = split_finisher (0|1); unset keys keep FfnOptions' defaults.
#pragma once

#include <sstream>
#include <string>

#include "tileweave/ops/ffn.hpp"

namespace tw::bench {

inline FfnOptions parse_ffn_variant(const std::string& spec) {
  FfnOptions o;
  std::stringstream ss(spec);
  for (std::string kv; std::getline(ss, kv, ',');) {
    const size_t eq = kv.find('=');
    if (kv.empty()) continue;
    if (eq == std::string::npos) throw InvalidArgument("variant '" + spec + "': '" + kv + "' is not key=value");
    const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    if (k == "mainloop") o.mainloop = v;
    else if (k == "order") o.order = v;
    else if (k == "sync") o.sync.policy = parse_sync_policy(v);
    else if (k == "bk") o.bk = std::stoi(v);
    else if (k == "sg") o.split_gate_up = std::stoi(v);
    else if (k == "sd") o.split_down = std::stoi(v);
    else if (k == "bps") o.blocks_per_sm = std::stoi(v);
    else if (k == "ks") o.k_split_warps = std::stoi(v);
    else if (k == "ds") o.down_slices = v;
    else if (k == "pw") o.packed_weights = v == "1";
    else if (k == "ov") o.overlap_previous = v == "1";
    else if (k == "splits") o.splits = v;
    else if (k == "rows") o.tile_rows = v;
    else if (k == "ww") o.whole_waves = v == "1";
    else if (k == "tl") o.ticket_lead = std::stoi(v);
    else if (k == "sf") o.split_finisher = v != "0";
    else
      throw InvalidArgument("variant '" + spec + "': unknown key '" + k +
                            "' (mainloop, order, sync, bk, sg, sd, bps, ks, ds, pw, ov, splits, rows, ww, tl, sf)");
  }
  return o;
}

}  // namespace tw::bench
