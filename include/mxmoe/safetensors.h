// mxmoe/safetensors.h — a bounds-checked safetensors reader (memory-mapped) and writer.
// Every header field, offset, dtype and shape is checked; malformed files throw
// FormatError with a message, never crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace mxmoe {

enum class StDType : int { BOOL, U8, I8, U16, I16, F16, BF16, U32, I32, F32, U64, I64, F64, F8_E4M3, F8_E5M2 };
const char* to_string(StDType t);
size_t dtype_size(StDType t);

struct TensorInfo {
  std::string name;
  StDType dtype = StDType::U8;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets inside the data section
  int64_t numel() const;
};

/// A parsed safetensors file. open() maps the file read-only; parse() takes bytes in
/// memory (used by the fuzzer and the tests).
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::string& path);
  static SafetensorsFile parse(const uint8_t* data, size_t size);  // copies nothing; data must outlive
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  bool has(const std::string& name) const;
  /// Throws FormatError naming the tensor when absent.
  const TensorInfo& info(const std::string& name) const;
  /// Raw bytes of a tensor (size = end - begin).
  const uint8_t* data(const std::string& name) const;
  /// Check the tensor's dtype and shape; throws FormatError naming what differs.
  const uint8_t* expect(const std::string& name, StDType dtype, const std::vector<int64_t>& shape) const;
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  struct Mapping;
  std::unique_ptr<Mapping> mapping_;
  const uint8_t* data_section_ = nullptr;
  size_t data_size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

/// Writes a file whose tensors (name, dtype, shape) are declared up front and whose bytes
/// are then filled piece by piece in any order, so files larger than memory (a full-size
/// Kimi-K3 layer is ~16 GB) can be generated. The file is written under a temporary name
/// and renamed into place by commit(); without commit() (an exception on the way) the
/// temporary file is removed and `path` is untouched. Same bytes as SafetensorsWriter for
/// the same content: names sorted, header padded to 8 bytes.
class SafetensorsStreamWriter {
 public:
  struct Decl {
    std::string name;
    StDType dtype = StDType::U8;
    std::vector<int64_t> shape;
  };
  /// Throws InvalidArgument on bad declarations, FormatError on I/O failure.
  SafetensorsStreamWriter(const std::string& path, std::vector<Decl> tensors,
                          const std::map<std::string, std::string>& metadata);
  SafetensorsStreamWriter(const SafetensorsStreamWriter&) = delete;
  SafetensorsStreamWriter& operator=(const SafetensorsStreamWriter&) = delete;
  ~SafetensorsStreamWriter();
  /// Write `size` bytes at byte `offset` inside tensor `name`.
  void write(const std::string& name, uint64_t offset, const void* bytes, size_t size);
  /// Checks every declared byte was written exactly once, syncs and renames into place.
  void commit();

 private:
  struct Slot { uint64_t begin, size, written; };
  void write_at(uint64_t pos, const void* bytes, size_t size);
  std::string path_, tmp_;
  int fd_ = -1;
  uint64_t data_start_ = 0;
  std::map<std::string, Slot> slots_;
};

class SafetensorsWriter {
 public:
  void add(const std::string& name, StDType dtype, std::vector<int64_t> shape, const void* bytes, size_t size);
  void set_metadata(const std::string& key, const std::string& value);
  void write(const std::string& path) const;  // throws FormatError on I/O failure

 private:
  struct Entry { std::string name; StDType dtype; std::vector<int64_t> shape; std::vector<uint8_t> bytes; };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace mxmoe
