// Safetensors reader and writer: round trips over every dtype, and malformed files
// rejected with FormatError (never a crash, never another exception type).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "mxmoe/error.h"
#include "mxmoe/random.h"
#include "mxmoe/safetensors.h"

using namespace mxmoe;

namespace {

const std::vector<StDType> kAllDTypes = {
    StDType::BOOL, StDType::U8,  StDType::I8,  StDType::U16, StDType::I16,
    StDType::F16,  StDType::BF16, StDType::U32, StDType::I32, StDType::F32,
    StDType::U64,  StDType::I64, StDType::F64, StDType::F8_E4M3, StDType::F8_E5M2};

std::string temp_path(const std::string& name) {
  return testing::TempDir() + "mxmoe_st_" + std::to_string(::getpid()) + "_" + name;
}

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

std::vector<uint8_t> random_bytes(Rng& rng, size_t n) {
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rng.next_u64());
  return b;
}

// A file from a header text (its length field computed unless given) and data bytes.
std::vector<uint8_t> make_file(const std::string& header, const std::vector<uint8_t>& data,
                               bool override_length = false, uint64_t length = 0) {
  const uint64_t n = override_length ? length : header.size();
  std::vector<uint8_t> f(8 + header.size() + data.size());
  for (int i = 0; i < 8; ++i) f[i] = static_cast<uint8_t>(n >> (8 * i));
  std::copy(header.begin(), header.end(), f.begin() + 8);
  std::copy(data.begin(), data.end(), f.begin() + 8 + static_cast<std::ptrdiff_t>(header.size()));
  return f;
}

// Expect parse() to throw FormatError whose message contains `needle`.
void expect_format_error(const std::vector<uint8_t>& bytes, const std::string& needle) {
  try {
    SafetensorsFile::parse(bytes.data(), bytes.size());
    ADD_FAILURE() << "parse accepted a malformed file; expected an error mentioning '" << needle << "'";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' does not mention '" << needle << "'";
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected FormatError, got another exception: " << e.what();
  }
}

const std::vector<uint8_t> kData16(16, 0x5A);

}  // namespace

TEST(SafetensorsRoundTrip, EveryDtypeShapesAndMetadataSurviveWriteAndOpen) {
  Rng rng(42);
  SafetensorsWriter w;
  std::vector<std::vector<uint8_t>> payloads;
  for (size_t i = 0; i < kAllDTypes.size(); ++i) {
    const StDType t = kAllDTypes[i];
    const std::vector<int64_t> shape = {3, static_cast<int64_t>(i % 4 + 1), 2};
    payloads.push_back(random_bytes(rng, 3 * (i % 4 + 1) * 2 * dtype_size(t)));
    w.add(std::string("t.") + to_string(t), t, shape, payloads.back().data(), payloads.back().size());
  }
  const std::vector<uint8_t> scalar = random_bytes(rng, 4);
  w.add("scalar", StDType::F32, {}, scalar.data(), 4);
  w.add("empty", StDType::BF16, {0, 7}, nullptr, 0);
  w.set_metadata("format", "pt");
  w.set_metadata("mxmoe.note", "unicode \xc3\xa9 and \"quotes\"");
  const std::string path = temp_path("all.safetensors");
  w.write(path);

  const std::vector<uint8_t> raw = read_all(path);
  ASSERT_GE(raw.size(), 8u);
  uint64_t hl = 0;
  for (int i = 7; i >= 0; --i) hl = (hl << 8) | raw[i];
  EXPECT_EQ(hl % 8, 0u) << "header must be padded so the data section is 8-byte aligned";

  const SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.tensors().size(), kAllDTypes.size() + 2);
  for (size_t i = 0; i < kAllDTypes.size(); ++i) {
    const std::string name = std::string("t.") + to_string(kAllDTypes[i]);
    ASSERT_TRUE(f.has(name)) << name;
    const TensorInfo& t = f.info(name);
    EXPECT_EQ(t.dtype, kAllDTypes[i]) << name;
    EXPECT_EQ(t.shape, (std::vector<int64_t>{3, static_cast<int64_t>(i % 4 + 1), 2})) << name;
    EXPECT_EQ(t.end - t.begin, payloads[i].size()) << name;
    EXPECT_EQ(0, std::memcmp(f.data(name), payloads[i].data(), payloads[i].size())) << name;
    EXPECT_EQ(f.expect(name, t.dtype, t.shape), f.data(name));
  }
  EXPECT_EQ(f.info("scalar").numel(), 1);
  EXPECT_EQ(0, std::memcmp(f.data("scalar"), scalar.data(), 4));
  EXPECT_EQ(f.info("empty").numel(), 0);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("mxmoe.note"), "unicode \xc3\xa9 and \"quotes\"");

  // parse() over the same bytes in memory sees the same file.
  const SafetensorsFile g = SafetensorsFile::parse(raw.data(), raw.size());
  EXPECT_EQ(g.tensors().size(), f.tensors().size());
  EXPECT_EQ(g.metadata(), f.metadata());
  std::remove(path.c_str());
}

TEST(SafetensorsRoundTrip, OutputIsDeterministicRegardlessOfInsertionOrder) {
  Rng rng(7);
  const auto a = random_bytes(rng, 12), b = random_bytes(rng, 8);
  SafetensorsWriter w1, w2;
  w1.add("zeta", StDType::U8, {12}, a.data(), a.size());
  w1.add("alpha", StDType::F32, {2}, b.data(), b.size());
  w1.set_metadata("k", "v");
  w2.set_metadata("k", "v");
  w2.add("alpha", StDType::F32, {2}, b.data(), b.size());
  w2.add("zeta", StDType::U8, {12}, a.data(), a.size());
  const std::string p1 = temp_path("order1"), p2 = temp_path("order2");
  w1.write(p1);
  w2.write(p2);
  EXPECT_EQ(read_all(p1), read_all(p2));
  std::remove(p1.c_str());
  std::remove(p2.c_str());
}

TEST(SafetensorsWriter, RejectsBadTensorsWithInvalidArgument) {
  SafetensorsWriter w;
  const std::vector<uint8_t> b(8, 1);
  w.add("x", StDType::U8, {8}, b.data(), 8);
  EXPECT_THROW(w.add("x", StDType::U8, {8}, b.data(), 8), InvalidArgument);     // duplicate
  EXPECT_THROW(w.add("y", StDType::F32, {8}, b.data(), 8), InvalidArgument);    // size mismatch
  EXPECT_THROW(w.add("z", StDType::U8, {-8}, b.data(), 8), InvalidArgument);    // negative dim
  EXPECT_THROW(w.add("", StDType::U8, {8}, b.data(), 8), InvalidArgument);      // empty name
  EXPECT_THROW(w.add("__metadata__", StDType::U8, {8}, b.data(), 8), InvalidArgument);
  try {
    w.add("y", StDType::F32, {8}, b.data(), 8);
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.argument(), "size");
    EXPECT_NE(std::string(e.what()).find("32"), std::string::npos) << e.what();
  }
}

TEST(SafetensorsWriter, FailedWriteThrowsFormatErrorAndLeavesNoFile) {
  SafetensorsWriter w;
  const std::vector<uint8_t> b(4, 1);
  w.add("x", StDType::U8, {4}, b.data(), 4);
  const std::string path = temp_path("no_such_dir") + "/sub/file.safetensors";
  EXPECT_THROW(w.write(path), FormatError);
  EXPECT_TRUE(read_all(path).empty());
}

TEST(SafetensorsWriter, RewritingReplacesTheFileAtomically) {
  const std::string path = temp_path("replace.safetensors");
  const std::vector<uint8_t> a(4, 1), b(8, 2);
  SafetensorsWriter w1, w2;
  w1.add("x", StDType::U8, {4}, a.data(), 4);
  w2.add("y", StDType::U8, {8}, b.data(), 8);
  w1.write(path);
  w2.write(path);
  const SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_FALSE(f.has("x"));
  EXPECT_TRUE(f.has("y"));
  std::remove(path.c_str());
}

TEST(SafetensorsReader, MissingFileAndMissingTensorNameThePathAndTensor) {
  try {
    SafetensorsFile::open("/nonexistent/dir/x.safetensors");
    ADD_FAILURE();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/x.safetensors"), std::string::npos);
  }
  const auto bytes = make_file(R"({"a":{"dtype":"U8","shape":[16],"data_offsets":[0,16]}})", kData16);
  const SafetensorsFile f = SafetensorsFile::parse(bytes.data(), bytes.size());
  try {
    f.info("b");
    ADD_FAILURE();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("'b'"), std::string::npos) << e.what();
  }
}

TEST(SafetensorsReader, ExpectNamesTensorExpectedAndActual) {
  const auto bytes = make_file(R"({"w":{"dtype":"U8","shape":[4,4],"data_offsets":[0,16]}})", kData16);
  const SafetensorsFile f = SafetensorsFile::parse(bytes.data(), bytes.size());
  EXPECT_NO_THROW(f.expect("w", StDType::U8, {4, 4}));
  try {
    f.expect("w", StDType::I8, {4, 4});
    ADD_FAILURE();
  } catch (const FormatError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'w'"), std::string::npos) << m;
    EXPECT_NE(m.find("U8"), std::string::npos) << m;
    EXPECT_NE(m.find("I8"), std::string::npos) << m;
  }
  try {
    f.expect("w", StDType::U8, {2, 8});
    ADD_FAILURE();
  } catch (const FormatError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("[4, 4]"), std::string::npos) << m;
    EXPECT_NE(m.find("[2, 8]"), std::string::npos) << m;
  }
}

TEST(SafetensorsReader, OpensFileWithUnalignedTensorsAndTrailingPadding) {
  // Written by hand: header length not a multiple of 8, tensors packed back to back.
  const auto bytes = make_file(
      R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},"b":{"dtype":"F32","shape":[3],"data_offsets":[3,15]}}  )",
      kData16);
  const SafetensorsFile f = SafetensorsFile::parse(bytes.data(), bytes.size());
  EXPECT_EQ(f.info("b").begin, 3u);
  EXPECT_TRUE(f.metadata().empty());
}

TEST(SafetensorsMalformed, TruncatedLengthField) {
  expect_format_error({}, "shorter than the 8-byte");
  expect_format_error({1, 0, 0}, "shorter than the 8-byte");
}

TEST(SafetensorsMalformed, TruncatedHeader) {
  auto full = make_file(R"({"a":{"dtype":"U8","shape":[16],"data_offsets":[0,16]}})", kData16);
  full.resize(8 + 20);  // cut inside the JSON
  expect_format_error(full, "exceeds");
}

TEST(SafetensorsMalformed, HeaderLengthLargerThanFile) {
  expect_format_error(make_file("{}", {}, true, 1000), "header length 1000 exceeds");
  expect_format_error(make_file("{}", {}, true, ~uint64_t{1}), "exceeds");
  expect_format_error(make_file(R"({"a":1})", {}, true, 3), "not valid JSON");
}

TEST(SafetensorsMalformed, AbsurdHeaderLength) {
  const uint64_t n = (100ull << 20) + 8;
  std::vector<uint8_t> big(8 + n, ' ');
  for (int i = 0; i < 8; ++i) big[i] = static_cast<uint8_t>(n >> (8 * i));
  expect_format_error(big, "limit");
}

TEST(SafetensorsMalformed, BadJson) {
  expect_format_error(make_file(R"({"a": {"dtype": )", kData16), "not valid JSON");
  expect_format_error(make_file(R"({"a": 1} trailing)", kData16), "not valid JSON");
  expect_format_error(make_file("{\"a\xff\": 1}", kData16), "not valid JSON");  // not UTF-8
}

TEST(SafetensorsMalformed, JsonNotAnObject) {
  expect_format_error(make_file("[1, 2, 3]", kData16), "not an object");
  expect_format_error(make_file("\"text\"", kData16), "not an object");
  expect_format_error(make_file(R"({"a": [1]})", kData16), "'a': entry is not an object");
}

TEST(SafetensorsMalformed, MissingFields) {
  expect_format_error(make_file(R"({"a":{"dtype":"U8","shape":[16]}})", kData16), "missing 'data_offsets'");
  expect_format_error(make_file(R"({"a":{"shape":[16],"data_offsets":[0,16]}})", kData16), "missing 'dtype'");
}

TEST(SafetensorsMalformed, UnknownDtype) {
  expect_format_error(make_file(R"({"a":{"dtype":"F4","shape":[16],"data_offsets":[0,16]}})", kData16),
                      "unknown dtype 'F4'");
  expect_format_error(make_file(R"({"a":{"dtype":7,"shape":[16],"data_offsets":[0,16]}})", kData16),
                      "dtype is not a string");
}

TEST(SafetensorsMalformed, NegativeOrNonIntegerShape) {
  expect_format_error(make_file(R"({"a":{"dtype":"U8","shape":[-16],"data_offsets":[0,16]}})", kData16),
                      "non-negative integer");
  expect_format_error(make_file(R"({"a":{"dtype":"U8","shape":[16.0],"data_offsets":[0,16]}})", kData16),
                      "non-negative integer");
  expect_format_error(make_file(R"({"a":{"dtype":"U8","shape":["16"],"data_offsets":[0,16]}})", kData16),
                      "non-negative integer");
  expect_format_error(make_file(R"({"a":{"dtype":"U8","shape":16,"data_offsets":[0,16]}})", kData16),
                      "shape is not an array");
}

// Regression (issue 7): the error message dumped the whole shape value, recursively, so
// a shape entry nested a million arrays deep (a 2 MB header) overflowed the stack. The
// parser itself is iterative; nothing else may recurse on header values.
TEST(SafetensorsMalformed, DeeplyNestedShapeEntryIsRejectedWithoutRecursion) {
  const size_t depth = 1000000;
  const std::string nest = std::string(depth, '[') + std::string(depth, ']');
  expect_format_error(make_file(R"({"a":{"dtype":"U8","shape":[16,)" + nest + R"(],"data_offsets":[0,16]}})", kData16),
                      "shape entry 1 (array) is not a non-negative integer");
  // Deep values elsewhere (an unknown field, metadata) are parsed and dropped or
  // rejected without recursion too.
  expect_format_error(make_file(R"({"__metadata__":{"k":)" + nest + "}}", kData16), "'k' is not a string");
  const auto extra = make_file(R"({"a":{"dtype":"U8","shape":[16],"data_offsets":[0,16],"x":)" + nest + "}}", kData16);
  EXPECT_NO_THROW(SafetensorsFile::parse(extra.data(), extra.size()));
}

TEST(SafetensorsMalformed, AbsurdShapeNumelOverflow) {
  // 2^62 * 2^62 overflows int64; 2^31 * 2^31 * 4 bytes does not but exceeds the data.
  expect_format_error(
      make_file(R"({"a":{"dtype":"U8","shape":[4611686018427387904,4611686018427387904],"data_offsets":[0,16]}})", kData16),
      "needs more bytes");
  expect_format_error(
      make_file(R"({"a":{"dtype":"F32","shape":[2147483648,2147483648],"data_offsets":[0,16]}})", kData16),
      "needs more bytes");
  expect_format_error(
      make_file(R"({"a":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,16]}})", kData16),
      "non-negative integer");
}

TEST(SafetensorsMalformed, DataOffsetsOutOfRange) {
  expect_format_error(make_file(R"({"a":{"dtype":"U8","shape":[16],"data_offsets":[8,24]}})", kData16),
                      "past the data section");
  expect_format_error(make_file(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[99,99]}})", kData16),
                      "past the data section");
  expect_format_error(make_file(R"({"a":{"dtype":"U8","shape":[16],"data_offsets":[0]}})", kData16),
                      "two non-negative integers");
  expect_format_error(make_file(R"({"a":{"dtype":"U8","shape":[16],"data_offsets":[-1,15]}})", kData16),
                      "two non-negative integers");
}

TEST(SafetensorsMalformed, BeginAfterEnd) {
  expect_format_error(make_file(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[12,4]}})", kData16),
                      "begin 12 > end 4");
}

TEST(SafetensorsMalformed, SizeMismatchWithShapeTimesDtype) {
  expect_format_error(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", kData16),
                      "span 4 bytes");
  expect_format_error(make_file(R"({"a":{"dtype":"U8","shape":[2,4],"data_offsets":[0,16]}})", kData16),
                      "needs 8");
}

TEST(SafetensorsMalformed, OverlappingTensors) {
  expect_format_error(
      make_file(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})",
                kData16),
      "overlap");
  // Identical ranges are an overlap too (aliasing tensors).
  expect_format_error(
      make_file(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"I8","shape":[8],"data_offsets":[0,8]}})",
                kData16),
      "overlap");
}

TEST(SafetensorsMalformed, NonStringMetadata) {
  expect_format_error(make_file(R"({"__metadata__":{"k":1}})", kData16), "'k' is not a string");
  expect_format_error(make_file(R"({"__metadata__":["k"]})", kData16), "__metadata__ is not an object");
}

TEST(SafetensorsMalformed, DuplicateNames) {
  expect_format_error(
      make_file(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"a":{"dtype":"U8","shape":[8],"data_offsets":[8,16]}})",
                kData16),
      "duplicate key 'a'");
  expect_format_error(make_file(R"({"__metadata__":{"k":"1","k":"2"}})", kData16), "duplicate key 'k'");
}

// Random byte flips (biased toward the header, where structure lives) and truncations
// of a valid file: every parse succeeds or throws FormatError, and whatever is accepted
// stays inside the buffer.
TEST(SafetensorsFuzz, RandomCorruptionOnlyEverThrowsFormatError) {
  Rng rng(20260101);
  SafetensorsWriter w;
  std::vector<std::vector<uint8_t>> keep;
  for (int i = 0; i < 5; ++i) {
    const StDType t = kAllDTypes[rng.below(kAllDTypes.size())];
    keep.push_back(random_bytes(rng, 6 * dtype_size(t)));
    w.add("model.layers.0.tensor_" + std::to_string(i), t, {2, 3}, keep.back().data(), keep.back().size());
  }
  w.set_metadata("mxmoe.synthetic.seed", "1");
  const std::string path = temp_path("fuzz.safetensors");
  w.write(path);
  const std::vector<uint8_t> valid = read_all(path);
  std::remove(path.c_str());
  uint64_t hl = 0;
  for (int i = 7; i >= 0; --i) hl = (hl << 8) | valid[i];
  const char specials[] = {'{', '}', '[', ']', '"', ',', ':', '-', '0', '9', 'e', '.', '\\', 0};

  int accepted = 0, rejected = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::vector<uint8_t> b = valid;
    const int flips = 1 + static_cast<int>(rng.below(4));
    for (int j = 0; j < flips; ++j) {
      const size_t pos = rng.below(10) < 8 ? static_cast<size_t>(rng.below(8 + hl))
                                           : static_cast<size_t>(rng.below(b.size()));
      const uint64_t how = rng.below(3);
      if (how == 0) b[pos] ^= static_cast<uint8_t>(1u << rng.below(8));
      else if (how == 1) b[pos] = static_cast<uint8_t>(rng.next_u64());
      else b[pos] = static_cast<uint8_t>(specials[rng.below(sizeof specials)]);
    }
    if (rng.below(8) == 0) b.resize(static_cast<size_t>(rng.below(b.size() + 1)));
    try {
      const SafetensorsFile f = SafetensorsFile::parse(b.data(), b.size());
      for (const TensorInfo& t : f.tensors()) {
        ASSERT_LE(t.begin, t.end);
        ASSERT_GE(f.data(t.name), b.data());
        ASSERT_LE(f.data(t.name) + (t.end - t.begin), b.data() + b.size()) << "iteration " << iter;
      }
      ++accepted;
    } catch (const FormatError&) {
      ++rejected;
    } catch (const std::exception& e) {
      FAIL() << "iteration " << iter << ": non-FormatError exception: " << e.what();
    }
  }
  std::printf("fuzz: %d accepted, %d rejected\n", accepted, rejected);
  // Both outcomes must occur, or the loop did not exercise the parser.
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejected, 1000);
}

// ---------------------------------------------------------------- streaming writer

namespace {
// Files in the temp dir whose name starts with `base`'s file name (temporaries included).
int count_files_like(const std::string& base) {
  const std::filesystem::path p(base);
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(p.parent_path()))
    if (e.path().filename().string().rfind(p.filename().string(), 0) == 0) ++n;
  return n;
}
}  // namespace

TEST(SafetensorsStreamWriter, PiecewiseOutOfOrderWritesGiveTheSameBytesAsTheWriter) {
  Rng rng(99);
  const auto a = random_bytes(rng, 64), b = random_bytes(rng, 24);
  SafetensorsWriter w;
  w.add("b.second", StDType::F32, {2, 3}, b.data(), b.size());
  w.add("a.first", StDType::U8, {4, 16}, a.data(), a.size());
  w.set_metadata("k", "v");
  const std::string p1 = temp_path("stream_ref"), p2 = temp_path("stream_out");
  w.write(p1);
  {
    SafetensorsStreamWriter s(p2, {{"a.first", StDType::U8, {4, 16}}, {"b.second", StDType::F32, {2, 3}}}, {{"k", "v"}});
    s.write("b.second", 12, b.data() + 12, 12);
    s.write("a.first", 32, a.data() + 32, 32);
    s.write("b.second", 0, b.data(), 12);
    s.write("a.first", 0, a.data(), 32);
    s.commit();
  }
  EXPECT_EQ(read_all(p1), read_all(p2));
  std::remove(p1.c_str());
  std::remove(p2.c_str());
}

TEST(SafetensorsStreamWriter, RejectsBadWritesAndLeavesNothingWithoutCommit) {
  const std::string path = temp_path("stream_abort");
  const std::vector<uint8_t> bytes(16, 3);
  {
    SafetensorsStreamWriter s(path, {{"t", StDType::U8, {16}}}, {});
    try {
      s.write("t", 8, bytes.data(), 16);  // past the end
      ADD_FAILURE();
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.argument(), "offset");
    }
    try {
      s.write("u", 0, bytes.data(), 1);
      ADD_FAILURE();
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.argument(), "name");
    }
    s.write("t", 0, bytes.data(), 8);
    try {
      s.commit();  // half of "t" unwritten
      ADD_FAILURE();
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("8 of 16"), std::string::npos) << e.what();
    }
    EXPECT_EQ(count_files_like(path), 1) << "only the temporary file exists before commit";
  }
  EXPECT_EQ(count_files_like(path), 0) << "the destructor removes the temporary file";
  EXPECT_THROW(SafetensorsStreamWriter(path, {{"t", StDType::U8, {4}}, {"t", StDType::U8, {4}}}, {}),
               InvalidArgument);
  EXPECT_EQ(count_files_like(path), 0);
}
