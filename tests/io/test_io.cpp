// .npy and safetensors: round trips of every dtype, files built byte by byte
// here (the layouts numpy.save and the safetensors library write), and every
// rejection: missing, bad magic/header, unsupported dtype, Fortran order,
// truncation at every byte, overlapping or out-of-range offsets.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "moekit/io.h"
#include "util/temp_dir.h"
#include "util/test_util.h"

namespace moekit {
namespace {

namespace fs = std::filesystem;
using io::Bf16Storage;

using Bytes = std::vector<uint8_t>;

// A per-test folder; count() is how many entries it holds.
class TempDir : public testing::ScopedTempDir {
 public:
  size_t count() const { return std::distance(fs::directory_iterator(path()), fs::directory_iterator()); }
};

void write_bytes(const std::string& path, const Bytes& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}
Bytes read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}
Bytes raw(const HostTensor& t) { return Bytes(t.data<uint8_t>(), t.data<uint8_t>() + t.nbytes()); }
// resize + memcpy rather than insert(): GCC 12 warns falsely on small inserts.
void append_raw(Bytes& b, const void* p, size_t n) {
  const size_t at = b.size();
  b.resize(at + n);
  if (n) std::memcpy(b.data() + at, p, n);
}
void append(Bytes& b, const std::string& s) { append_raw(b, s.data(), s.size()); }
template <typename T>
void append_values(Bytes& b, std::initializer_list<T> values) {
  for (T v : values) append_raw(b, &v, sizeof(T));
}

// Random contents for any dtype, seeded from the case.
HostTensor random_any(DType dtype, std::vector<int64_t> shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  HostTensor t(dtype, std::move(shape));
  uint8_t* p = t.data<uint8_t>();
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(rng());
  // Keep float payloads finite so value comparisons are meaningful.
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int64_t i = 0; i < t.numel(); ++i) {
    switch (dtype) {
      case DType::kF32: t.data<float>()[i] = normal(rng); break;
      case DType::kF16: t.data<uint16_t>()[i] = f32_to_f16_bits(normal(rng)); break;
      case DType::kBF16: t.data<uint16_t>()[i] = f32_to_bf16_bits(normal(rng)); break;
      case DType::kF8E4M3: t.data<uint8_t>()[i] = f32_to_f8e4m3_bits(normal(rng)); break;
      case DType::kI32:
      case DType::kI16:
      case DType::kU8: break;
    }
  }
  return t;
}

std::string status_text(const Status& s) { return s.to_string(); }

// ------------------------------------------------------------------ .npy

// numpy.save's layout for format 1.0: magic, version 1.0, a 2-byte dict length,
// the dict padded with spaces and ended by '\n' so the data starts at byte 128
// (for these short dicts). Checked against numpy 2.x output byte for byte.
Bytes numpy_v1_file(const std::string& dict, const Bytes& data) {
  Bytes b = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 118, 0};
  append(b, dict);
  while (b.size() < 127) b.push_back(' ');
  b.push_back('\n');
  append_raw(b, data.data(), data.size());
  return b;
}

// Format 2.0 with a 4-byte length and an arbitrary (unpadded) dict.
Bytes numpy_v2_file(const std::string& dict, const Bytes& data) {
  Bytes b = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0};
  append_values<uint32_t>(b, {static_cast<uint32_t>(dict.size())});
  append(b, dict);
  append_raw(b, data.data(), data.size());
  return b;
}

struct NpyCase {
  DType dtype;
  Bf16Storage bf16;
  std::vector<int64_t> shape;
};

class NpyRoundTrip : public ::testing::TestWithParam<NpyCase> {};

TEST_P(NpyRoundTrip, ReadsBackWhatItWrote) {
  const NpyCase& c = GetParam();
  TempDir dir;
  const uint64_t seed =
      testing::seed_from({static_cast<int64_t>(c.dtype), static_cast<int64_t>(c.bf16), static_cast<int64_t>(c.shape.size()),
                          c.shape.empty() ? 0 : c.shape[0]});
  const HostTensor t = random_any(c.dtype, c.shape, seed);
  const std::string path = dir.file("t.npy");
  ASSERT_TRUE(io::write_npy(path, t.view(), {c.bf16}).ok());
  const Bytes file = read_bytes(path);
  auto back = io::read_npy(path);
  ASSERT_TRUE(back.ok()) << status_text(back.status());
  EXPECT_EQ(back->shape(), c.shape);
  const bool widened = (c.dtype == DType::kBF16 && c.bf16 == Bf16Storage::kAsF32) || c.dtype == DType::kF8E4M3;
  if (widened) {
    // Stored as exact f32; narrowing back gives the original bits.
    ASSERT_EQ(back->dtype(), DType::kF32);
    auto narrowed = io::convert(back->view(), c.dtype);
    ASSERT_TRUE(narrowed.ok());
    EXPECT_EQ(raw(*narrowed), raw(t));
  } else {
    ASSERT_EQ(back->dtype(), c.dtype);
    EXPECT_EQ(raw(*back), raw(t));
  }
  // The data starts 64-byte aligned, as numpy.save's files do.
  EXPECT_EQ((file.size() - back->nbytes()) % 64, 0u);
}

std::vector<NpyCase> npy_cases() {
  std::vector<NpyCase> cases;
  const std::vector<std::vector<int64_t>> shapes = {{}, {0, 4}, {7}, {3, 5}, {2, 3, 4}, {1, 1, 1, 9}, {65, 33}};
  for (const auto& s : shapes) {
    for (DType d : {DType::kF32, DType::kF16, DType::kI32, DType::kI16, DType::kU8, DType::kF8E4M3}) {
      cases.push_back({d, Bf16Storage::kAsF32, s});
    }
    cases.push_back({DType::kBF16, Bf16Storage::kAsF32, s});
    cases.push_back({DType::kBF16, Bf16Storage::kRaw, s});
  }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(AllDtypes, NpyRoundTrip, ::testing::ValuesIn(npy_cases()),
                         [](const ::testing::TestParamInfo<NpyCase>& info) {
                           const NpyCase& c = info.param;
                           std::string name = dtype_name(c.dtype);
                           if (c.dtype == DType::kBF16) name += c.bf16 == Bf16Storage::kRaw ? "_raw" : "_as_f32";
                           name += "_shape";
                           for (int64_t d : c.shape) name += "_" + std::to_string(d);
                           return name;
                         });

TEST(Npy, ReadsNumpyFormat1File) {
  Bytes data;
  append_values<float>(data, {0, 1, 2, 3, 4, 5});
  const Bytes file = numpy_v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", data);
  auto t = io::parse_npy(file.data(), file.size(), "fixture");
  ASSERT_TRUE(t.ok()) << status_text(t.status());
  ASSERT_EQ(t->dtype(), DType::kF32);
  ASSERT_EQ(t->shape(), (std::vector<int64_t>{2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(t->data<float>()[i], static_cast<float>(i));
  // Our writer produces numpy.save's exact bytes.
  auto ours = io::encode_npy(t->view());
  ASSERT_TRUE(ours.ok());
  EXPECT_EQ(*ours, file);
}

TEST(Npy, WriterMatchesNumpyForEveryDtype) {
  struct Fixture {
    std::string dict;
    DType dtype;
    std::vector<int64_t> shape;
    Bytes data;
  };
  Bytes i2, u1, i4, raw_bf16;
  append_values<int16_t>(i2, {1, -2, 300});
  append_values<uint8_t>(u1, {5});
  append_values<int32_t>(i4, {-7, 1 << 30});
  append_values<uint16_t>(raw_bf16, {0x3f80, 0xc000});  // 1.0, -2.0
  const std::vector<Fixture> fixtures = {
      {"{'descr': '<i2', 'fortran_order': False, 'shape': (3,), }", DType::kI16, {3}, i2},
      {"{'descr': '|u1', 'fortran_order': False, 'shape': (), }", DType::kU8, {}, u1},
      {"{'descr': '<i4', 'fortran_order': False, 'shape': (1, 2), }", DType::kI32, {1, 2}, i4},
      {"{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }", DType::kBF16, {2}, raw_bf16},
  };
  for (const Fixture& f : fixtures) {
    // numpy pads the dict with 21 - len(str(shape[0])) spaces first; the
    // 128-byte total is the same either way for these short dicts.
    const Bytes file = numpy_v1_file(f.dict, f.data);
    auto t = io::parse_npy(file.data(), file.size(), "fixture");
    ASSERT_TRUE(t.ok()) << f.dict << ": " << status_text(t.status());
    EXPECT_EQ(t->dtype(), f.dtype) << f.dict;
    EXPECT_EQ(t->shape(), f.shape) << f.dict;
    EXPECT_EQ(raw(*t), f.data) << f.dict;
    auto ours = io::encode_npy(t->view(), {Bf16Storage::kRaw});
    ASSERT_TRUE(ours.ok());
    EXPECT_EQ(*ours, file) << f.dict;
  }
  // The bf16 default is exact f32.
  HostTensor b(DType::kBF16, {2});
  std::memcpy(b.data<uint8_t>(), raw_bf16.data(), 4);
  auto widened = io::encode_npy(b.view());
  ASSERT_TRUE(widened.ok());
  auto back = io::parse_npy(widened->data(), widened->size(), "widened");
  ASSERT_TRUE(back.ok());
  ASSERT_EQ(back->dtype(), DType::kF32);
  EXPECT_EQ(back->data<float>()[0], 1.0f);
  EXPECT_EQ(back->data<float>()[1], -2.0f);
}

TEST(Npy, ParserAcceptsOtherSpellings) {
  // Format 2.0, double quotes, another key order, no trailing comma, the void
  // spelling of raw bf16, a Python 2 long.
  Bytes data;
  append_values<uint16_t>(data, {0x3f80, 0x4000, 0x4040});
  const Bytes file =
      numpy_v2_file("{\"shape\": (3L,), \"fortran_order\": False, \"descr\": \"|V2\"}\n", data);
  auto t = io::parse_npy(file.data(), file.size(), "v2");
  ASSERT_TRUE(t.ok()) << status_text(t.status());
  EXPECT_EQ(t->dtype(), DType::kBF16);
  EXPECT_EQ(t->shape(), (std::vector<int64_t>{3}));
  EXPECT_EQ(raw(*t), data);
}

TEST(Npy, RejectsMissingFileAndDirectory) {
  TempDir dir;
  auto missing = io::read_npy(dir.file("nope.npy"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.npy"), std::string::npos);
  fs::create_directories(dir.file("adir"));
  auto d = io::read_npy(dir.file("adir"));
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
}

TEST(Npy, RejectsBadMagicAndBadHeaders) {
  Bytes data;
  append_values<float>(data, {1, 2});
  struct Bad {
    Bytes file;
    StatusCode code;
    std::string needle;
  };
  Bytes not_npy = {'P', 'K', 3, 4, 0, 0, 0, 0, 0, 0, 0, 0};
  Bytes bad_version = numpy_v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", data);
  bad_version[6] = 9;
  const std::vector<Bad> bad = {
      {not_npy, StatusCode::kDataLoss, "bad magic"},
      {bad_version, StatusCode::kDataLoss, "version 9"},
      {numpy_v1_file("['descr', '<f4']", data), StatusCode::kDataLoss, "expected '{'"},
      {numpy_v1_file("{'descr': '<f4', 'shape': (2,), }", data), StatusCode::kDataLoss, "must hold"},
      {numpy_v1_file("{'descr': '<f4, 'fortran_order': False, 'shape': (2,), }", data), StatusCode::kDataLoss,
       "bad .npy header"},
      {numpy_v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", data), StatusCode::kDataLoss,
       "non-negative"},
      {numpy_v1_file("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,), }", data), StatusCode::kDataLoss,
       "True or False"},
      {numpy_v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", data),
       StatusCode::kDataLoss, "unexpected key 'x'"},
      {numpy_v1_file("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", data),
       StatusCode::kDataLoss, "structured"},
      {numpy_v1_file("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }", data),
       StatusCode::kInvalidArgument, "'<f8'"},
      {numpy_v1_file("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", data),
       StatusCode::kInvalidArgument, "big-endian"},
      {numpy_v1_file("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", data),
       StatusCode::kInvalidArgument, "Fortran-order"},
      {numpy_v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 2), }", data),
       StatusCode::kInvalidArgument, "rank 5"},
      {numpy_v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4), }", data),
       StatusCode::kDataLoss, "too large"},
      {numpy_v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", data), StatusCode::kDataLoss,
       "needs 12 data bytes, the file has 8"},
      {numpy_v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", data), StatusCode::kDataLoss,
       "trailing bytes"},
  };
  TempDir dir;
  for (const Bad& b : bad) {
    auto t = io::parse_npy(b.file.data(), b.file.size(), "case");
    ASSERT_FALSE(t.ok()) << b.needle;
    EXPECT_EQ(t.status().code(), b.code) << status_text(t.status());
    EXPECT_NE(t.status().message().find(b.needle), std::string::npos) << status_text(t.status());
    // The file reader gives the same answer.
    write_bytes(dir.file("bad.npy"), b.file);
    auto f = io::read_npy(dir.file("bad.npy"));
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), b.code) << status_text(f.status());
    EXPECT_NE(f.status().message().find(b.needle), std::string::npos) << status_text(f.status());
  }
}

TEST(Npy, TruncatedAtEveryByteIsDataLoss) {
  TempDir dir;
  const HostTensor t = random_any(DType::kI32, {3, 2}, 11);
  auto full = io::encode_npy(t.view());
  ASSERT_TRUE(full.ok());
  ASSERT_EQ(full->size(), 128u + 24u);
  for (size_t cut = 0; cut < full->size(); ++cut) {
    const Bytes part(full->begin(), full->begin() + static_cast<std::ptrdiff_t>(cut));
    write_bytes(dir.file("cut.npy"), part);
    auto r = io::read_npy(dir.file("cut.npy"));
    ASSERT_FALSE(r.ok()) << "cut at " << cut;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << "cut at " << cut << ": " << status_text(r.status());
    auto m = io::parse_npy(part.data(), part.size(), "mem");
    ASSERT_FALSE(m.ok()) << "cut at " << cut;
    EXPECT_EQ(m.status().code(), StatusCode::kDataLoss) << "cut at " << cut;
    if (cut >= 128) {
      // Cut in the data: the message names both byte counts.
      const std::string want = "needs 24 data bytes, the file has " + std::to_string(cut - 128);
      EXPECT_NE(r.status().message().find(want), std::string::npos) << status_text(r.status());
    }
  }
}

TEST(Npy, WriterRejectsBadTensorsAndLeavesNothingBehind) {
  TempDir dir;
  HostTensor t(DType::kF32, {4, 4});
  TensorView strided = t.view();
  strided.shape[1] = 2;  // every other column: not contiguous
  const std::string path = dir.file("out.npy");
  Status s = io::write_npy(path, strided);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("contiguous"), std::string::npos);
  TensorView on_gpu = t.view();
  on_gpu.device = Device::cuda(0);
  EXPECT_EQ(io::write_npy(path, on_gpu).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(dir.count(), 0u);
  // A directory that does not exist: an error naming the path, no debris.
  s = io::write_npy(dir.file("no/such/dir/out.npy"), t.view());
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no/such/dir/out.npy"), std::string::npos) << s.to_string();
  EXPECT_EQ(dir.count(), 0u);
  // A failed write leaves an existing file untouched.
  write_bytes(path, {1, 2, 3});
  EXPECT_FALSE(io::write_npy(path, strided).ok());
  EXPECT_EQ(read_bytes(path), (Bytes{1, 2, 3}));
  EXPECT_EQ(dir.count(), 1u);
}

// ------------------------------------------------------------------ safetensors

// A safetensors file the way the reference library lays it out: u64 header
// length, the JSON header padded with spaces to a multiple of 8, the data.
Bytes safetensors_file(std::string json, const Bytes& data) {
  while (json.size() % 8) json.push_back(' ');
  Bytes b;
  append_values<uint64_t>(b, {json.size()});
  append(b, json);
  append_raw(b, data.data(), data.size());
  return b;
}

TEST(Safetensors, RoundTripEveryDtypeWithMetadata) {
  TempDir dir;
  std::vector<HostTensor> tensors;
  std::vector<io::NamedTensor> named;
  const DType dtypes[] = {DType::kU8, DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kI32, DType::kI16};
  int i = 0;
  for (DType d : dtypes) {
    // Odd sizes so a naive layout would misalign the wider tensors after them.
    tensors.push_back(random_any(d, {3, 5 + i}, testing::seed_from({i, 42})));
    ++i;
  }
  tensors.push_back(HostTensor(DType::kF32, {0, 8}));  // empty tensor
  const char* names[] = {"u8", "layers.0.w13", "bf16", "f16", "fp8", "i32", "i16", "empty"};
  for (size_t k = 0; k < tensors.size(); ++k) named.push_back({names[k], tensors[k].view()});
  const std::map<std::string, std::string> meta = {{"format_version", "1"}, {"routing", "deepseek_v3"}};
  const std::string path = dir.file("t.safetensors");
  ASSERT_TRUE(io::write_safetensors(path, named, meta).ok());

  auto f = io::SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << status_text(f.status());
  EXPECT_EQ(f->metadata(), meta);
  EXPECT_EQ(f->entries().size(), tensors.size());
  for (size_t k = 0; k < tensors.size(); ++k) {
    SCOPED_TRACE(names[k]);
    auto r = f->read(names[k]);
    ASSERT_TRUE(r.ok()) << status_text(r.status());
    EXPECT_EQ(r->dtype(), tensors[k].dtype());
    EXPECT_EQ(r->shape(), tensors[k].shape());
    EXPECT_EQ(raw(*r), raw(tensors[k]));
    auto v = f->view(names[k]);
    ASSERT_TRUE(v.ok()) << status_text(v.status());  // our writer keeps every tensor aligned
    EXPECT_EQ(v->dtype, tensors[k].dtype());
    if (v->nbytes()) EXPECT_EQ(std::memcmp(v->data, tensors[k].data<uint8_t>(), v->nbytes()), 0);
  }
  auto missing = f->read("nope");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("'nope'"), std::string::npos);
}

TEST(Safetensors, ReadsAHandBuiltFile) {
  Bytes data;
  append_values<float>(data, {1.5f, -2.0f, 0.25f, 8.0f});  // a: bytes [0, 16)
  append_values<int16_t>(data, {-3, 7});                  // b: bytes [16, 20)
  append_values<uint16_t>(data, {0x3f80});                // c: bytes [20, 22), bf16 1.0
  append_values<uint8_t>(data, {0x30, 0xc0});             // d: bytes [22, 24), fp8 0.5, -2.0
  append_values<double>(data, {3.0});                     // e: bytes [24, 32), F64
  const Bytes file = safetensors_file(
      R"({"__metadata__":{"format":"pt"},)"
      R"("b":{"dtype":"I16","shape":[2],"data_offsets":[16,20]},)"
      R"("a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
      R"("c":{"dtype":"BF16","shape":[1],"data_offsets":[20,22]},)"
      R"("d":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[22,24]},)"
      R"("e":{"dtype":"F64","shape":[],"data_offsets":[24,32]}})",
      data);
  auto f = io::SafetensorsFile::parse(file.data(), file.size(), "fixture");
  ASSERT_TRUE(f.ok()) << status_text(f.status());
  EXPECT_EQ(f->metadata().at("format"), "pt");
  ASSERT_EQ(f->entries().size(), 5u);
  EXPECT_EQ(f->entries()[0].name, "a");  // offset order
  auto a = f->read("a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->shape(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(a->data<float>()[0], 1.5f);
  EXPECT_EQ(a->data<float>()[3], 8.0f);
  auto b = f->read("b");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->data<int16_t>()[0], -3);
  EXPECT_EQ(b->data<int16_t>()[1], 7);
  auto c = f->read("c");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(bf16_bits_to_f32(c->data<uint16_t>()[0]), 1.0f);
  auto d = f->read("d");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(f8e4m3_bits_to_f32(d->data<uint8_t>()[0]), 0.5f);
  EXPECT_EQ(f8e4m3_bits_to_f32(d->data<uint8_t>()[1]), -2.0f);
  // A valid safetensors dtype moekit does not load: listed, refused by name.
  ASSERT_NE(f->find("e"), nullptr);
  EXPECT_EQ(f->find("e")->dtype_name, "F64");
  auto e = f->read("e");
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(e.status().message().find("'e'"), std::string::npos);
}

TEST(Safetensors, ViewOfAMisalignedTensorIsRefusedButReadWorks) {
  Bytes data;
  append_values<uint8_t>(data, {1, 2, 3});
  append_values<float>(data, {4.0f});
  // 8-byte aligned header: data starts 8-aligned in the copy, so f at offset 3 is not.
  const Bytes file = safetensors_file(R"({"u":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},)"
                                      R"("f":{"dtype":"F32","shape":[1],"data_offsets":[3,7]}})",
                                      data);
  auto f = io::SafetensorsFile::parse(file.data(), file.size(), "fixture");
  ASSERT_TRUE(f.ok()) << status_text(f.status());
  auto v = f->view("f");
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kFailedPrecondition);
  auto r = f->read("f");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->data<float>()[0], 4.0f);
}

TEST(Safetensors, RejectsInconsistentHeaders) {
  Bytes data(16, 0);
  struct Bad {
    std::string json;
    StatusCode code;
    std::string needle;
  };
  const std::vector<Bad> bad = {
      {"{not json", StatusCode::kDataLoss, "not valid JSON"},
      {"[1, 2]", StatusCode::kDataLoss, "not a JSON object"},
      {R"({"w":{"shape":[4],"data_offsets":[0,16]}})", StatusCode::kInvalidArgument, "'w': missing string 'dtype'"},
      {R"({"w":{"dtype":"F32","data_offsets":[0,16]}})", StatusCode::kInvalidArgument, "'w': missing array 'shape'"},
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0]}})", StatusCode::kInvalidArgument, "'w'"},
      {R"({"w":{"dtype":"Q4","shape":[4],"data_offsets":[0,16]}})", StatusCode::kInvalidArgument,
       "'w': unknown dtype 'Q4'"},
      {R"({"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", StatusCode::kInvalidArgument, "'w'"},
      {R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", StatusCode::kDataLoss,
       "'w': data_offsets [0, 16) holds 16 bytes, but F32 x [3] needs 12"},
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", StatusCode::kDataLoss,
       "'w': data_offsets [8, 24) extends past the data section (16 bytes"},
      {R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", StatusCode::kDataLoss, "ends before it begins"},
      {R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
       StatusCode::kDataLoss, "tensor 'b' (bytes [8, 16)) overlaps tensor 'a'"},
      {R"({"__metadata__":{"n":1}})", StatusCode::kInvalidArgument, "must be a string"},
      {R"({"__metadata__":[]})", StatusCode::kInvalidArgument, "must be an object"},
      {R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}})", StatusCode::kDataLoss,
       "too large"},
  };
  TempDir dir;
  for (const Bad& b : bad) {
    const Bytes file = safetensors_file(b.json, data);
    auto f = io::SafetensorsFile::parse(file.data(), file.size(), "case");
    ASSERT_FALSE(f.ok()) << b.json;
    EXPECT_EQ(f.status().code(), b.code) << status_text(f.status());
    EXPECT_NE(f.status().message().find(b.needle), std::string::npos) << status_text(f.status());
    write_bytes(dir.file("bad.safetensors"), file);
    auto g = io::SafetensorsFile::open(dir.file("bad.safetensors"));
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.status().code(), b.code) << status_text(g.status());
  }
}

TEST(Safetensors, HeaderLengthBeyondFileAndTooShort) {
  Bytes file;
  append_values<uint64_t>(file, {1000});
  append(file, "{}");
  auto f = io::SafetensorsFile::parse(file.data(), file.size(), "case");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(f.status().message().find("header length 1000 exceeds the 2 bytes"), std::string::npos)
      << status_text(f.status());
  const Bytes tiny = {1, 2, 3};
  auto t = io::SafetensorsFile::parse(tiny.data(), tiny.size(), "case");
  EXPECT_EQ(t.status().code(), StatusCode::kDataLoss);
  TempDir dir;
  auto missing = io::SafetensorsFile::open(dir.file("none.safetensors"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST(Safetensors, TruncatedAtEveryByteIsDataLoss) {
  TempDir dir;
  const HostTensor a = random_any(DType::kBF16, {4, 3}, 5);
  const HostTensor b = random_any(DType::kI32, {5}, 6);
  auto full = io::encode_safetensors({{"a", a.view()}, {"b", b.view()}}, {{"k", "v"}});
  ASSERT_TRUE(full.ok());
  for (size_t cut = 0; cut < full->size(); ++cut) {
    const Bytes part(full->begin(), full->begin() + static_cast<std::ptrdiff_t>(cut));
    auto m = io::SafetensorsFile::parse(part.data(), part.size(), "mem");
    ASSERT_FALSE(m.ok()) << "cut at " << cut;
    EXPECT_EQ(m.status().code(), StatusCode::kDataLoss) << "cut at " << cut << ": " << status_text(m.status());
  }
  // And through the file reader, at a few points: in the length, the header, the data.
  for (size_t cut : {size_t{4}, size_t{20}, full->size() - 1}) {
    write_bytes(dir.file("cut.safetensors"), Bytes(full->begin(), full->begin() + static_cast<std::ptrdiff_t>(cut)));
    auto f = io::SafetensorsFile::open(dir.file("cut.safetensors"));
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), StatusCode::kDataLoss) << status_text(f.status());
  }
}

TEST(Safetensors, WriterRejectsBadNamesAndTensors) {
  TempDir dir;
  HostTensor t(DType::kF32, {2, 2});
  const std::string path = dir.file("w.safetensors");
  EXPECT_EQ(io::write_safetensors(path, {{"a", t.view()}, {"a", t.view()}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(io::write_safetensors(path, {{"", t.view()}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(io::write_safetensors(path, {{"__metadata__", t.view()}}).code(), StatusCode::kInvalidArgument);
  TensorView strided = t.view();
  strided.strides[0] = 4;
  Status s = io::write_safetensors(path, {{"s", strided}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'s'"), std::string::npos);
  EXPECT_EQ(io::write_safetensors(path, {{"bad\xff", t.view()}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(dir.count(), 0u);
}

// ------------------------------------------------------------------ convert

TEST(Convert, WidenExactlyAndCheckIntegerRange) {
  const HostTensor b = random_any(DType::kBF16, {33}, 9);
  auto f = io::convert(b.view(), DType::kF32);
  ASSERT_TRUE(f.ok());
  for (int i = 0; i < 33; ++i) EXPECT_EQ(f->data<float>()[i], bf16_bits_to_f32(b.data<uint16_t>()[i]));
  auto back = io::convert(f->view(), DType::kBF16);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(raw(*back), raw(b));

  HostTensor ids(DType::kI32, {3});
  ids.data<int32_t>()[0] = 0;
  ids.data<int32_t>()[1] = 255;
  ids.data<int32_t>()[2] = 256;
  auto u8 = io::convert(ids.view(), DType::kU8);
  ASSERT_FALSE(u8.ok());
  EXPECT_EQ(u8.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(u8.status().message().find("element 2 = 256"), std::string::npos);
  ids.data<int32_t>()[2] = -1;
  auto i16 = io::convert(ids.view(), DType::kI16);
  ASSERT_TRUE(i16.ok());
  EXPECT_EQ(i16->data<int16_t>()[2], -1);
  EXPECT_EQ(io::convert(ids.view(), DType::kF32).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moekit
