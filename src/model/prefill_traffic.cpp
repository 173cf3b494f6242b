// Prefill attention's DRAM traffic for an order of its items: see model/prefill_traffic.hpp.
#include "tileweave/model/prefill_traffic.hpp"

#include <algorithm>
#include <functional>
#include <cstdint>
#include <list>
#include <queue>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tw {

const char* to_string(PrefillOrder o) { return o == PrefillOrder::Heads ? "heads" : "tiles"; }

PrefillOrder prefill_order_from_string(const std::string& s) {
  if (s == "heads") return PrefillOrder::Heads;
  if (s == "tiles") return PrefillOrder::Tiles;
  throw InvalidArgument("prefill order '" + s + "' is not heads or tiles");
}

namespace {

// LRU over K/V tiles named by 64-bit keys, `capacity` of them.
class TileLru {
 public:
  explicit TileLru(int64_t capacity) : capacity_(capacity) {}
  // True on a hit; the tile becomes the most recent either way.
  bool touch(uint64_t key) {
    const auto it = where_.find(key);
    if (it != where_.end()) {
      order_.splice(order_.begin(), order_, it->second);
      return true;
    }
    if (capacity_ <= 0) return false;
    if (int64_t(order_.size()) == capacity_) {
      where_.erase(order_.back());
      order_.pop_back();
    }
    order_.push_front(key);
    where_[key] = order_.begin();
    return false;
  }

 private:
  int64_t capacity_;
  std::list<uint64_t> order_;
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> where_;
};

}  // namespace

PrefillTimeModel prefill_time_model(const PrefillAttentionShape& s) {
  // bench/fit_prefill_time.py on bench/results/h200/dit_attention.json and dit_attention_fp8.json.
  PrefillTimeModel m;
  if (s.fp8)
    m.us_per_key_row = 0.009500, m.us_per_item = 10.430;
  else if (s.head_dim == 64)
    m.us_per_key_row = 0.013639, m.us_per_item = 0.0;
  else if (s.head_dim == 256)  // the whole-item runs of bench/results/h200/dit_attention_d256.json (4 cases)
    m.us_per_key_row = 0.026781, m.us_per_item = 0.997;
  else
    m.us_per_key_row = 0.014037, m.us_per_item = 2.979;
  return m;
}

PrefillPieceCosts prefill_piece_costs(const PrefillAttentionShape& s, int block_n) {
  const PrefillTimeModel m = prefill_time_model(s);
  const double tile_us = m.us_per_key_row * std::max(block_n, 1);
  return {std::max(m.us_per_item, 2.0) / tile_us, 3.4 / tile_us};
}

double predict_prefill_us(const PrefillAttentionShape& s, const std::vector<int>& cu_q, const std::vector<int>& cu_k_in,
                          int sms, const PrefillTimeModel& m) {
  validate_prefill_attention(s, cu_q, cu_k_in);
  if (sms < 1) throw InvalidArgument("prefill time: sms must be >= 1, got " + std::to_string(sms));
  const std::vector<int>& cu_k = cu_k_in.empty() ? cu_q : cu_k_in;
  const int block_n = prefill_block_n(s), block_m = prefill_block_m(s, cu_q, sms);
  const std::vector<PrefillTile> tiles = plan_prefill_tiles(s, cu_q, cu_k, block_n, block_m);
  if (tiles.empty()) return 0.0;
  // The kernel's draws (plan_prefill_work): the whole items head by head, the plan's tiles (longest
  // first) within a head, then the tail's units, each the sum of its pieces (a split piece also pays
  // its partial's round trip and merge share).
  const PrefillPieceCosts pc = prefill_piece_costs(s, block_n);
  const PrefillWork w = plan_prefill_work(tiles, s.num_q_heads, sms, s.split_tail && s.mainloop != "sm80", pc);
  const double tile_us = m.us_per_key_row * block_n;
  std::vector<double> draws;
  for (int64_t i = 0; i < w.whole; ++i) draws.push_back(m.us_per_item + tile_us * tiles[size_t(i % int64_t(tiles.size()))].kv_tiles);
  for (int u = 0; u < w.units(); ++u) {
    double c = 0;
    for (int k = w.unit_offsets[size_t(u)]; k < w.unit_offsets[size_t(u) + 1]; ++k) {
      const PrefillPiece& p = w.pieces[size_t(k)];
      c += m.us_per_item + tile_us * p.kv_tiles + (p.group >= 0 ? pc.split * tile_us : 0.0);
    }
    draws.push_back(c);
  }
  return prefill_draws_end(draws, sms) + m.launch_us;
}

PrefillTraffic predict_prefill_traffic(const PrefillAttentionShape& s, const std::vector<int>& cu_q,
                                       const std::vector<int>& cu_k_in, PrefillOrder order, int sms,
                                       int64_t l2_bytes, double kv_copies) {
  validate_prefill_attention(s, cu_q, cu_k_in);
  if (sms < 1) throw InvalidArgument("prefill traffic: sms must be >= 1, got " + std::to_string(sms));
  if (!(kv_copies >= 1.0)) throw InvalidArgument("prefill traffic: kv_copies must be >= 1");
  const std::vector<int>& cu_k = cu_k_in.empty() ? cu_q : cu_k_in;
  PrefillTraffic t;
  t.block_n = prefill_block_n(s);
  t.block_m = prefill_block_m(s, cu_q, sms);
  const std::vector<PrefillTile> tiles = plan_prefill_tiles(s, cu_q, cu_k, t.block_n, t.block_m);
  const int heads = s.num_q_heads, group = s.num_q_heads / s.num_kv_heads;
  const double elem = s.fp8 ? 1.0 : 2.0, row = double(s.head_dim) * elem;
  const double kv_tile_bytes = 2.0 * t.block_n * row;  // K and V
  t.items = int64_t(tiles.size()) * heads;
  for (size_t b = 0; b + 1 < cu_q.size(); ++b) {
    t.q_bytes += double(cu_q[b + 1] - cu_q[b]) * heads * row;
    t.kv_bytes += 2.0 * double(cu_k[b + 1] - cu_k[b]) * s.num_kv_heads * row;
  }
  t.out_bytes = double(cu_q.back()) * heads * s.head_dim * 2.0;  // bf16 out

  auto item = [&](int64_t w) -> std::pair<const PrefillTile*, int> {  // (tile, head)
    const int64_t nt = int64_t(tiles.size());
    return order == PrefillOrder::Heads ? std::make_pair(&tiles[size_t(w % nt)], int(w / nt))
                                        : std::make_pair(&tiles[size_t(w / heads)], int(w % heads));
  };
  // A K/V tile: (sequence, kv head, key tile), packed into 64 bits.
  auto key = [&](int seq, int kv_head, int j) {
    return (uint64_t(uint32_t(seq)) << 40) ^ (uint64_t(uint32_t(kv_head)) << 24) ^ uint64_t(uint32_t(j));
  };
  TileLru l2(int64_t(double(l2_bytes) / kv_copies / kv_tile_bytes));
  struct Worker {
    int64_t time = 0;
    int id = 0;
    const PrefillTile* tile = nullptr;
    int kv_head = 0, j = 0;
  };
  auto later = [](const Worker& a, const Worker& b) { return a.time != b.time ? a.time > b.time : a.id > b.id; };
  std::priority_queue<Worker, std::vector<Worker>, decltype(later)> ready(later);
  int64_t next = 0;
  // Hands the worker the next item that reads a K/V tile (an item whose rows see no key is taken and
  // done at once, as the kernel's producer does); false when none is left.
  auto take = [&](Worker& w) {
    while (next < t.items) {
      const auto [tile, head] = item(next++);
      if (tile->kv_tiles == 0) continue;
      w.tile = tile;
      w.kv_head = head / group;
      w.j = 0;
      return true;
    }
    return false;
  };
  for (int i = 0; i < sms; ++i) {
    Worker w;
    w.id = i;
    if (!take(w)) break;
    ready.push(w);
  }
  while (!ready.empty()) {
    Worker w = ready.top();
    ready.pop();
    ++t.kv_tile_reads;
    if (!l2.touch(key(w.tile->seq, w.kv_head, w.j))) {
      // The sequence's last tile is partly past its keys: only its keys move.
      const int len_k = cu_k[w.tile->seq + 1] - cu_k[w.tile->seq];
      ++t.kv_tile_misses;
      t.kv_read_bytes += 2.0 * std::min<int64_t>(t.block_n, int64_t(len_k) - int64_t(w.j) * t.block_n) * row;
    }
    ++w.time;
    if (++w.j == w.tile->kv_tiles && !take(w)) continue;
    ready.push(w);
  }
  return t;
}

}  // namespace tw
