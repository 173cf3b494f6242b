#include "tileweave/llm/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "tileweave/llm/bf16.hpp"

namespace tw {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// The safetensors library refuses larger headers; a corrupt length must not make us parse gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

const DType kAllDTypes[] = {DType::BF16, DType::F16, DType::F32, DType::F64, DType::I8,
                            DType::I16,  DType::I32, DType::I64, DType::U8,  DType::BOOL};

// IEEE half -> float (exact: every half value is a float value).
float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {
    const float mag = std::ldexp(static_cast<float>(mant), -24);  // zero or subnormal
    return sign ? -mag : mag;
  }
  const uint32_t bits = sign | (exp == 31 ? 0x7f800000u | (mant << 13) : ((exp + 112) << 23) | (mant << 13));
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// A JSON integer >= 0, or nothing.
bool get_u64(const json& v, uint64_t& out) {
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

}  // namespace

const char* to_string(DType t) {
  switch (t) {
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::F32: return "F32";
    case DType::F64: return "F64";
    case DType::I8: return "I8";
    case DType::I16: return "I16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
    case DType::BOOL: return "BOOL";
  }
  return "?";
}

int dtype_bytes(DType t) {
  switch (t) {
    case DType::F64:
    case DType::I64: return 8;
    case DType::F32:
    case DType::I32: return 4;
    case DType::BF16:
    case DType::F16:
    case DType::I16: return 2;
    case DType::I8:
    case DType::U8:
    case DType::BOOL: return 1;
  }
  return 0;
}

DType parse_dtype(const std::string& s) {
  for (DType t : kAllDTypes)
    if (s == to_string(t)) return t;
  std::string known;
  for (DType t : kAllDTypes) known += (known.empty() ? "" : ", ") + std::string(to_string(t));
  throw InvalidArgument("unknown dtype '" + s + "' (known: " + known + ")");
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t TensorEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---- SafetensorsFile ----

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  auto fail = [&](const std::string& msg) { throw InvalidArgument("safetensors file '" + path + "': " + msg); };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(std::string("cannot open it (") + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("not a regular file");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    fail("the file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  }
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file
  if (m == MAP_FAILED) fail(std::string("mmap failed (") + std::strerror(errno) + ")");
  map_ = m;
  map_bytes_ = size;

  try {
    const auto* bytes = static_cast<const uint8_t*>(map_);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];  // little-endian
    if (n > size - 8)
      fail("header length " + std::to_string(n) + " is larger than the rest of the file (" + std::to_string(size - 8) +
           " bytes)");
    if (n > kMaxHeaderBytes) fail("header length " + std::to_string(n) + " is over the 100 MB limit");
    json h;
    try {
      h = json::parse(reinterpret_cast<const char*>(bytes + 8), reinterpret_cast<const char*>(bytes + 8 + n));
    } catch (const json::exception& e) {
      fail(std::string("the header is not valid JSON (") + e.what() + ")");
    }
    if (!h.is_object()) fail("the header is not a JSON object");
    data_ = bytes + 8 + n;
    const uint64_t data_bytes = size - 8 - n;

    for (auto it = h.begin(); it != h.end(); ++it) {
      const std::string& name = it.key();
      const json& v = it.value();
      if (name == "__metadata__") {
        if (!v.is_object()) fail("__metadata__ is not an object");
        for (auto m = v.begin(); m != v.end(); ++m) {
          if (!m.value().is_string()) fail("__metadata__ value of '" + m.key() + "' is not a string");
          metadata_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      auto bad = [&](const std::string& msg) { fail("tensor '" + name + "': " + msg); };
      if (!v.is_object()) bad("entry is not an object");
      for (const char* key : {"dtype", "shape", "data_offsets"})
        if (!v.contains(key)) bad(std::string("entry has no ") + key);
      TensorEntry e;
      e.name = name;
      if (!v["dtype"].is_string()) bad("dtype is not a string");
      try {
        e.dtype = parse_dtype(v["dtype"].get<std::string>());
      } catch (const InvalidArgument& x) {
        bad(x.what());
      }
      if (!v["shape"].is_array()) bad("shape is not a list");
      // numel * bytes must fit in the data section, so any product past it is an error anyway (and no overflow).
      uint64_t numel = 1;
      for (const json& d : v["shape"]) {
        if (!d.is_number_integer()) bad("shape " + v["shape"].dump() + " holds a non-integer");
        if (d.get<int64_t>() < 0) bad("shape " + v["shape"].dump() + " has a negative dimension");
        const uint64_t dim = d.get<uint64_t>();
        if (dim && numel > (uint64_t{1} << 62) / dim) bad("shape " + v["shape"].dump() + " is absurdly large");
        numel *= dim;
        e.shape.push_back(static_cast<int64_t>(dim));
      }
      const json& off = v["data_offsets"];
      if (!off.is_array() || off.size() != 2 || !get_u64(off[0], e.begin) || !get_u64(off[1], e.end))
        bad("data_offsets " + off.dump() + " is not a pair of non-negative integers");
      if (e.end < e.begin) bad("data_offsets " + off.dump() + " end before they begin");
      const uint64_t want = numel * static_cast<uint64_t>(dtype_bytes(e.dtype));
      if (e.end - e.begin != want)
        bad("data_offsets " + off.dump() + " hold " + std::to_string(e.end - e.begin) + " bytes, but shape " +
            shape_string(e.shape) + " of " + to_string(e.dtype) + " needs " + std::to_string(want));
      if (e.end > data_bytes)
        bad("data_offsets " + off.dump() + " run past the end of the data (" + std::to_string(data_bytes) +
            " bytes)");
      tensors_.push_back(std::move(e));
    }
    std::sort(tensors_.begin(), tensors_.end(), [](const TensorEntry& a, const TensorEntry& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    // Sorted by begin, two non-empty tensors overlap iff one begins before an earlier one ends.
    const TensorEntry* prev = nullptr;
    for (const TensorEntry& e : tensors_) {
      if (e.begin == e.end) continue;
      if (prev && e.begin < prev->end)
        fail("tensors '" + prev->name + "' [" + std::to_string(prev->begin) + ", " + std::to_string(prev->end) +
             ") and '" + e.name + "' [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ") overlap");
      prev = &e;
    }
    for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
  } catch (...) {
    unmap();
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() { unmap(); }

void SafetensorsFile::unmap() {
  if (map_) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  data_ = nullptr;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)),
      map_(o.map_),
      map_bytes_(o.map_bytes_),
      data_(o.data_),
      tensors_(std::move(o.tensors_)),
      index_(std::move(o.index_)),
      metadata_(std::move(o.metadata_)) {
  o.map_ = nullptr;
  o.map_bytes_ = 0;
  o.data_ = nullptr;
}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    unmap();
    path_ = std::move(o.path_);
    map_ = o.map_;
    map_bytes_ = o.map_bytes_;
    data_ = o.data_;
    tensors_ = std::move(o.tensors_);
    index_ = std::move(o.index_);
    metadata_ = std::move(o.metadata_);
    o.map_ = nullptr;
    o.map_bytes_ = 0;
    o.data_ = nullptr;
  }
  return *this;
}

const TensorEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

// ---- SafetensorsModel ----

SafetensorsModel::SafetensorsModel(const std::string& folder_or_file) : source_(folder_or_file) {
  auto fail = [&](const std::string& msg) { throw InvalidArgument("model '" + source_ + "': " + msg); };
  std::error_code ec;
  const fs::path root(folder_or_file);
  auto add_file = [&](const fs::path& p) {
    files_.emplace_back(p.string());
    const size_t fi = files_.size() - 1;
    for (const TensorEntry& e : files_[fi].tensors()) {
      auto [it, fresh] = where_.emplace(e.name, fi);
      if (!fresh)
        fail("tensor '" + e.name + "' is in both '" + files_[it->second].path() + "' and '" + p.string() + "'");
    }
  };

  if (fs::is_regular_file(root, ec)) {
    add_file(root);
    return;
  }
  if (!fs::is_directory(root, ec)) fail("no such file or folder");

  const fs::path index = root / "model.safetensors.index.json";
  if (fs::is_regular_file(index, ec)) {
    // The index names each tensor's shard; tensors a shard holds but the index does not list are ignored, as
    // transformers does.
    std::ifstream in(index, std::ios::binary);
    json j;
    try {
      j = json::parse(in);
    } catch (const json::exception& e) {
      fail("'" + index.string() + "' is not valid JSON (" + e.what() + ")");
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      fail("'" + index.string() + "' has no weight_map object");
    std::map<std::string, size_t> shard;  // file name -> files_ position
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        fail("'" + index.string() + "': weight_map entry '" + it.key() + "' is not a string");
      const std::string file = it.value().get<std::string>();
      auto s = shard.find(file);
      if (s == shard.end()) {
        files_.emplace_back((root / file).string());
        s = shard.emplace(file, files_.size() - 1).first;
      }
      if (!files_[s->second].find(it.key()))
        fail("'" + index.string() + "' places tensor '" + it.key() + "' in '" + file + "', which does not hold it");
      where_[it.key()] = s->second;
    }
    return;
  }
  if (fs::is_regular_file(root / "model.safetensors", ec)) {
    add_file(root / "model.safetensors");
    return;
  }
  std::vector<fs::path> shards;
  for (const auto& entry : fs::directory_iterator(root, ec))
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors") shards.push_back(entry.path());
  if (shards.empty()) fail("the folder holds no .safetensors file");
  std::sort(shards.begin(), shards.end());
  for (const fs::path& p : shards) add_file(p);
}

const TensorEntry* SafetensorsModel::find(const std::string& name, const SafetensorsFile** file) const {
  auto it = where_.find(name);
  if (it == where_.end()) return nullptr;
  if (file) *file = &files_[it->second];
  return files_[it->second].find(name);
}

std::vector<std::string> SafetensorsModel::names() const {
  std::vector<std::string> v;
  v.reserve(where_.size());
  for (const auto& [name, file] : where_) v.push_back(name);
  return v;
}

std::vector<uint16_t> SafetensorsModel::read_bf16(const std::string& name, const std::vector<int64_t>& shape) const {
  const SafetensorsFile* f = nullptr;
  const TensorEntry* e = find(name, &f);
  if (!e)
    throw InvalidArgument("tensor '" + name + "' not found in '" + source_ + "' (it holds " +
                          std::to_string(where_.size()) + " tensors)");
  const std::string where = "tensor '" + name + "' in '" + f->path() + "'";
  if (e->shape != shape)
    throw InvalidArgument(where + ": shape " + shape_string(e->shape) + ", expected " + shape_string(shape));
  const int64_t n = e->numel();
  const uint8_t* src = f->data(*e);
  std::vector<uint16_t> out(static_cast<size_t>(n));
  // memcpy per element: the data are not necessarily aligned for their type.
  switch (e->dtype) {
    case DType::BF16:
      if (n) std::memcpy(out.data(), src, static_cast<size_t>(n) * 2);
      break;
    case DType::F32:
      for (int64_t i = 0; i < n; ++i) {
        float v;
        std::memcpy(&v, src + 4 * i, 4);
        out[i] = float_to_bf16(v);
      }
      break;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = float_to_bf16(f16_to_float(h));
      }
      break;
    default:
      throw InvalidArgument(where + ": dtype " + to_string(e->dtype) + ", expected BF16, F16 or F32");
  }
  return out;
}

// ---- writing ----

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  auto fail = [&](const std::string& msg) { throw InvalidArgument("writing safetensors '" + path + "': " + msg); };
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = m;
  }
  std::set<std::string> seen;
  std::vector<uint64_t> sizes;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") fail("bad tensor name '" + t.name + "'");
    if (!seen.insert(t.name).second) fail("tensor '" + t.name + "' is given twice");
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) fail("tensor '" + t.name + "' has shape " + shape_string(t.shape) + " with a negative dimension");
      numel *= static_cast<uint64_t>(d);
    }
    const uint64_t bytes = numel * static_cast<uint64_t>(dtype_bytes(t.dtype));
    if (bytes && !t.data) fail("tensor '" + t.name + "' has no data");
    h[t.name] = {{"dtype", to_string(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    sizes.push_back(bytes);
  }
  std::string header;
  try {
    header = h.dump();
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("a name or metadata string is not valid UTF-8 (") + e.what() + ")");
  }
  header.append((8 - header.size() % 8) % 8, ' ');

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail("cannot create the file");
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t{header.size()} >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (size_t i = 0; i < tensors.size(); ++i)
    if (sizes[i]) out.write(static_cast<const char*>(tensors[i].data), static_cast<std::streamsize>(sizes[i]));
  out.close();
  if (!out) fail("write failed");
}

}  // namespace tw
