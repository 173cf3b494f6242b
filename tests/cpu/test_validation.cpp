// Issue 17's validation grid on the host (model/validation.hpp): the executor's sm90 tiling rules,
// the cases' graphs and schedules, and the model columns the bench and `tileweave validate` share.
#include <gtest/gtest.h>

#include "llm_test_util.hpp"  // TempDir, write_text, error_of
#include "tileweave/kernels/sm90/tile_shape.hpp"
#include "tileweave/model/validation.hpp"
#include "tileweave/order/orders.hpp"

using namespace tw;

// DecodeGemm: 256 activation rows per tile above M = 128 (64 K columns a stage), 128 weight rows;
// split K until the output tiles fill one wave of SMs. 8b-down (N 4096, K 14336) at M = 256: 1 x 32
// output tiles, 132 / 32 = 4 slices of 3584 columns = 128 tiles; at M = 1024, 4 x 32 = 128 tiles
// alone (one slice); 8b-gate-up (N 28672) at M = 256: 224 output tiles, no split.
TEST(Validation, DecodeGemmTiling) {
  struct Case {
    int64_t m, n, k, tiles, split;
  };
  for (const Case& c : {Case{256, 4096, 14336, 128, 4}, Case{1024, 4096, 14336, 128, 1}, Case{256, 28672, 4096, 224, 1},
                        Case{16, 4096, 14336, 128, 4}}) {
    const TileGraph g = decode_gemm_graph(c.m, c.n, c.k, 132);
    ASSERT_EQ(g.ops().size(), 1u);
    const Op& op = g.op(0);
    EXPECT_EQ(op.tiling.split_k, c.split) << "M=" << c.m << " N=" << c.n;
    EXPECT_EQ(g.num_tiles(), c.tiles) << "M=" << c.m << " N=" << c.n;
    EXPECT_EQ(op.tiling.bm, c.m <= 128 ? 16 : 256);
    EXPECT_EQ(op.tiling.bn, 128);
    EXPECT_EQ(op.tiling.bk, c.m <= 64 ? 128 : 64);
  }
  // 4 slices of 3584 columns: k_begin at 0, 3584, 7168, 10752, 14336.
  const Op& op = decode_gemm_graph(256, 4096, 14336, 132).op(0);
  for (int ks = 0; ks <= 4; ++ks) EXPECT_EQ(op.k_begin(ks), 3584 * ks);
}

// FusedFfn on sm90: gate/up in ~4 MiB slices (K = 4096 is one slice: 128 x 4096 x 2 B = 1 MiB),
// 64 h columns per tile; down in ~1 MiB slices at 256 rows (K = 14336 -> 4 slices), the last wave
// shorter (tail:1 adds slices, so more than 4), while its 2 x 32 output tiles leave SMs idle.
TEST(Validation, FfnTiling) {
  const FfnTiling t = sm90_ffn_tiling({512, 4096, 14336, true}, 132);
  EXPECT_EQ(t.gate_up.split_k, 1);
  EXPECT_EQ(t.gate_up.bn, 64);
  EXPECT_EQ(t.gate_up.bm, 256);
  EXPECT_GT(t.down.split_k, 4);
  EXPECT_EQ(int64_t(t.down.k_cuts.size()), t.down.split_k - 1);
  for (int64_t c : t.down.k_cuts) EXPECT_EQ(c % 64, 0) << c;
  // 4 x 32 = 128 output tiles keep >= 3/4 of 132 SMs busy: no K split; a given split stays.
  EXPECT_EQ(sm90_ffn_tiling({1024, 4096, 14336, true}, 132).down.split_k, 1);
  EXPECT_EQ(ffn_down_split({1024, 4096, 14336, true}, 3, 132), 3);
  EXPECT_EQ(ffn_down_split({1024, 4096, 14336, true}, 0, 132), 1);
  EXPECT_EQ(ffn_down_split({512, 4096, 14336, true}, 0, 132), 0);
  EXPECT_EQ(ffn_down_split({512, 8192, 28672, true}, 0, 132), 1);  // 70B: 2 x 64 tiles
  EXPECT_THROW(sm90_op_tiling(256, 4096, 14336, 0, 0, "even", 132), InvalidArgument);
  EXPECT_THROW(sm90_op_tiling(256, 4096, 14336, 512, 0, "tail:9", 132), InvalidArgument);
}

// Ops whose tiles would leave over half the SMs idle are split to give 3/4 of them a tile; the Llama
// shapes, which fill them, keep their slices.
TEST(Validation, FfnTilingFillsTheSms) {
  // Plain MLP, M = 256 (one block of 256 rows), d = 12160, F = 2432: 19 first-GEMM tiles -> 6
  // slices (114 tiles); 95 down tiles fill over half the SMs: as before.
  const FfnTiling p = sm90_ffn_tiling({256, 12160, 2432, false}, 132);
  EXPECT_EQ(p.gate_up.split_k, 6);
  EXPECT_EQ(fill_split(256, 2432, 12160, 4096, 132), 6);
  EXPECT_EQ(fill_split(256, 12160, 2432, 1024, 132), 0);
  EXPECT_EQ(fill_split(32, 2 * 4480, 14848, 4096, 132), 0);  // 70 gate/up tiles: no split (it lost)
  EXPECT_EQ(fill_split(32, 2 * 3200, 15360, 4096, 132), 2);  // 50: two slices
  // A split is capped by two stages per slice: K = 256 at 8 rows is two stages of 128.
  EXPECT_EQ(fill_split(8, 128, 256, 4096, 132), 1);
  // Llama-3-8B at M = 16: 224 gate/up tiles fill the SMs; down's 32 tiles in ~512 KiB slices (7)
  // already give 224 tiles: both as before.
  const FfnTiling l = sm90_ffn_tiling({16, 4096, 14336, true}, 132);
  EXPECT_EQ(l.gate_up.split_k, 1);
  EXPECT_EQ(fill_split(16, 2 * 14336, 4096, 4096, 132), 0);
  EXPECT_EQ(fill_split(16, 4096, 14336, 512, 132), 0);
  EXPECT_GE(l.down.split_k, 7);
  // A given split wins.
  EXPECT_EQ(sm90_ffn_tiling({256, 12160, 2432, false}, 132, 3).gate_up.split_k, 3);
}

TEST(Validation, CasesAndGraphsMatch) {
  EXPECT_EQ(validation_shapes().size(), 4u);
  EXPECT_EQ(validation_orders().size(), 6u);
  EXPECT_THROW(find_validation_shape("llama3-70b"), InvalidArgument);
  const ValidationCase a = make_validation_case(find_validation_shape("8b-down"), 512, "grouped:8");
  EXPECT_EQ(a.grid, 132);
  EXPECT_EQ(a.schedule.order, make_order(a.graph, "grouped:8").order);
  std::string why;
  EXPECT_TRUE(validation_graphs_match(a.graph, decode_gemm_graph(512, 4096, 14336, 132), &why)) << why;
  EXPECT_FALSE(validation_graphs_match(a.graph, decode_gemm_graph(1024, 4096, 14336, 132), &why));
  EXPECT_FALSE(why.empty());
  // FusedFfn's own names: op_by_op is row_major; plain dataflow lags consumers by the grid.
  const ValidationShape& ffn = find_validation_shape("llama3-8b");
  const ValidationCase b = make_validation_case(ffn, 256, "op_by_op");
  EXPECT_EQ(b.schedule.order, make_order(b.graph, "row_major").order);
  const ValidationCase d = make_validation_case(ffn, 256, "dataflow");
  EXPECT_EQ(d.schedule.order, dataflow_order(d.graph, make_order(d.graph, "col_major"), 132).order);
  EXPECT_THROW(make_validation_case(ffn, 256, "search"), InvalidArgument);  // no spec: an annealed order
}

// The model's columns are simulate() of the case on the preset's L2 (simple and partitioned) and the
// predicted time from the partitioned bytes. At M = 256 the 8b-gate-up GEMM's 224 tiles (one per
// 128 weight rows, all 256 rows of x) run in two waves on 132 SMs: the simple model reads the
// weights (28672 x 4096 x 2 B) once and x (256 x 4096 x 2 B) twice, since 132 tiles' 1 MiB weight
// panels (132 MiB) pass between the waves' reads of x. ncu measured 237.1 MB: x once -- the weights'
// evict-first policy kept x; the partitioned model lands in between (the push is 0.7, not 0).
TEST(Validation, ModelColumns) {
  const GpuPreset h200 = gpu_preset("h200");
  const ValidationCase c = make_validation_case(find_validation_shape("8b-gate-up"), 256, "col_major");
  const ValidationModel m = model_validation_case(c.graph, c.schedule, c.grid, h200);
  const int64_t w = 28672LL * 4096 * 2, x = 256LL * 4096 * 2;
  EXPECT_EQ(m.simple.dram_read, w + 2 * x);
  CacheConfig pc;
  pc.capacity_bytes = h200.l2_bytes;
  pc.in_flight = 132;
  pc.l2 = L2Kind::Partitioned;
  pc.part = h200.l2;
  EXPECT_EQ(m.partitioned.dram_read, simulate(c.graph, c.schedule, pc).dram_read);
  EXPECT_GE(m.partitioned.dram_read, w + x);
  EXPECT_LE(m.partitioned.dram_read, w + 2 * x);
  EXPECT_DOUBLE_EQ(m.time.fused_us, predict_time(c.graph, c.schedule, m.partitioned, time_params(h200, 132)).fused_us);
  // The time: 224 tiles of 64 K-steps (0.67 us each at 830 TFLOP/s over 132 SMs) + 5.5 us fixed, in
  // two rounds on 132 SMs, plus a 3 us launch: ~106 us. Measured on the H200: 109.4 us
  // (bench/results/h200/model_vs_ncu.json).
  EXPECT_NEAR(m.time.fused_us, 109.4, 0.05 * 109.4);
}

// Tile heights (FfnOptions / DecodeGemmOptions::tile_rows). "pow2": 8 .. 256 by powers of two;
// "fit": above 64 rows the fewest row blocks of <= 256, each the smallest multiple of 32 holding its
// share: M = 65 -> 96, 100 -> 128, 150 -> 160, 200 -> 224, 256 -> 256, 300 -> 2 x 160, 513 -> 3 x
// 192 (171 rows each), 4096 -> 16 x 256. A height the body does not run is refused by name.
TEST(Validation, TileHeights) {
  struct Case {
    int64_t m;
    int pow2, fit;
  };
  for (const Case& c : {Case{1, 8, 8}, Case{37, 64, 64}, Case{64, 64, 64}, Case{65, 128, 96}, Case{100, 128, 128},
                        Case{150, 256, 160}, Case{200, 256, 224}, Case{256, 256, 256}, Case{300, 256, 160},
                        Case{513, 256, 192}, Case{4096, 256, 256}}) {
    EXPECT_EQ(sm90_tile_rows(c.m, "pow2"), c.pow2) << c.m;
    EXPECT_EQ(sm90_tile_rows(c.m, "fit"), c.fit) << c.m;
    EXPECT_TRUE(sm90::is_tile_rows(c.fit)) << c.m;
  }
  EXPECT_EQ(sm90_tile_rows(200, "160"), 160);
  for (const char* bad : {"100", "48", "0", "288", "fit2", "", "-32"}) {
    try {
      sm90_tile_rows(200, bad);
      FAIL() << "tile_rows '" << bad << "' accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos) << e.what();
    }
  }
  // M = 300 in tiles of 160: two row blocks, the second 140 rows (the graph clips it; the body pads).
  const FfnTiling t = sm90_ffn_tiling({300, 4096, 14336, true}, 132, 0, 0, "tail:1", 160);
  EXPECT_EQ(t.gate_up.bm, 160);
  EXPECT_EQ(t.gate_up.bk, 64);  // above 64 rows a stage is one 64-column atom
  const FfnGraph g = build_ffn_graph({300, 4096, 14336, true}, t);
  EXPECT_EQ(g.graph.op(g.op_gate_up).grid_m, 2);
  EXPECT_THROW(sm90_op_tiling(300, 4096, 14336, 0, 1, "even", 132, 100), InvalidArgument);
  EXPECT_EQ(decode_gemm_graph(200, 1024, 512, 132, 0, "even", 224).op(0).tiling.bm, 224);
}

// A plain GEMM's recorded timeline (bench_model_vs_ncu --trace-dir writes it; `tileweave validate
// --timelines` finds and replays it), worked by hand. The case: DecodeGemm's tiling of M = 128,
// N = 256, K = 128 on 2 SMs -- 128 activation rows, 64 K columns a step, one wave of 2 tiles and no
// split: tile 0 = (0, 0, 0, 0) reads x.0, w0.0 then x.1, w0.1 and writes y0; tile 1 = (0, 0, 1, 0)
// the same x with w1. Every x and w block is 128 x 64 bf16 = 16 KiB; a y block 128 x 128 = 32 KiB.
// One partition, fully associative, no far copies: a block is hit iff the bytes touched since its
// last use plus its own fit. Recorded one after the other on SM 0 (tile 0 over [0, 2) us, done at
// 2; tile 1 over [2, 4)): when tile 1 reads x.0 again, w0.0, x.1, w0.1 and y0 (80 KiB) have passed,
// so with 48 KiB of cache both x blocks are read twice (8 blocks, 128 KiB) and with 112 KiB once
// (6 blocks, 96 KiB). Recorded side by side on SMs 0 and 1 (both over [0, 2)), tile 1 reads each x
// block right after tile 0: 96 KiB in 48 KiB too. The drawn replay (lockstep, no jitter) differs
// only in writing y0 with tile 0's last step, so y0's 32 KiB come between the two reads of x.1:
// 7 blocks.
TEST(Validation, RecordedGemmTimelineIsReplayedAsItHappened) {
  const ValidationShape shape{"gemm", "tiny-gemm", 128, 256};  // K, N
  const ValidationCase c = make_validation_case(shape, 128, "row_major", 2);
  ASSERT_EQ(c.graph.num_tiles(), 2);
  ASSERT_EQ(c.graph.op(0).tiling.bm, 128);
  ASSERT_EQ(c.graph.op(0).tiling.bk, 64);
  ASSERT_EQ(c.graph.op(0).tiling.split_k, 1);
  ASSERT_EQ(c.graph.tile(1).tn, 1);
  constexpr int64_t kBlock = 16 << 10;
  CacheConfig cache;
  cache.capacity_bytes = 3 * kBlock;
  cache.line_bytes = 32;
  cache.in_flight = c.grid;
  cache.l2 = L2Kind::Partitioned;
  cache.part.partitions = 1;
  cache.part.far_copies = false;
  cache.part.line_bytes = 32;
  cache.part.ways = 0;

  test::TempDir dir;
  auto tile = [](int id, int tn, int sm, double ready, double computed) {
    const std::string t = std::to_string(ready), e = std::to_string(computed);
    return "{\"id\": " + std::to_string(id) + ", \"op\": 0, \"tm\": 0, \"tn\": " + std::to_string(tn) +
           ", \"ks\": 0, \"sm\": " + std::to_string(sm) + ", \"taken\": " + t + ", \"ready\": " + t +
           ", \"started\": " + t + ", \"computed\": " + e + ", \"done\": " + e + "}";
  };
  const std::string header =
      R"({"benchmark": "gemm_trace", "shape": "tiny-gemm", "n": 256, "k": 128, "m": 128, "order": "row_major", )";
  const std::string one_after_the_other = header + "\"tiles\": [" + tile(0, 0, 0, 0, 2) + ", " + tile(1, 1, 0, 2, 4) + "]}";
  test::write_text(dir / "gemm_trace_tiny-gemm_m128_row_major.json", one_after_the_other);
  test::write_text(dir / "model_vs_ncu_timing.json", R"({"benchmark": "model_vs_ncu_timing", "cases": []})");  // not a timeline
  const std::vector<RecordedTimeline> all = load_recorded_timelines(dir.path.string());
  ASSERT_EQ(all.size(), 1u);
  const RecordedTimeline* t = find_recorded_timeline(all, shape, 128, "row_major");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->op, "gemm");
  EXPECT_EQ(find_recorded_timeline(all, shape, 128, "col_major"), nullptr);
  EXPECT_EQ(find_recorded_timeline(all, shape, 256, "row_major"), nullptr);
  EXPECT_EQ(find_recorded_timeline(all, {"ffn", "tiny-ffn", 128, 256}, 128, "row_major"), nullptr);  // another op

  EXPECT_EQ(replay_recorded_timeline(c, *t, cache).dram_read, 8 * kBlock);
  EXPECT_EQ(simulate(c.graph, c.schedule, cache).dram_read, 7 * kBlock);  // drawn
  cache.capacity_bytes = 7 * kBlock;
  EXPECT_EQ(replay_recorded_timeline(c, *t, cache).dram_read, 6 * kBlock);
  cache.capacity_bytes = 3 * kBlock;
  RecordedTimeline side_by_side = *t;
  side_by_side.spans[1] = {1, 0, 2, 2};
  EXPECT_EQ(replay_recorded_timeline(c, side_by_side, cache).dram_read, 6 * kBlock);

  // The recorded tiles must be the case's: another tile numbering, another tile count, or the
  // simple model (which takes no timeline) are refused by name.
  RecordedTimeline other = *t;
  other.coords[1] = {0, 1, 0, 0};
  std::string e = test::error_of([&] { replay_recorded_timeline(c, other, cache); });
  EXPECT_NE(e.find("gemm_trace_tiny-gemm_m128_row_major.json"), std::string::npos) << e;
  EXPECT_NE(e.find("tile 1 is (op, tm, tn, ks) (0, 1, 0, 0) there, (0, 0, 1, 0) here"), std::string::npos) << e;
  other = *t;
  other.spans.pop_back(), other.coords.pop_back();
  e = test::error_of([&] { replay_recorded_timeline(c, other, cache); });
  EXPECT_NE(e.find("it has 1 tiles, the case 2"), std::string::npos) << e;
  CacheConfig simple_cache = cache;
  simple_cache.l2 = L2Kind::Simple;
  e = test::error_of([&] { replay_recorded_timeline(c, *t, simple_cache); });
  EXPECT_NE(e.find("'simple'"), std::string::npos) << e;

  // Two recordings of one case, and a broken file, are refused naming the files.
  test::write_text(dir / "again.json", one_after_the_other);
  e = test::error_of([&] { load_recorded_timelines(dir.path.string()); });
  EXPECT_NE(e.find("again.json"), std::string::npos) << e;
  EXPECT_NE(e.find("gemm_trace_tiny-gemm_m128_row_major.json"), std::string::npos) << e;
  test::write_text(dir / "again.json", header + "\"tiles\": [{\"id\": 0}]}");
  e = test::error_of([&] { load_recorded_timelines(dir.path.string()); });
  EXPECT_NE(e.find("again.json': malformed"), std::string::npos) << e;
  e = test::error_of([&] { load_recorded_timelines(dir / "missing"); });
  EXPECT_NE(e.find("missing' is not a folder"), std::string::npos) << e;
}
