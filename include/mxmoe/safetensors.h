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
