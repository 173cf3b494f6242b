// The safetensors format (what transformers saves models as): read through mmap, and written.
// A file is an 8-byte little-endian header length N, N bytes of JSON header
//   {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}}
// and then the tensors' bytes (offsets relative to the start of the data, after the header).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tileweave/graph/tile_graph.hpp"

namespace tw {

enum class DType { BF16, F16, F32, F64, I8, I16, I32, I64, U8, BOOL };
const char* to_string(DType t);  // the header's spelling: "BF16", "F32", ...
int dtype_bytes(DType t);
DType parse_dtype(const std::string& s);  // InvalidArgument naming an unknown dtype

struct TensorEntry {
  std::string name;
  DType dtype = DType::BF16;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
  int64_t numel() const;
};

// One .safetensors file, memory-mapped read-only; its header is validated on open (every error names the file).
// Movable, not copyable.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&& o) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& o) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorEntry>& tensors() const { return tensors_; }  // in data order
  const TensorEntry* find(const std::string& name) const;               // nullptr if absent
  const uint8_t* data(const TensorEntry& e) const { return data_ + e.begin; }  // not aligned beyond 1 byte
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  void unmap();
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint8_t* data_ = nullptr;
  std::vector<TensorEntry> tensors_;
  std::map<std::string, size_t> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// A model folder: model.safetensors, or shards (model-00001-of-00004.safetensors ...) with or without
// model.safetensors.index.json (its weight_map is used when present, else every *.safetensors is read). A single
// .safetensors file may be named instead of a folder.
class SafetensorsModel {
 public:
  explicit SafetensorsModel(const std::string& folder_or_file);
  const std::string& source() const { return source_; }
  const TensorEntry* find(const std::string& name, const SafetensorsFile** file = nullptr) const;
  // The tensor as bf16 bits (F32/F16 converted with round-to-nearest-even), after checking it exists and its shape
  // equals `shape`: errors name the tensor, the file, and the found vs expected shape/dtype.
  std::vector<uint16_t> read_bf16(const std::string& name, const std::vector<int64_t>& shape) const;
  std::vector<std::string> names() const;  // sorted
  const std::vector<SafetensorsFile>& files() const { return files_; }

 private:
  std::string source_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;  // tensor name -> file
};

struct TensorToWrite {
  std::string name;
  DType dtype = DType::BF16;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // numel * dtype_bytes bytes
};
// Writes the tensors in the given order, contiguous; the header is padded with spaces to a multiple of 8 bytes so
// the data starts aligned.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

std::string shape_string(const std::vector<int64_t>& shape);  // "[2048, 64]"

}  // namespace tw
