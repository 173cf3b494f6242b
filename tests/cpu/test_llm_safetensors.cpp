// safetensors: write then read back, bf16 conversion, every kind of corrupt file, sharded folders.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "llm_test_util.hpp"
#include "tileweave/llm/bf16.hpp"
#include "tileweave/llm/safetensors.hpp"

using namespace tw;
using tw::test::error_of;
using tw::test::TempDir;

namespace fs = std::filesystem;

namespace {

// A file as bytes: the 8-byte little-endian length (the header's, unless `length` says otherwise), header, data.
void write_raw(const std::string& path, const std::string& header, const std::string& data = "",
               int64_t length = -1) {
  const uint64_t n = length >= 0 ? static_cast<uint64_t>(length) : header.size();
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(n >> (8 * i));
  tw::test::write_text(path, bytes + header + data);
}

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::string error_opening(const std::string& path) {
  return error_of([&] { SafetensorsFile f(path); });
}

}  // namespace

TEST(Safetensors, DTypes) {
  EXPECT_EQ(parse_dtype("BF16"), DType::BF16);
  EXPECT_EQ(parse_dtype("BOOL"), DType::BOOL);
  EXPECT_EQ(dtype_bytes(DType::I64), 8);
  EXPECT_EQ(dtype_bytes(DType::F16), 2);
  EXPECT_STREQ(to_string(DType::U8), "U8");
  EXPECT_NE(error_of([] { parse_dtype("F8_E4M3X"); }).find("F8_E4M3X"), std::string::npos);
}

TEST(Safetensors, WriteThenRead) {
  TempDir dir;
  const std::vector<uint16_t> a = {0x3f80, 0x4000, 0xbf80, 0x0000, 0x7f80, 0x1234};  // bf16 [2, 3]
  const std::vector<float> b = {1.5f, -2.25f, 1e-30f, 3.0e38f};                       // f32 [4]
  const std::vector<int64_t> c = {1, -2, int64_t{1} << 40, 7};                        // i64 [2, 2]
  const float scalar = 42.0f;
  const std::string path = dir / "t.safetensors";
  write_safetensors(path,
                    {{"a", DType::BF16, {2, 3}, a.data()},
                     {"b.weight", DType::F32, {4}, b.data()},
                     {"c", DType::I64, {2, 2}, c.data()},
                     {"empty", DType::BF16, {0, 5}, nullptr},
                     {"scalar", DType::F32, {}, &scalar}},
                    {{"format", "pt"}, {"note", "hi"}});

  const SafetensorsFile f(path);
  EXPECT_EQ(f.path(), path);
  ASSERT_EQ(f.tensors().size(), 5u);
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"note", "hi"}}));
  EXPECT_EQ(f.find("missing"), nullptr);
  const TensorEntry* ea = f.find("a");
  ASSERT_NE(ea, nullptr);
  EXPECT_EQ(ea->dtype, DType::BF16);
  EXPECT_EQ(ea->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ea->numel(), 6);
  EXPECT_EQ(std::memcmp(f.data(*ea), a.data(), 12), 0);
  const TensorEntry* eb = f.find("b.weight");
  ASSERT_NE(eb, nullptr);
  EXPECT_EQ(eb->dtype, DType::F32);
  EXPECT_EQ(eb->end - eb->begin, 16u);
  EXPECT_EQ(std::memcmp(f.data(*eb), b.data(), 16), 0);
  const TensorEntry* ec = f.find("c");
  ASSERT_NE(ec, nullptr);
  EXPECT_EQ(ec->dtype, DType::I64);
  EXPECT_EQ(std::memcmp(f.data(*ec), c.data(), 32), 0);
  EXPECT_EQ(f.find("empty")->numel(), 0);
  EXPECT_EQ(f.find("scalar")->numel(), 1);
  float s;
  std::memcpy(&s, f.data(*f.find("scalar")), 4);
  EXPECT_EQ(s, 42.0f);
  // Tensors are listed in data order, here the order written.
  EXPECT_EQ(f.tensors()[0].name, "a");
  EXPECT_EQ(f.tensors()[2].name, "c");

  // The header is padded with spaces so the data start at a multiple of 8.
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 12 + 16 + 32 + 4);
  EXPECT_EQ(bytes[8], '{');
  const size_t close = bytes.rfind('}', 8 + n);
  for (size_t i = close + 1; i < 8 + n; ++i) EXPECT_EQ(bytes[i], ' ');

  // Moving keeps the mapping alive.
  SafetensorsFile g(path);
  SafetensorsFile h(std::move(g));
  EXPECT_EQ(std::memcmp(h.data(*h.find("c")), c.data(), 32), 0);

  // As a one-file model, with conversion to bf16.
  const SafetensorsModel m(path);
  EXPECT_EQ(m.names(), (std::vector<std::string>{"a", "b.weight", "c", "empty", "scalar"}));
  EXPECT_EQ(m.read_bf16("a", {2, 3}), a);
  EXPECT_EQ(m.read_bf16("b.weight", {4}), (std::vector<uint16_t>{0x3fc0, 0xc010, float_to_bf16(1e-30f), 0x7f62}));
}

TEST(Safetensors, WriterRejectsBadInput) {
  TempDir dir;
  const uint16_t x = 0;
  EXPECT_NE(error_of([&] {
              write_safetensors(dir / "w", {{"a", DType::BF16, {1}, &x}, {"a", DType::BF16, {1}, &x}});
            }).find("'a'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { write_safetensors(dir / "w", {{"a", DType::BF16, {-1}, &x}}); }).find("negative"),
            std::string::npos);
  EXPECT_NE(error_of([&] { write_safetensors(dir / "w", {{"a", DType::BF16, {2}, nullptr}}); }).find("no data"),
            std::string::npos);
  EXPECT_NE(error_of([&] { write_safetensors(dir / "no/such/dir/w", {}); }).find("no/such/dir"), std::string::npos);
}

// Round to nearest even, at the exact bit patterns where it matters.
TEST(Safetensors, Bf16Rounding) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(bits_to_float(0x3f808000)), 0x3f80);  // halfway, even below
  EXPECT_EQ(float_to_bf16(bits_to_float(0x3f818000)), 0x3f82);  // halfway, even above
  EXPECT_EQ(float_to_bf16(bits_to_float(0x3f808001)), 0x3f81);  // just above halfway
  EXPECT_EQ(float_to_bf16(bits_to_float(0x3f807fff)), 0x3f80);  // just below
  EXPECT_EQ(float_to_bf16(bits_to_float(0xbf818000)), 0xbf82);  // negative ties alike
  EXPECT_EQ(float_to_bf16(bits_to_float(0x7f7fffff)), 0x7f80);  // FLT_MAX rounds up to infinity
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(float_to_bf16(bits_to_float(0x00018000)), 0x0002);  // subnormal tie to even
  const uint16_t nan = float_to_bf16(bits_to_float(0x7f800001));  // a NaN whose payload would round to infinity
  EXPECT_TRUE(std::isnan(bf16_to_float(nan)));
  EXPECT_EQ(bf16_to_float(0x4049), 3.140625f);
  EXPECT_EQ(round_bf16(3.14159265f), 3.140625f);

  // The same through read_bf16 from F32 and from F16 files.
  TempDir dir;
  const std::vector<uint32_t> f32 = {0x3f808000, 0x3f818000, 0x3f808001, 0x3f807fff, 0xbf818000, 0x7f7fffff};
  // F16: 1.0, 1 + 2^-10 (rounds to 1.0 in bf16), 2^-24 (the smallest subnormal), -inf, 65504 (the largest).
  const std::vector<uint16_t> f16 = {0x3c00, 0x3c01, 0x0001, 0xfc00, 0x7bff};
  write_safetensors(dir / "m.safetensors",
                    {{"f32", DType::F32, {2, 3}, f32.data()}, {"f16", DType::F16, {5}, f16.data()}});
  const SafetensorsModel m(dir / "m.safetensors");
  EXPECT_EQ(m.read_bf16("f32", {2, 3}), (std::vector<uint16_t>{0x3f80, 0x3f82, 0x3f81, 0x3f80, 0xbf82, 0x7f80}));
  // 65504 = 1.99951 * 2^15 rounds to 2^16 (0x4780) in bf16.
  EXPECT_EQ(m.read_bf16("f16", {5}), (std::vector<uint16_t>{0x3f80, 0x3f80, 0x3380, 0xff80, 0x4780}));
}

TEST(Safetensors, ReadBf16ChecksShapeAndDType) {
  TempDir dir;
  const std::vector<int64_t> ids = {1, 2};
  const std::vector<uint16_t> w(6, 0x3f80);
  const std::string path = dir / "m.safetensors";
  write_safetensors(path, {{"ids", DType::I64, {2}, ids.data()}, {"w", DType::BF16, {2, 3}, w.data()}});
  const SafetensorsModel m(path);
  std::string e = error_of([&] { m.read_bf16("w", {3, 2}); });
  for (const char* word : {"'w'", "[2, 3]", "[3, 2]", "m.safetensors"}) EXPECT_NE(e.find(word), std::string::npos) << e;
  e = error_of([&] { m.read_bf16("ids", {2}); });
  EXPECT_NE(e.find("I64"), std::string::npos) << e;
  e = error_of([&] { m.read_bf16("nope", {2}); });
  EXPECT_NE(e.find("'nope'"), std::string::npos) << e;
  EXPECT_NE(e.find(path), std::string::npos) << e;
}

TEST(Safetensors, CorruptFilesAreRefused) {
  TempDir dir;
  auto expect = [&](const std::string& name, const std::string& word) {
    const std::string path = dir / name;
    const std::string e = error_opening(path);
    EXPECT_NE(e.find(path), std::string::npos) << e;
    EXPECT_NE(e.find(word), std::string::npos) << "'" << word << "' not in: " << e;
  };
  tw::test::write_text(dir / "short", "abcde");
  expect("short", "shorter than");
  expect("absent", "cannot open");
  write_raw(dir / "long_header", "{}", "", 1000);
  expect("long_header", "larger than");
  // A header length over 100 MB in a (sparse) file long enough to hold it.
  write_raw(dir / "huge_header", "{}", "", 200'000'000);
  fs::resize_file(dir / "huge_header", 200'000'100);
  expect("huge_header", "100 MB");
  write_raw(dir / "not_json", "{\"a\": [1, 2");
  expect("not_json", "not valid JSON");
  write_raw(dir / "not_object", "[1, 2, 3]");
  expect("not_object", "not a JSON object");
  write_raw(dir / "no_dtype", R"({"t": {"shape": [2], "data_offsets": [0, 4]}})", "abcd");
  expect("no_dtype", "dtype");
  write_raw(dir / "no_shape", R"({"t": {"dtype": "BF16", "data_offsets": [0, 4]}})", "abcd");
  expect("no_shape", "shape");
  write_raw(dir / "no_offsets", R"({"t": {"dtype": "BF16", "shape": [2]}})", "abcd");
  expect("no_offsets", "data_offsets");
  write_raw(dir / "bad_dtype", R"({"t": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 4]}})", "abcd");
  expect("bad_dtype", "unknown dtype 'Q4'");
  write_raw(dir / "negative_dim", R"({"t": {"dtype": "BF16", "shape": [-2, 1], "data_offsets": [0, 4]}})", "abcd");
  expect("negative_dim", "negative");
  write_raw(dir / "wrong_size", R"({"t": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 6]}})", "abcdef");
  expect("wrong_size", "needs 4");
  write_raw(dir / "past_end", R"({"t": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}})", "abcd");
  expect("past_end", "past the end");
  write_raw(dir / "overlap",
            R"({"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},
                "b": {"dtype": "BF16", "shape": [2], "data_offsets": [2, 6]}})",
            "abcdefgh");
  expect("overlap", "overlap");
  write_raw(dir / "bad_metadata", R"({"__metadata__": {"k": 1}})");
  expect("bad_metadata", "__metadata__");

  // A valid hand-written file (no padding, a hole between tensors) opens.
  write_raw(dir / "fine",
            R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                "b": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6]}})",
            "abcdef");
  const SafetensorsFile ok(dir / "fine");
  EXPECT_EQ(ok.data(*ok.find("b"))[0], 'e');
}

TEST(Safetensors, ShardedFolder) {
  TempDir dir;
  const std::vector<uint16_t> a = {1, 2}, b = {3, 4, 5}, c = {6};
  write_safetensors(dir / "model-00001-of-00002.safetensors",
                    {{"a", DType::BF16, {2}, a.data()}, {"b", DType::BF16, {3}, b.data()}}, {{"format", "pt"}});
  write_safetensors(dir / "model-00002-of-00002.safetensors", {{"c", DType::BF16, {1}, c.data()}}, {{"format", "pt"}});
  auto check = [&](const SafetensorsModel& m) {
    EXPECT_EQ(m.names(), (std::vector<std::string>{"a", "b", "c"}));
    EXPECT_EQ(m.read_bf16("a", {2}), a);
    EXPECT_EQ(m.read_bf16("b", {3}), b);
    EXPECT_EQ(m.read_bf16("c", {1}), c);
    const SafetensorsFile* file = nullptr;
    ASSERT_NE(m.find("c", &file), nullptr);
    EXPECT_NE(file->path().find("model-00002-of-00002"), std::string::npos);
    EXPECT_EQ(m.find("d"), nullptr);
    const std::string e = error_of([&] { m.read_bf16("d", {1}); });
    EXPECT_NE(e.find("'d'"), std::string::npos) << e;
    EXPECT_NE(e.find(dir.path.string()), std::string::npos) << e;
  };
  check(SafetensorsModel(dir.path.string()));  // no index: every *.safetensors

  tw::test::write_text(dir / "model.safetensors.index.json", R"({"metadata": {"total_size": 12}, "weight_map": {
      "a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
      "c": "model-00002-of-00002.safetensors"}})");
  check(SafetensorsModel(dir.path.string()));

  // An index that places a tensor in the wrong shard, or names a missing shard.
  tw::test::write_text(dir / "model.safetensors.index.json",
                       R"({"weight_map": {"a": "model-00002-of-00002.safetensors"}})");
  std::string e = error_of([&] { SafetensorsModel m(dir.path.string()); });
  EXPECT_NE(e.find("'a'"), std::string::npos) << e;
  tw::test::write_text(dir / "model.safetensors.index.json", R"({"weight_map": {"a": "gone.safetensors"}})");
  e = error_of([&] { SafetensorsModel m(dir.path.string()); });
  EXPECT_NE(e.find("gone.safetensors"), std::string::npos) << e;

  // Without an index, a tensor in two shards is ambiguous.
  fs::remove(dir / "model.safetensors.index.json");
  write_safetensors(dir / "extra.safetensors", {{"b", DType::BF16, {3}, b.data()}});
  e = error_of([&] { SafetensorsModel m(dir.path.string()); });
  EXPECT_NE(e.find("'b'"), std::string::npos) << e;

  // A folder without any.
  TempDir empty;
  e = error_of([&] { SafetensorsModel m(empty.path.string()); });
  EXPECT_NE(e.find(empty.path.string()), std::string::npos) << e;
}
