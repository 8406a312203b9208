// Regression tests for hostile tensor files and failed writes (issue 10):
// shapes whose sizes overflow, ambiguous safetensors headers, the empty
// buffer, one-line messages, and writes of several files that leave
// everything as it was when any of them cannot be put in place.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/checked_size.h"
#include "io/file_util.h"
#include "moekit/io.h"
#include "util/temp_dir.h"

namespace moekit {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;
using Files = std::vector<std::pair<std::string, std::vector<uint8_t>>>;

class IoHardening : public testing::TempDirTest {
 protected:
  // Every entry of the test's folder, sorted: what a failed write must leave as it was.
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_.path())) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
};

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}
std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}
Bytes bytes_of(const std::string& s) { return Bytes(s.begin(), s.end()); }

Bytes npy_v1(const std::string& dict, size_t data_bytes) {
  Bytes b = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 118, 0};
  b.insert(b.end(), dict.begin(), dict.end());
  while (b.size() < 127) b.push_back(' ');
  b.push_back('\n');
  b.resize(b.size() + data_bytes, 0);
  return b;
}

Bytes safetensors(std::string json, size_t data_bytes) {
  while (json.size() % 8) json.push_back(' ');
  Bytes b(8);
  const uint64_t n = json.size();
  std::memcpy(b.data(), &n, 8);
  b.insert(b.end(), json.begin(), json.end());
  b.resize(b.size() + data_bytes, 0);
  return b;
}

// ------------------------------------------------------------ sizes (defect 2)

TEST(CheckedSize, ProductsThatOverflowAreRefusedEvenWhenEmpty) {
  const std::vector<int64_t> ok = {3, 4, 5};
  EXPECT_EQ(checked_nbytes(ok, 4), 240);
  const std::vector<int64_t> empty = {0, 7};
  EXPECT_EQ(checked_nbytes(empty, 4), 0);
  // Empty, but its strides (4294967296429 x 2749162 elements) overflow int64.
  const std::vector<int64_t> hostile = {0, 4294967296429, 2749162};
  EXPECT_FALSE(checked_nbytes(hostile, 4).has_value());
  const std::vector<int64_t> negative = {2, -1};
  EXPECT_FALSE(checked_nbytes(negative, 1).has_value());
  EXPECT_FALSE(checked_mul(int64_t{1} << 62, 2).has_value());
  EXPECT_EQ(checked_mul(int64_t{1} << 61, 2), int64_t{1} << 62);
}

TEST_F(IoHardening, NpyShapeWhoseStridesOverflowIsDataLoss) {
  const Bytes bytes = npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4294967296429, 2749162), }", 0);
  auto t = io::parse_npy(bytes.data(), bytes.size(), "hostile.npy");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(t.status().message().find("shape (0, 4294967296429, 2749162) is too large"), std::string::npos)
      << t.status().to_string();
  write_text(file("hostile.npy"), std::string(bytes.begin(), bytes.end()));
  auto r = io::read_npy(file("hostile.npy"));
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  auto info = io::read_npy_info(file("hostile.npy"));
  EXPECT_EQ(info.status().code(), StatusCode::kDataLoss);
}

TEST_F(IoHardening, SafetensorsShapeWhoseStridesOverflowIsDataLoss) {
  const Bytes file =
      safetensors(R"({"w":{"dtype":"F32","shape":[0,4398046511104,4398046511104],"data_offsets":[0,0]}})", 0);
  auto f = io::SafetensorsFile::parse(file.data(), file.size(), "hostile.safetensors");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(f.status().message().find("is too large"), std::string::npos) << f.status().to_string();
}

// parse_borrowed reads the caller's bytes in place: the same checks as parse
// (a hostile header is refused alike), and views point into the caller's buffer.
TEST_F(IoHardening, SafetensorsParseBorrowedChecksAlikeAndReadsInPlace) {
  const Bytes hostile =
      safetensors(R"({"w":{"dtype":"F32","shape":[0,4398046511104,4398046511104],"data_offsets":[0,0]}})", 0);
  auto bad = io::SafetensorsFile::parse_borrowed(hostile.data(), hostile.size(), "hostile.safetensors");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(bad.status().message(),
            io::SafetensorsFile::parse(hostile.data(), hostile.size(), "hostile.safetensors").status().message());

  Bytes file = safetensors(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8);
  const float values[2] = {1.5f, -2.0f};
  std::memcpy(file.data() + file.size() - 8, values, 8);
  auto f = io::SafetensorsFile::parse_borrowed(file.data(), file.size(), "image");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  auto v = f->view("w");
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ(static_cast<const uint8_t*>(v->data), file.data() + file.size() - 8);  // no copy
  auto r = f->read("w");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->data<float>()[0], 1.5f);
  EXPECT_EQ(r->data<float>()[1], -2.0f);
}

// of_views: tensors the caller holds, read as a borrowed image without one.
// Views point at the caller's tensors, read() copies them, dtypes moekit does
// not load keep their stored name and shape, and bad input is refused by name.
TEST_F(IoHardening, SafetensorsOfViewsReadsTheCallersTensorsInPlace) {
  const uint16_t bf16[3] = {0x3f80, 0xc000, 0x0000};
  const float f32[2] = {0.25f, -8.0f};
  const int64_t i64[2] = {7, -1};
  std::vector<io::NamedTensor> ts = {
      {"b", TensorView::contiguous(const_cast<uint16_t*>(bf16), DType::kBF16, {3}), "", {}},
      {"f", TensorView::contiguous(const_cast<float*>(f32), DType::kF32, {1, 2}), "", {}},
      {"i", TensorView::contiguous(const_cast<int64_t*>(i64), DType::kU8, {16}), "I64", std::vector<int64_t>{2}},
      {"e", TensorView::contiguous(nullptr, DType::kF32, {0, 4}), "", {}}};
  auto f = io::SafetensorsFile::of_views(ts, "block");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_TRUE(f->borrowed());
  auto vb = f->view("b");
  auto vf = f->view("f");
  ASSERT_TRUE(vb.ok() && vf.ok());
  EXPECT_EQ(vb->data, static_cast<const void*>(bf16));
  EXPECT_EQ(vf->data, static_cast<const void*>(f32));
  EXPECT_EQ(vf->shape_string(), "[1, 2]");
  auto rf = f->read("f");
  ASSERT_TRUE(rf.ok());
  EXPECT_EQ(rf->data<float>()[1], -8.0f);
  const io::SafetensorsEntry* ei = f->find("i");
  ASSERT_NE(ei, nullptr);
  EXPECT_EQ(ei->dtype_name, "I64");
  EXPECT_EQ(ei->shape, std::vector<int64_t>{2});
  EXPECT_FALSE(ei->dtype.has_value());
  auto bytes = f->bytes("i");
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(static_cast<const void*>(*bytes), static_cast<const void*>(i64));
  ASSERT_NE(f->find("e"), nullptr);
  EXPECT_EQ(f->find("e")->nbytes, 0u);

  std::vector<io::NamedTensor> twice = {ts[0], ts[0]};
  auto dup = io::SafetensorsFile::of_views(twice, "block");
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("name used twice"), std::string::npos) << dup.status().to_string();
  std::vector<io::NamedTensor> odd = {{"i", ts[2].tensor, "I65", std::vector<int64_t>{2}}};
  auto bad = io::SafetensorsFile::of_views(odd, "block");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("stored_dtype"), std::string::npos) << bad.status().to_string();
}

// ------------------------------------------------------------ empty input (defect 9)

TEST(NpyEmpty, NullAndZeroBytesIsDataLossWithoutTouchingThePointer) {
  auto t = io::parse_npy(nullptr, 0, "empty.npy");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(t.status().message().find("empty file"), std::string::npos) << t.status().to_string();
  auto s = io::SafetensorsFile::parse(nullptr, 0, "empty.safetensors");
  EXPECT_EQ(s.status().code(), StatusCode::kDataLoss);
}

// ------------------------------------------------------------ one line (defect 11)

TEST(NpyMessages, HeaderErrorsAreOneLineWithoutRawBytes) {
  // A header whose bad part holds a newline and bytes that are not text.
  const Bytes file = npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)\n\x01\xfe garbage", 8);
  auto t = io::parse_npy(file.data(), file.size(), "bad.npy");
  ASSERT_FALSE(t.ok());
  const std::string m = t.status().message();
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  for (unsigned char c : m) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << "byte " << int(c) << " in: " << m;
  EXPECT_NE(m.find("bad .npy header: expected ',' or '}' at offset 55"), std::string::npos) << m;
  EXPECT_NE(m.find("(near \"\\x01\\xfe garbage"), std::string::npos) << m;  // the excerpt, escaped
  // An unknown key with control characters in it: escaped too.
  const Bytes key = npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'a\tb': 1}", 8);
  auto k = io::parse_npy(key.data(), key.size(), "key.npy");
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find("unexpected key 'a\\x09b'"), std::string::npos) << k.status().message();
}

// ------------------------------------------------------------ ambiguous headers (defect 5)

TEST(SafetensorsHeader, DuplicateKeysAndNulBytesAreRefused) {
  struct Bad {
    std::string json;
    std::string needle;
  };
  const std::vector<Bad> bad = {
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       "key 'w' appears twice"},
      {R"({"w":{"dtype":"F32","dtype":"I32","shape":[1],"data_offsets":[0,4]}})", "key 'dtype' appears twice"},
      {R"({"__metadata__":{"a":"1","a":"2"}})", "key 'a' appears twice"},
      {R"({"__metadata__":{},"__metadata__":{"a":"1"}})", "key '__metadata__' appears twice"},
      {std::string(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})") + std::string(1, '\0') +
           R"(,"v":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       "NUL byte at offset 54"},
      {std::string(1, '\0') + "{}", "NUL byte at offset 0"},
      {R"({} {})", "not valid JSON"},
      // The writer refuses an empty name, so the reader does too (found by fuzzing).
      {R"({"":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})", "a tensor has an empty name"},
  };
  for (const Bad& b : bad) {
    const Bytes file = safetensors(b.json, 8);
    auto f = io::SafetensorsFile::parse(file.data(), file.size(), "case.safetensors");
    ASSERT_FALSE(f.ok()) << b.needle;
    EXPECT_EQ(f.status().code(), StatusCode::kDataLoss) << f.status().to_string();
    EXPECT_NE(f.status().message().find(b.needle), std::string::npos) << f.status().to_string();
  }
  // Trailing spaces (the format's padding) stay fine.
  const Bytes ok = safetensors(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}    )", 4);
  EXPECT_TRUE(io::SafetensorsFile::parse(ok.data(), ok.size(), "ok").ok());
}

// ------------------------------------------------------------ lookups by name (defect 10)

TEST(SafetensorsLookup, ManyTensorsAreFoundByNameInLogTime) {
  // 98301 tensors, as a per-expert checkpoint with E = 32767 has: every name
  // found. A linear find() made this 98301^2 / 2 string comparisons.
  constexpr int kTensors = 98301;
  std::string json = "{";
  for (int i = 0; i < kTensors; ++i) {
    json += (i ? ",\"" : "\"") + std::string("model.layers.3.mlp.experts.") + std::to_string(i) +
            ".down_proj.weight\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[" + std::to_string(i) + "," +
            std::to_string(i + 1) + "]}";
  }
  json += "}";
  const Bytes file = safetensors(json, kTensors);
  auto f = io::SafetensorsFile::parse(file.data(), file.size(), "many");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  const auto t0 = std::chrono::steady_clock::now();
  int found = 0;
  for (int i = kTensors - 1; i >= 0; --i) {
    const auto* e = f->find("model.layers.3.mlp.experts." + std::to_string(i) + ".down_proj.weight");
    found += e != nullptr && e->offset == static_cast<uint64_t>(i);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(found, kTensors);
  EXPECT_EQ(f->find("model.layers.3.mlp.experts.0.up_proj.weight"), nullptr);
  // NOTE: a bound 50x above what the index takes (~0.1 s under sanitizers);
  // the linear search took ~40 s here.
  EXPECT_LT(s, 5.0) << "looking up " << kTensors << " names took " << s << " s";
}

// ------------------------------------------------------------ all or nothing (defect 1, 6)

TEST_F(IoHardening, ALaterDestinationThatIsAFolderChangesNothing) {
  write_text(file("a.npy"), "old a");
  fs::create_directories(file("b.npy"));
  const std::vector<std::string> before = listing();
  const Status s = io::write_files_atomic({{file("a.npy"), bytes_of("new a")}, {file("b.npy"), bytes_of("new b")},
                                           {file("c.npy"), bytes_of("new c")}});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("is a directory"), std::string::npos) << s.to_string();
  EXPECT_EQ(read_text(file("a.npy")), "old a");
  EXPECT_EQ(listing(), before);  // no temporary, no c.npy
}

TEST_F(IoHardening, ACommitThatFailsHalfWayRestoresEveryEarlierFile) {
  write_text(file("a.npy"), "old a");
  write_text(file("c.npy"), "old c");
  const std::vector<std::string> before = listing();
  // The third rename fails, after a.npy was replaced and b.npy created.
  static int renames = 0;
  renames = 0;
  const io::detail::RenameFn fail_third = [](const char* from, const char* to) {
    if (++renames == 3) {
      errno = EIO;
      return -1;
    }
    return std::rename(from, to);
  };
  const Files files = {{file("a.npy"), bytes_of("new a")},
                       {file("b.npy"), bytes_of("new b")},
                       {file("c.npy"), bytes_of("new c")}};
  const Status s = io::detail::write_files_atomic(files, fail_third);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(renames, 3);
  EXPECT_NE(s.message().find("no output was changed"), std::string::npos) << s.to_string();
  EXPECT_EQ(read_text(file("a.npy")), "old a");
  EXPECT_EQ(read_text(file("c.npy")), "old c");
  EXPECT_EQ(listing(), before);  // b.npy removed again, no temporary or backup left
  // The same call with a rename that works replaces all three.
  ASSERT_TRUE(io::write_files_atomic(files).ok());
  EXPECT_EQ(read_text(file("a.npy")), "new a");
  EXPECT_EQ(read_text(file("b.npy")), "new b");
  EXPECT_EQ(read_text(file("c.npy")), "new c");
  EXPECT_EQ(listing(), (std::vector<std::string>{"a.npy", "b.npy", "c.npy"}));
}

TEST_F(IoHardening, TwoOutputsNamingOneFileAreRefusedBeforeAnyWrite) {
  write_text(file("x.npy"), "old");
  fs::create_directories(file("sub"));
  fs::create_symlink(file("x.npy"), file("link.npy"));
  ASSERT_EQ(::link(file("x.npy").c_str(), file("hard.npy").c_str()), 0);
  const std::vector<std::string> before = listing();
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {file("x.npy"), file("x.npy")},                  // the same string
      {file("x.npy"), file("sub/../x.npy")},           // the same path
      {file("x.npy"), file("link.npy")},               // a symlink to it
      {file("x.npy"), file("hard.npy")},               // a hard link to it
      {file("new.npy"), file("sub/../new.npy")},       // a file that does not exist yet
  };
  for (const auto& [a, b] : pairs) {
    const Status s = io::write_files_atomic({{a, bytes_of("1")}, {b, bytes_of("2")}});
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << a << " / " << b << ": " << s.to_string();
    EXPECT_NE(s.message().find("the same file as output"), std::string::npos) << s.to_string();
    EXPECT_EQ(read_text(file("x.npy")), "old");
    EXPECT_EQ(listing(), before);
  }
}

TEST_F(IoHardening, EmptyPathsAndMissingFoldersAreRefusedBeforeAnyWrite) {
  write_text(file("a.npy"), "old a");
  const std::vector<std::string> before = listing();
  Status s = io::write_files_atomic({{file("a.npy"), bytes_of("new")}, {"", bytes_of("x")}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("output path is empty"), std::string::npos);
  s = io::write_files_atomic({{file("a.npy"), bytes_of("new")}, {file("no/such/b.npy"), bytes_of("x")}});
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.to_string();
  EXPECT_NE(s.message().find("does not exist"), std::string::npos);
  s = io::write_files_atomic({{file("a.npy"), bytes_of("new")}, {file("d/"), bytes_of("x")}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_EQ(read_text(file("a.npy")), "old a");
  EXPECT_EQ(listing(), before);
}

}  // namespace
}  // namespace moekit
