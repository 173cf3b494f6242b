#include "tileweave/model/validation.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "tileweave/kernels/sm90/tile_shape.hpp"
#include "tileweave/order/orders.hpp"

namespace tw {

const std::vector<ValidationShape>& validation_shapes() {
  static const std::vector<ValidationShape> v = {
      {"ffn", "llama3-8b", 4096, 14336},
      {"ffn", "qwen2-7b", 3584, 18944},
      {"gemm", "8b-gate-up", 4096, 28672},
      {"gemm", "8b-down", 14336, 4096},
  };
  return v;
}

const std::vector<std::string>& validation_orders() {
  static const std::vector<std::string> v = {"row_major", "col_major", "grouped:8", "hilbert", "kslices/col_major", "search"};
  return v;
}

const ValidationShape& find_validation_shape(const std::string& name) {
  for (const ValidationShape& s : validation_shapes())
    if (s.name == name) return s;
  std::string known;
  for (const ValidationShape& s : validation_shapes()) known += (known.empty() ? "" : ", ") + s.name;
  throw InvalidArgument("unknown validation shape '" + name + "' (known: " + known + ")");
}

namespace {
// Slices are whole `step`s; the count recomputed so that no slice is empty (src/ops/ffn.cu).
int normalise_split(int64_t k, int split, int64_t step) {
  const int64_t slice = ((k + split - 1) / split + step - 1) / step * step;
  return static_cast<int>((k + slice - 1) / slice);
}
constexpr int kMaxSlices = 64;  // the sm90 body's slice table (src/ops/ffn_sm90.hpp)
// K slices of ~target_kib KiB of a 128-row tile's weights.
int64_t slices_by_size(int64_t k, int64_t target_kib) {
  const int64_t target = (target_kib << 10) / (2 * sm90::kTileRows);  // K columns
  return std::max<int64_t>(1, (k + target / 2) / target);
}
}  // namespace

int sm90_tile_rows(int64_t m, const std::string& tile_rows) {
  if (tile_rows == "pow2") return sm90::act_rows_for(m);
  if (tile_rows == "fit") return sm90::fit_act_rows(m);
  char* end = nullptr;
  const long v = std::strtol(tile_rows.c_str(), &end, 10);
  if (tile_rows.empty() || *end != '\0' || v < 0 || v > sm90::kMaxActRows || !sm90::is_tile_rows(int(v)))
    throw InvalidArgument("sm90 tiles: tile_rows must be 'pow2', 'fit' or a height the body runs (8, 16, 32, 64, or a "
                          "multiple of 32 from 96 to 256), got '" + tile_rows + "'");
  return int(v);
}

namespace {
int rows_for(int64_t m, int rows) { return rows ? rows : sm90::fit_act_rows(m); }
}  // namespace

Tiling sm90_op_tiling(int64_t m, int64_t n, int64_t k, int64_t target_kib, int split, const std::string& slices, int sms,
                      int tile_rows) {
  int levels = -1;
  if (slices == "even") levels = 0;
  if (slices.rfind("tail:", 0) == 0 && slices.size() == 6 && slices[5] >= '0' && slices[5] <= '4') levels = slices[5] - '0';
  if (levels < 0) throw InvalidArgument("sm90 tiles: K slices must be 'even' or 'tail:<0..4>', got '" + slices + "'");
  if (split < 0) throw InvalidArgument("sm90 tiles: split must be >= 0, got " + std::to_string(split));
  if (split == 0 && target_kib <= 0) throw InvalidArgument("sm90 tiles: a split or a slice size is needed");
  if (tile_rows && !sm90::is_tile_rows(tile_rows))
    throw InvalidArgument("sm90 tiles: no tile of " + std::to_string(tile_rows) + " activation rows");
  const int rows = rows_for(m, tile_rows), step = sm90::stage_cols_for(rows);
  Tiling t{rows, sm90::kTileRows, step,
           normalise_split(k, split ? split : static_cast<int>(slices_by_size(k, target_kib)), step), {}};
  if (levels > 0) {
    const int64_t tiles_per_slice = ((m + rows - 1) / rows) * ((n + sm90::kTileRows - 1) / sm90::kTileRows);
    t.k_cuts = tail_k_cuts(k, step, (k + t.split_k - 1) / t.split_k, tiles_per_slice, sms, levels);
    t.split_k = static_cast<int64_t>(t.k_cuts.size()) + 1;
  }
  if (t.split_k > kMaxSlices)
    throw InvalidArgument("sm90 tiles: " + std::to_string(t.split_k) + " K slices in one op; the tile body takes at most " +
                          std::to_string(kMaxSlices));
  if (k / step > INT16_MAX)  // the slice table holds int16 stage numbers (src/ops/ffn_sm90.hpp)
    throw InvalidArgument("sm90 tiles: K = " + std::to_string(k) + " is too long for the tile body's slice table");
  return t;
}

int fill_split(int64_t m, int64_t n_rows, int64_t k, int64_t target_kib, int sms, int tile_rows) {
  const int64_t rows = rows_for(m, tile_rows), step = sm90::stage_cols_for(int(rows));
  const int64_t tiles = ((m + rows - 1) / rows) * ((n_rows + sm90::kTileRows - 1) / sm90::kTileRows);
  if (2 * tiles >= sms) return 0;
  const int64_t by_size = slices_by_size(k, target_kib);
  const int64_t to_fill = (int64_t(3) * sms + 4 * tiles - 1) / (4 * tiles);
  const int64_t most = std::min<int64_t>(std::max<int64_t>(1, (k + step - 1) / step / 2), kMaxSlices);
  return by_size >= to_fill ? 0 : int(std::min(to_fill, most));
}

FfnTiling sm90_ffn_tiling(const FfnShape& s, int sms, int split_gate_up, int split_down, const std::string& down_slices,
                          int tile_rows) {
  const int rows = rows_for(s.m, tile_rows);
  const int64_t n1 = s.gated ? 2 * s.f : s.f, down_kib = int64_t(512) * std::max(1, rows / 128);
  FfnTiling t;
  t.gate_up = sm90_op_tiling(s.m, n1, s.d, 4096,
                             split_gate_up ? split_gate_up : fill_split(s.m, n1, s.d, 4096, sms, rows), "even", sms, rows);
  if (s.gated) t.gate_up.bn = sm90::kTileRows / 2;
  int down = ffn_down_split(s, split_down, sms, rows);
  if (down == 0) down = fill_split(s.m, s.d, s.f, down_kib, sms, rows);
  t.down = sm90_op_tiling(s.m, s.d, s.f, down_kib, down, down_slices, sms, rows);
  return t;
}

int stream_k_split(int64_t m, int64_t n_rows, int64_t k, int sms, int tile_rows) {
  const int64_t rows = rows_for(m, tile_rows), step = sm90::stage_cols_for(int(rows));
  const int64_t tiles = ((m + rows - 1) / rows) * ((n_rows + sm90::kTileRows - 1) / sm90::kTileRows);
  const int64_t stages = (k + step - 1) / step;
  const double share = double(tiles) * double(stages) / std::max(sms, 1);  // stages per ticket
  const double slice = std::max(2.0, share / 8);
  const int64_t split = int64_t(std::ceil(double(stages) / slice));
  return int(std::clamp<int64_t>(split, 1, std::min<int64_t>(kMaxSlices, stages)));
}

FfnTiling sm90_ffn_stream_k_tiling(const FfnShape& s, int sms, int rows) {
  const int64_t n1 = s.gated ? 2 * s.f : s.f;
  FfnTiling t;
  t.gate_up = sm90_op_tiling(s.m, n1, s.d, 0, stream_k_split(s.m, n1, s.d, sms, rows), "even", sms, rows);
  if (s.gated) t.gate_up.bn = sm90::kTileRows / 2;
  t.down = sm90_op_tiling(s.m, s.d, s.f, 0, stream_k_split(s.m, s.d, s.f, sms, rows), "even", sms, rows);
  return t;
}

bool is_stream_k_order(const std::string& order) { return order == "streamk" || order.rfind("streamk:", 0) == 0; }

std::string ffn_order_spec(const std::string& order, int grid) {
  if (order == "op_by_op_column") return "col_major";
  if (order == "op_by_op") return "row_major";
  // Row-major output tiles: with M over several tile rows, ticket u and ticket u + grid / rows then
  // stream the same weight rows over the same K at the same time (one DRAM read, the other an L2
  // hit), where column-major tickets would reach a weight tile's rows at different K offsets.
  if (order == "streamk") return "streamk:" + std::to_string(grid) + "/row_major";
  return order;
}

int ffn_down_split(const FfnShape& s, int split_down, int sms, int tile_rows) {
  if (split_down) return split_down;
  const int64_t rows = rows_for(s.m, tile_rows);
  const int64_t out_tiles = ((s.m + rows - 1) / rows) * ((s.d + sm90::kTileRows - 1) / sm90::kTileRows);
  return out_tiles * 4 >= int64_t(3) * sms ? 1 : 0;
}

TileGraph decode_gemm_graph(int64_t m, int64_t n, int64_t k, int sms, int split_k, const std::string& k_slices,
                            int tile_rows) {
  const int64_t rows = rows_for(m, tile_rows), step = sm90::stage_cols_for(int(rows));
  const int64_t out_tiles = ((m + rows - 1) / rows) * ((n + sm90::kTileRows - 1) / sm90::kTileRows);
  const int64_t stages = (k + step - 1) / step;
  const int split = split_k ? split_k : int(std::clamp<int64_t>(sms / out_tiles, 1, std::min<int64_t>(stages, kMaxSlices)));
  const Tiling t = sm90_op_tiling(m, n, k, 0, split, k_slices, sms, int(rows));
  TileGraph g;
  const int x = g.add_tensor("x", m, k, 2, TensorRole::Input);
  const int w = g.add_tensor("w", n, k, 2, TensorRole::Weight);
  const int y = g.add_tensor("y", m, n, 2, TensorRole::Output);
  g.add_gemm("gemm", x, w, y, t);
  return g;
}

ValidationCase make_validation_case(const ValidationShape& shape, int64_t m, const std::string& spec, int sms) {
  ValidationCase c;
  c.shape = shape;
  c.m = m;
  c.grid = sms;  // one CTA per SM: the sm90 body takes over half an SM's shared memory
  if (shape.op == "ffn") {
    const FfnShape fs{m, shape.d, shape.f, true};
    c.graph = build_ffn_graph(fs, is_stream_k_order(spec) ? sm90_ffn_stream_k_tiling(fs, sms) : sm90_ffn_tiling(fs, sms)).graph;
    // As FusedFfn takes FfnOptions::order.
    if (spec == "dataflow")
      c.schedule = dataflow_order(c.graph, make_order(c.graph, "col_major"), c.grid);
    else
      c.schedule = make_order(c.graph, ffn_order_spec(spec, sms));
  } else if (shape.op == "gemm") {
    c.graph = decode_gemm_graph(m, shape.f, shape.d, sms);
    c.schedule = make_order(c.graph, spec);
  } else {
    throw InvalidArgument("validation case: op must be ffn or gemm, got '" + shape.op + "'");
  }
  return c;
}

bool validation_graphs_match(const TileGraph& a, const TileGraph& b, std::string* why) {
  auto fail = [&](const std::string& w) {
    if (why) *why = w;
    return false;
  };
  if (a.tensors().size() != b.tensors().size()) return fail("tensor count");
  for (size_t i = 0; i < a.tensors().size(); ++i) {
    const Tensor &x = a.tensors()[i], &y = b.tensors()[i];
    if (x.rows != y.rows || x.cols != y.cols || x.elem_bytes != y.elem_bytes || x.role != y.role)
      return fail("tensor " + x.name);
  }
  if (a.ops().size() != b.ops().size()) return fail("op count");
  for (size_t i = 0; i < a.ops().size(); ++i) {
    const Op &x = a.ops()[i], &y = b.ops()[i];
    if (x.kind != y.kind || x.m != y.m || x.n != y.n || x.k != y.k || x.tiling.bm != y.tiling.bm ||
        x.tiling.bn != y.tiling.bn || x.tiling.bk != y.tiling.bk || x.tiling.split_k != y.tiling.split_k ||
        x.tiling.k_cuts != y.tiling.k_cuts || x.num_tiles != y.num_tiles)
      return fail("op " + x.name + " (tiling)");
  }
  if (a.num_tiles() != b.num_tiles()) return fail("tile count");
  for (int t = 0; t < a.num_tiles(); ++t) {
    const Tile &x = a.tile(t), &y = b.tile(t);
    auto same = [](const std::vector<Region>& p, const std::vector<Region>& q) {
      if (p.size() != q.size()) return false;
      for (size_t i = 0; i < p.size(); ++i)
        if (p[i].tensor != q[i].tensor || p[i].r0 != q[i].r0 || p[i].r1 != q[i].r1 || p[i].c0 != q[i].c0 || p[i].c1 != q[i].c1)
          return false;
      return true;
    };
    if (x.op != y.op || x.k0 != y.k0 || x.k1 != y.k1 || x.step_cols != y.step_cols || !same(x.reads, y.reads) ||
        !same(x.writes, y.writes) || x.deps != y.deps)
      return fail("tile " + std::to_string(t));
  }
  return true;
}

CacheConfig validation_cache_config(const GpuPreset& preset, int grid, bool partitioned) {
  CacheConfig cc;
  cc.capacity_bytes = preset.l2_bytes;
  cc.line_bytes = 32;
  cc.in_flight = grid;
  if (partitioned) {
    cc.l2 = L2Kind::Partitioned;
    cc.part = preset.l2;
  }
  return cc;
}

ValidationModel model_validation_case(const TileGraph& g, const Schedule& s, int grid, const GpuPreset& preset,
                                      bool time_from_simple) {
  ValidationModel r;
  r.simple = simulate(g, s, validation_cache_config(preset, grid, false));
  r.partitioned = simulate(g, s, validation_cache_config(preset, grid, true));
  r.time = predict_time(g, s, time_from_simple ? r.simple : r.partitioned, time_params(preset, grid));
  return r;
}

namespace {
// One timeline file, or nothing when the file is JSON of another kind. The header names the case:
// an FFN's by d, f and the variant's order= (FusedFfn's default order when it has none), a GEMM's by
// n, k and its order spec.
std::optional<RecordedTimeline> read_recorded_timeline(const std::filesystem::path& path) {
  using nlohmann::json;
  std::ifstream in(path);
  if (!in) throw InvalidArgument("timeline '" + path.string() + "': cannot be read");
  RecordedTimeline t;
  t.file = path.string();
  try {
    const json d = json::parse(in);
    const std::string kind = d.is_object() ? d.value("benchmark", std::string()) : std::string();
    if (kind == "ffn_trace") {
      if (!d.value("gated", false) || !d.contains("d")) return std::nullopt;  // the grid's FFNs are gated
      t.op = "ffn";
      t.d = d.at("d").get<int64_t>();
      t.f = d.at("f").get<int64_t>();
      t.order = "kslices/col_major";  // FfnOptions::order's default
      std::stringstream vs(d.value("variant", std::string()));
      for (std::string kv; std::getline(vs, kv, ',');)
        if (kv.rfind("order=", 0) == 0) t.order = kv.substr(6);
    } else if (kind == "gemm_trace") {
      t.op = "gemm";
      t.d = d.at("k").get<int64_t>();
      t.f = d.at("n").get<int64_t>();
      t.order = d.at("order").get<std::string>();
    } else {
      return std::nullopt;
    }
    t.m = d.at("m").get<int64_t>();
    for (const json& x : d.at("tiles")) {
      const int64_t id = x.at("id").get<int64_t>();
      if (id < 0) throw InvalidArgument("timeline '" + t.file + "': tile id " + std::to_string(id) + " is negative");
      if (size_t(id) >= t.spans.size()) t.spans.resize(size_t(id) + 1), t.coords.resize(size_t(id) + 1, {-1, -1, -1, -1});
      t.spans[size_t(id)] = {x.at("sm").get<int>(), x.at("ready").get<double>(), x.at("computed").get<double>(),
                             x.at("done").get<double>()};
      t.coords[size_t(id)] = {x.at("op").get<int64_t>(), x.at("tm").get<int64_t>(), x.at("tn").get<int64_t>(),
                              x.at("ks").get<int64_t>()};
    }
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument("timeline '" + t.file + "': malformed (" + e.what() + ")");
  }
  return t;
}
}  // namespace

std::vector<RecordedTimeline> load_recorded_timelines(const std::string& dir) {
  if (!std::filesystem::is_directory(dir)) throw InvalidArgument("timelines: '" + dir + "' is not a folder");
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());  // the same error for the same folder, whatever the file system's order
  std::vector<RecordedTimeline> out;
  for (const auto& path : files) {
    std::optional<RecordedTimeline> t = read_recorded_timeline(path);
    if (!t) continue;
    // Two recordings of one case: which one the replay took would depend on the folder's order.
    for (const RecordedTimeline& o : out)
      if (o.op == t->op && o.d == t->d && o.f == t->f && o.m == t->m && o.order == t->order)
        throw InvalidArgument("timelines: '" + o.file + "' and '" + t->file + "' are both " + t->op + " M=" +
                              std::to_string(t->m) + " " + t->order + " (d " + std::to_string(t->d) + ", f " +
                              std::to_string(t->f) + "); keep one");
    out.push_back(std::move(*t));
  }
  return out;
}

const RecordedTimeline* find_recorded_timeline(const std::vector<RecordedTimeline>& timelines, const ValidationShape& shape,
                                               int64_t m, const std::string& order) {
  for (const RecordedTimeline& t : timelines)
    if (t.op == shape.op && t.d == shape.d && t.f == shape.f && t.m == m && t.order == order) return &t;
  return nullptr;
}

TrafficReport replay_recorded_timeline(const ValidationCase& c, const RecordedTimeline& t, CacheConfig cache) {
  const TileGraph& g = c.graph;
  const std::string what = "timeline '" + t.file + "' is not the tiling of " + c.shape.name + " M=" + std::to_string(c.m);
  if (int64_t(t.spans.size()) != g.num_tiles())
    throw InvalidArgument(what + ": it has " + std::to_string(t.spans.size()) + " tiles, the case " +
                          std::to_string(g.num_tiles()));
  auto str = [](const std::array<int64_t, 4>& a) {
    return "(" + std::to_string(a[0]) + ", " + std::to_string(a[1]) + ", " + std::to_string(a[2]) + ", " +
           std::to_string(a[3]) + ")";
  };
  for (int id = 0; id < g.num_tiles(); ++id) {
    const Tile& x = g.tile(id);
    const std::array<int64_t, 4> host{x.op, x.tm, x.tn, x.ks};
    if (t.coords[size_t(id)] != host)
      throw InvalidArgument(what + ": tile " + std::to_string(id) + " is (op, tm, tn, ks) " + str(t.coords[size_t(id)]) +
                            " there, " + str(host) + " here");
  }
  if (cache.l2 != L2Kind::Partitioned)
    throw InvalidArgument("replay_recorded_timeline: a timeline drives the partitioned model, the cache is '" +
                          std::string(to_string(cache.l2)) + "'");
  cache.part.timeline = &t.spans;
  return simulate(g, c.schedule, cache);
}

}  // namespace tw
