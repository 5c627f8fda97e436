// Safetensors reader (memory-mapped, every field bounds-checked) and writer.
//
// File format: u64 little-endian header length N, N bytes of JSON header
//   {"<name>": {"dtype": "U8", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"<key>": "<value>", ...}}
// then the data section; offsets are relative to the start of the data section.
//
// A checkpoint is untrusted input (SPEC §9): nothing read from the header is used as
// an offset or a size before it has been checked against the bytes actually present,
// and every failure is a FormatError naming the tensor and what is wrong.
#include "mxmoe/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "mxmoe/error.h"

namespace mxmoe {

using json = nlohmann::json;
using detail::cat;

namespace {

// Large enough for any real checkpoint's header (tens of thousands of tensors take a
// few MB), small enough that a corrupted length cannot make us parse gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DTypeName {
  StDType type;
  const char* name;
  size_t size;
};
constexpr DTypeName kDTypes[] = {
    {StDType::BOOL, "BOOL", 1}, {StDType::U8, "U8", 1},     {StDType::I8, "I8", 1},
    {StDType::U16, "U16", 2},   {StDType::I16, "I16", 2},   {StDType::F16, "F16", 2},
    {StDType::BF16, "BF16", 2}, {StDType::U32, "U32", 4},   {StDType::I32, "I32", 4},
    {StDType::F32, "F32", 4},   {StDType::U64, "U64", 8},   {StDType::I64, "I64", 8},
    {StDType::F64, "F64", 8},   {StDType::F8_E4M3, "F8_E4M3", 1},
    {StDType::F8_E5M2, "F8_E5M2", 1},
};

bool dtype_from_string(const std::string& s, StDType& out) {
  for (const auto& d : kDTypes) {
    if (s == d.name) {
      out = d.type;
      return true;
    }
  }
  return false;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Tensor names and keys are echoed in messages; a corrupted header may hold anything,
// so keep them short and printable.
std::string printable(const std::string& s) {
  std::string out;
  for (char c : s.substr(0, 120)) {
    const unsigned char u = static_cast<unsigned char>(c);
    out += (u >= 0x20 && u < 0x7f) ? c : '?';
  }
  if (s.size() > 120) out += "...";
  return out;
}

// Product of the dims, or false when it does not fit in int64.
bool checked_numel(const std::vector<int64_t>& shape, int64_t& numel) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) return false;
    n *= d;
  }
  numel = n;
  return true;
}

// Read a JSON integer that must be >= 0 (JSON floats such as 3.0 are rejected: a shape
// of 3.5 must not be silently truncated).
bool json_nonneg_int(const json& v, uint64_t& out) {
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer()) {
    const int64_t s = v.get<int64_t>();
    if (s < 0) return false;
    out = static_cast<uint64_t>(s);
    return true;
  }
  return false;
}

}  // namespace

const char* to_string(StDType t) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d.name;
  return "?";
}

size_t dtype_size(StDType t) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d.size;
  throw InvalidArgument("dtype", cat("unknown safetensors dtype code ", static_cast<int>(t)));
}

int64_t TensorInfo::numel() const {
  int64_t n = 0;
  if (!checked_numel(shape, n)) throw FormatError(cat("tensor '", name, "': shape overflows"));
  return n;
}

// ---------------------------------------------------------------- reader

struct SafetensorsFile::Mapping {
  void* addr = nullptr;
  size_t length = 0;
  ~Mapping() {
    if (addr && addr != MAP_FAILED) munmap(addr, length);
  }
};

SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  // O_NONBLOCK: opening a FIFO (or a device) given as a checkpoint path must not block
  // before the regular-file check below; it has no effect on regular files.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw FormatError(cat(path, ": cannot open: ", std::strerror(errno)));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw FormatError(cat(path, ": cannot stat: ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw FormatError(cat(path, ": not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    throw FormatError(cat(path, ": file is ", size,
                          " bytes, shorter than the 8-byte safetensors header length"));
  }
  auto mapping = std::make_unique<Mapping>();
  mapping->addr = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (mapping->addr == MAP_FAILED) {
    mapping->addr = nullptr;
    throw FormatError(cat(path, ": mmap failed: ", std::strerror(err)));
  }
  mapping->length = size;
  try {
    SafetensorsFile f = parse(static_cast<const uint8_t*>(mapping->addr), size);
    f.mapping_ = std::move(mapping);
    return f;
  } catch (const FormatError& e) {
    throw FormatError(cat(path, ": ", e.what()));
  }
}

SafetensorsFile SafetensorsFile::parse(const uint8_t* data, size_t size) {
  if (data == nullptr && size != 0) throw InvalidArgument("data", "null pointer with non-zero size");
  if (size < 8)
    throw FormatError(cat("safetensors: ", size, " bytes, shorter than the 8-byte header length"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];  // little-endian regardless of host
  if (n > size - 8)
    throw FormatError(cat("safetensors: header length ", n, " exceeds the ", size - 8,
                          " bytes after the length field (truncated or not a safetensors file)"));
  if (n > kMaxHeaderBytes)
    throw FormatError(cat("safetensors: header length ", n, " exceeds the limit of ",
                          kMaxHeaderBytes, " bytes"));
  if (n < 2) throw FormatError(cat("safetensors: header length ", n, " is too small for a JSON object"));

  // nlohmann keeps the last of duplicate keys; a file with two entries of one name is
  // ambiguous (two readers may pick different bytes), so find duplicates while parsing.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  json::parser_callback_t cb = [&](int, json::parse_event_t ev, json& parsed) {
    switch (ev) {
      case json::parse_event_t::object_start: open_objects.emplace_back(); break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string()) {
          const auto& k = parsed.get_ref<const std::string&>();
          if (!open_objects.back().insert(k).second && duplicate.empty()) duplicate = k;
        }
        break;
      default: break;
    }
    return true;
  };
  const char* hb = reinterpret_cast<const char*>(data + 8);
  json header;
  try {
    header = json::parse(hb, hb + n, cb, /*allow_exceptions=*/false);
  } catch (const json::exception& ex) {
    throw FormatError(cat("safetensors: header is not valid JSON: ", ex.what()));
  }
  if (header.is_discarded())
    throw FormatError("safetensors: header is not valid JSON (or not UTF-8)");
  if (!header.is_object()) throw FormatError("safetensors: header JSON is not an object");
  if (!duplicate.empty())
    throw FormatError(cat("safetensors: duplicate key '", printable(duplicate), "' in the header"));

  SafetensorsFile f;
  f.data_section_ = data + 8 + n;
  f.data_size_ = size - 8 - n;
  const uint64_t dsize = f.data_size_;

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) throw FormatError("safetensors: __metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          throw FormatError(cat("safetensors: __metadata__ value of '", printable(m.key()),
                                "' is not a string (", m.value().type_name(), ")"));
        f.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string tn = cat("tensor '", printable(name), "'");
    if (name.empty()) throw FormatError("safetensors: tensor with an empty name");
    if (!v.is_object()) throw FormatError(cat("safetensors: ", tn, ": entry is not an object"));
    for (const char* key : {"dtype", "shape", "data_offsets"})
      if (!v.contains(key)) throw FormatError(cat("safetensors: ", tn, ": missing '", key, "'"));

    TensorInfo t;
    t.name = name;
    const json& jd = v["dtype"];
    if (!jd.is_string()) throw FormatError(cat("safetensors: ", tn, ": dtype is not a string"));
    if (!dtype_from_string(jd.get<std::string>(), t.dtype))
      throw FormatError(cat("safetensors: ", tn, ": unknown dtype '",
                            printable(jd.get<std::string>()), "'"));

    const json& js = v["shape"];
    if (!js.is_array()) throw FormatError(cat("safetensors: ", tn, ": shape is not an array"));
    for (size_t i = 0; i < js.size(); ++i) {
      const json& d = js[i];
      uint64_t u = 0;
      // Only a number is echoed: dump() of an arbitrary value recurses once per nesting
      // level, so a 2 MB header of '[' overflowed the stack
      // (test: SafetensorsMalformed.DeeplyNestedShapeEntryIsRejectedWithoutRecursion).
      if (!json_nonneg_int(d, u) || u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        throw FormatError(cat("safetensors: ", tn, ": shape entry ", i, " (",
                              d.is_number() ? d.dump() : std::string(d.type_name()),
                              ") is not a non-negative integer"));
      t.shape.push_back(static_cast<int64_t>(u));
    }
    int64_t numel = 0;
    const uint64_t esize = dtype_size(t.dtype);
    if (!checked_numel(t.shape, numel) || static_cast<uint64_t>(numel) > dsize / esize)
      throw FormatError(cat("safetensors: ", tn, ": shape ", shape_str(t.shape), " of ",
                            to_string(t.dtype), " needs more bytes than the data section holds (",
                            dsize, ")"));

    const json& jo = v["data_offsets"];
    uint64_t b = 0, e = 0;
    if (!jo.is_array() || jo.size() != 2 || !json_nonneg_int(jo[0], b) || !json_nonneg_int(jo[1], e))
      throw FormatError(cat("safetensors: ", tn,
                            ": data_offsets must be two non-negative integers [begin, end]"));
    if (b > e)
      throw FormatError(cat("safetensors: ", tn, ": data_offsets begin ", b, " > end ", e));
    if (e > dsize)
      throw FormatError(cat("safetensors: ", tn, ": data_offsets end ", e,
                            " is past the data section (", dsize, " bytes)"));
    if (e - b != static_cast<uint64_t>(numel) * esize)
      throw FormatError(cat("safetensors: ", tn, ": data_offsets span ", e - b, " bytes but shape ",
                            shape_str(t.shape), " of ", to_string(t.dtype), " needs ",
                            static_cast<uint64_t>(numel) * esize));
    t.begin = b;
    t.end = e;
    f.index_[name] = f.tensors_.size();
    f.tensors_.push_back(std::move(t));
  }

  // Two tensors sharing bytes would alias silently (a writer bug or a crafted file).
  std::vector<const TensorInfo*> order;
  for (const auto& t : f.tensors_)
    if (t.end > t.begin) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i]->begin < order[i - 1]->end)
      throw FormatError(cat("safetensors: tensors '", printable(order[i - 1]->name), "' [",
                            order[i - 1]->begin, ", ", order[i - 1]->end, ") and '",
                            printable(order[i]->name), "' [", order[i]->begin, ", ",
                            order[i]->end, ") overlap"));
  return f;
}

bool SafetensorsFile::has(const std::string& name) const { return index_.count(name) != 0; }

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw FormatError(cat("tensor '", name, "' not found"));
  return tensors_[it->second];
}

const uint8_t* SafetensorsFile::data(const std::string& name) const {
  return data_section_ + info(name).begin;
}

const uint8_t* SafetensorsFile::expect(const std::string& name, StDType dtype,
                                       const std::vector<int64_t>& shape) const {
  const TensorInfo& t = info(name);
  if (t.dtype != dtype)
    throw FormatError(cat("tensor '", name, "': dtype ", to_string(t.dtype), ", expected ",
                          to_string(dtype)));
  if (t.shape != shape)
    throw FormatError(cat("tensor '", name, "': shape ", shape_str(t.shape), ", expected ",
                          shape_str(shape)));
  return data_section_ + t.begin;
}

// ---------------------------------------------------------------- writer

void SafetensorsWriter::add(const std::string& name, StDType dtype, std::vector<int64_t> shape,
                            const void* bytes, size_t size) {
  MXMOE_CHECK_ARG(!name.empty() && name != "__metadata__", "name", "'", name,
                  "' is not a valid tensor name");
  for (const auto& e : entries_)
    MXMOE_CHECK_ARG(e.name != name, "name", "tensor '", name, "' added twice");
  int64_t numel = 0;
  MXMOE_CHECK_ARG(checked_numel(shape, numel), "shape",
                  "tensor '", name, "': shape ", shape_str(shape), " is negative or overflows");
  const size_t esize = dtype_size(dtype);
  MXMOE_CHECK_ARG(static_cast<uint64_t>(numel) <= std::numeric_limits<size_t>::max() / esize &&
                      static_cast<size_t>(numel) * esize == size,
                  "size", "tensor '", name, "': ", size, " bytes given, shape ", shape_str(shape),
                  " of ", to_string(dtype), " needs ", static_cast<uint64_t>(numel) * esize);
  MXMOE_CHECK_ARG(bytes != nullptr || size == 0, "bytes", "tensor '", name, "': null data");
  Entry e{name, dtype, std::move(shape), {}};
  if (size) e.bytes.assign(static_cast<const uint8_t*>(bytes), static_cast<const uint8_t*>(bytes) + size);
  entries_.push_back(std::move(e));
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

void SafetensorsWriter::write(const std::string& path) const {
  std::vector<SafetensorsStreamWriter::Decl> decls;
  for (const auto& e : entries_) decls.push_back({e.name, e.dtype, e.shape});
  SafetensorsStreamWriter w(path, std::move(decls), metadata_);
  for (const auto& e : entries_)
    if (!e.bytes.empty()) w.write(e.name, 0, e.bytes.data(), e.bytes.size());
  w.commit();
}

// ---------------------------------------------------------------- streaming writer

namespace {
std::atomic<uint64_t> g_tmp_counter{0};
}

SafetensorsStreamWriter::SafetensorsStreamWriter(const std::string& path, std::vector<Decl> tensors,
                                                 const std::map<std::string, std::string>& metadata)
    : path_(path) {
  // Names sorted so the same tensors always give the same bytes.
  std::sort(tensors.begin(), tensors.end(), [](const Decl& a, const Decl& b) { return a.name < b.name; });
  json header = json::object();
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Decl& d = tensors[i];
    MXMOE_CHECK_ARG(!d.name.empty() && d.name != "__metadata__", "name", "'", d.name,
                    "' is not a valid tensor name");
    MXMOE_CHECK_ARG(i == 0 || tensors[i - 1].name != d.name, "name", "tensor '", d.name,
                    "' declared twice");
    int64_t numel = 0;
    const uint64_t esize = dtype_size(d.dtype);
    MXMOE_CHECK_ARG(checked_numel(d.shape, numel) &&
                        static_cast<uint64_t>(numel) <= (std::numeric_limits<uint64_t>::max() / 2) / esize,
                    "shape", "tensor '", d.name, "': shape ", shape_str(d.shape), " is negative or overflows");
    const uint64_t size = static_cast<uint64_t>(numel) * esize;
    header[d.name] = {{"dtype", to_string(d.dtype)}, {"shape", d.shape}, {"data_offsets", {offset, offset + size}}};
    slots_[d.name] = Slot{offset, size, 0};
    offset += size;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& ex) {
    throw FormatError(cat(path, ": cannot encode the header (names and metadata must be UTF-8): ", ex.what()));
  }
  // Pad with spaces so the data section starts 8-byte aligned (as the reference writer
  // does), letting readers use F32/I64 tensors in place.
  while (text.size() % 8) text += ' ';
  data_start_ = 8 + text.size();

  tmp_ = cat(path, ".tmp.", ::getpid(), ".", g_tmp_counter.fetch_add(1));
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw FormatError(cat(tmp_, ": cannot create: ", std::strerror(errno)));
  try {
    uint8_t len8[8];
    for (int i = 0; i < 8; ++i) len8[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
    std::string head(reinterpret_cast<const char*>(len8), 8);
    head += text;
    if (::ftruncate(fd_, static_cast<off_t>(data_start_ + offset)) != 0)
      throw FormatError(cat(tmp_, ": cannot size the file to ", data_start_ + offset, " bytes: ",
                            std::strerror(errno)));
    write_at(0, head.data(), head.size());
  } catch (...) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
    fd_ = -1;
    throw;
  }
}

SafetensorsStreamWriter::~SafetensorsStreamWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void SafetensorsStreamWriter::write_at(uint64_t pos, const void* bytes, size_t size) {
  const char* c = static_cast<const char*>(bytes);
  while (size > 0) {
    const ssize_t w = ::pwrite(fd_, c, size, static_cast<off_t>(pos));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw FormatError(cat(tmp_, ": write failed: ", std::strerror(errno)));
    }
    c += w;
    pos += static_cast<uint64_t>(w);
    size -= static_cast<size_t>(w);
  }
}

void SafetensorsStreamWriter::write(const std::string& name, uint64_t offset, const void* bytes, size_t size) {
  if (fd_ < 0) throw InvalidArgument("writer", cat("write of '", name, "' after commit or failure"));
  auto it = slots_.find(name);
  MXMOE_CHECK_ARG(it != slots_.end(), "name", "tensor '", name, "' was not declared");
  Slot& s = it->second;
  MXMOE_CHECK_ARG(offset <= s.size && size <= s.size - offset, "offset", "tensor '", name, "': bytes [",
                  offset, ", ", offset + size, ") are outside its ", s.size, " bytes");
  MXMOE_CHECK_ARG(bytes != nullptr || size == 0, "bytes", "tensor '", name, "': null data");
  write_at(data_start_ + s.begin + offset, bytes, size);
  s.written += size;
}

void SafetensorsStreamWriter::commit() {
  if (fd_ < 0) throw InvalidArgument("writer", "commit after commit or failure");
  for (const auto& [name, s] : slots_)
    MXMOE_CHECK_ARG(s.written == s.size, "writer", "tensor '", name, "': ", s.written, " of ", s.size,
                    " bytes written");
  const int fd = fd_;
  fd_ = -1;  // from here on, failures clean up explicitly
  auto fail = [&](const char* what, int err) {
    ::unlink(tmp_.c_str());
    throw FormatError(cat(tmp_, ": ", what, ": ", std::strerror(err)));
  };
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    fail("fsync failed", err);
  }
  if (::close(fd) != 0) fail("close failed", errno);
  // rename() replaces the destination atomically: readers see the old or the new file.
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail("cannot rename into place", errno);
}

}  // namespace mxmoe
