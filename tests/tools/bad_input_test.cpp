// The command line on bad input: every class of malformed or hostile input a
// user can give it (tensor files, checkpoints, capture files, flags, output
// paths, sizes), generated here and run through the real binary. Each must be
// answered with exit code 2 and exactly one line on stderr that names the
// problem, with every existing output untouched, no new output and no
// temporary file left behind (README: outputs are all or nothing).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "moekit/io.h"
#include "util/cli_test_util.h"
#include "util/temp_dir.h"
#include "util/test_util.h"

namespace moekit {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

constexpr int64_t kM = 12, kE = 8, kH = 32, kI = 16, kK = 2;

struct Case {
  std::string what;    // names the case in failures
  std::string args;    // after the binary
  std::string needle;  // the message must contain it
};

void write_bytes(const std::string& path, const Bytes& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}
Bytes read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}
Bytes text_bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }
std::string replace_once(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << "fixture: '" << from << "' not found";
  return at == std::string::npos ? s : s.replace(at, from.size(), to);
}

// A .npy file, format 1.0, with `dict` as written and `data_bytes` zero bytes of data.
Bytes npy_file(const std::string& dict, size_t data_bytes) {
  Bytes b = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 118, 0};
  b.insert(b.end(), dict.begin(), dict.end());
  while (b.size() < 127) b.push_back(' ');
  b.push_back('\n');
  b.resize(b.size() + data_bytes, 0);
  return b;
}
std::string npy_dict(const std::string& descr, const std::string& shape) {
  return "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
}

// A safetensors file from a header written out and `data_bytes` zero bytes.
Bytes safetensors_file(std::string json, size_t data_bytes) {
  while (json.size() % 8) json.push_back(' ');
  Bytes b(8);
  const uint64_t n = json.size();
  std::memcpy(b.data(), &n, 8);
  b.insert(b.end(), json.begin(), json.end());
  b.resize(b.size() + data_bytes, 0);
  return b;
}

Bytes encode(const HostTensor& t) { return io::encode_npy(t.view()).value(); }

// One expert layer, per-expert names (DeepSeek/Qwen style) under `prefix`.
struct LayerTensors {
  std::vector<std::string> names;
  std::vector<HostTensor> tensors;
  void add(std::string name, HostTensor t) {
    names.push_back(std::move(name));
    tensors.push_back(std::move(t));
  }
  Status write(const std::string& path) const {
    std::vector<io::NamedTensor> named;
    for (size_t i = 0; i < names.size(); ++i) named.push_back({names[i], tensors[i].view()});
    return io::write_safetensors(path, named);
  }
};
LayerTensors layer_tensors(const std::string& prefix, uint64_t seed, bool router = true) {
  std::mt19937_64 rng(seed);
  LayerTensors l;
  for (int64_t e = 0; e < kE; ++e) {
    const std::string p = prefix + "experts." + std::to_string(e) + ".";
    l.add(p + "gate_proj.weight", testing::random_tensor(rng, DType::kBF16, {kI, kH}, 0.2));
    l.add(p + "up_proj.weight", testing::random_tensor(rng, DType::kBF16, {kI, kH}, 0.2));
    l.add(p + "down_proj.weight", testing::random_tensor(rng, DType::kBF16, {kH, kI}, 0.2));
  }
  if (router) l.add(prefix + "gate.weight", testing::random_tensor(rng, DType::kF32, {kE, kH}, 0.3));
  return l;
}

// A sparse file of `size` bytes that starts with `head`: a huge input that
// takes no disk space. False where the file system cannot hold one.
bool write_sparse(const std::string& path, const Bytes& head, uint64_t size) {
  write_bytes(path, head);
  return ::truncate(path.c_str(), static_cast<off_t>(size)) == 0;
}

class BadInput : public testing::TempDirTest {
 protected:
  void SetUp() override {
    fs::create_directories(in_dir());
    fs::create_directories(out_dir());
    fs::create_directories(in("a_folder.npy"));
    // Outputs that exist (sentinels, must keep their bytes) and outputs that
    // do not (must not appear).
    for (const char* name : {"ids.npy", "w.npy", "o.npy"}) write_bytes(out(name), text_bytes(std::string("sentinel ") + name));
    std::mt19937_64 rng(testing::seed_from({10, kM, kE}));
    write_bytes(in("logits.npy"), encode(testing::tie_free_logits(rng, DType::kF32, 16, kE, 1e-2)));
    write_bytes(in("hidden.npy"), encode(testing::random_tensor(rng, DType::kF32, {kM, kH}, 1.0)));
    HostTensor bias(DType::kF32, {kE});
    for (int64_t e = 0; e < kE; ++e) bias.data<float>()[e] = 0.01f * static_cast<float>(e);
    write_bytes(in("bias.npy"), encode(bias));
    HostTensor ids(DType::kI32, {kM, kK});
    for (int64_t i = 0; i < kM * kK; ++i) ids.data<int32_t>()[i] = static_cast<int32_t>(i % kK);
    write_bytes(in("ids.npy"), encode(ids));
    ASSERT_TRUE(layer_tensors("model.layers.3.mlp.", 11).write(in("w.safetensors")).ok());
    snapshot_ = snapshot();
  }

  std::string in_dir() const { return file("in"); }
  std::string out_dir() const { return file("out"); }
  std::string in(const std::string& name) const { return file("in/" + name); }
  std::string out(const std::string& name) const { return file("out/" + name); }

  // Every file in the test's folder with its size, and the bytes of the small ones.
  std::map<std::string, std::pair<uintmax_t, Bytes>> snapshot() const {
    std::map<std::string, std::pair<uintmax_t, Bytes>> s;
    for (const auto& e : fs::recursive_directory_iterator(dir_.path())) {
      const std::string p = e.path().string();
      if (!e.is_regular_file()) {
        s[p] = {0, {}};
        continue;
      }
      const uintmax_t size = e.file_size();
      s[p] = {size, size < (1u << 20) ? read_bytes(p) : Bytes()};
    }
    return s;
  }

  // Runs each case and checks the contract; every case must hold it.
  void expect_rejected(const std::vector<Case>& cases) {
    for (const Case& c : cases) {
      const testing::CommandResult r = testing::run_command_split(std::string(MOEKIT_CLI_PATH) + " " + c.args);
      const std::string where = c.what + "\n  args: " + c.args + "\n  stderr: " + r.err;
      EXPECT_EQ(r.code, 2) << where;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "not one line: " << where;
      EXPECT_TRUE(!r.err.empty() && r.err.back() == '\n') << where;
      EXPECT_EQ(r.err.rfind("moekit", 0), 0u) << where;
      EXPECT_NE(r.err.find("error: "), std::string::npos) << where;
      EXPECT_NE(r.err.find(c.needle), std::string::npos) << "wanted '" << c.needle << "': " << where;
      // Existing outputs keep their bytes, nothing appears, no temporary stays.
      const auto now = snapshot();
      EXPECT_TRUE(now == snapshot_) << "files changed: " << where;
      if (now != snapshot_) {
        for (const auto& [p, v] : now) {
          if (!snapshot_.count(p) || snapshot_.at(p) != v) ADD_FAILURE() << "  new or changed: " << p;
        }
        snapshot_ = now;  // report each change once
      }
      ++tried_;
    }
  }
  void TearDown() override {
    std::cout << "[ bad input ] " << tried_ << " inputs tried\n";
  }

  std::map<std::string, std::pair<uintmax_t, Bytes>> snapshot_;
  int tried_ = 0;
};

// ----------------------------------------------------------------- .npy inputs

// Malformed .npy files, each used as the logits of `route` and the hidden
// states of `layer`.
std::vector<std::pair<std::string, Bytes>> bad_npy_files() {
  std::vector<std::pair<std::string, Bytes>> f;
  const Bytes good = npy_file(npy_dict("<f4", "(16, 8)"), 16 * 8 * 4);
  f.push_back({"empty file", {}});
  f.push_back({"bad magic", text_bytes("PK\x03\x04 not numpy at all")});
  f.push_back({"cut in the magic", Bytes(good.begin(), good.begin() + 4)});
  f.push_back({"cut in the preamble", Bytes(good.begin(), good.begin() + 9)});
  f.push_back({"cut in the dict", Bytes(good.begin(), good.begin() + 60)});
  f.push_back({"cut in the data", Bytes(good.begin(), good.end() - 3)});
  Bytes version = good;
  version[6] = 9;
  f.push_back({"format version 9", version});
  Bytes long_header = good;
  long_header[8] = 0xff;
  long_header[9] = 0xff;
  f.push_back({"dict length past the end", Bytes(long_header.begin(), long_header.begin() + 200)});
  f.push_back({"not a dict", npy_file("['descr', '<f4']", 0)});
  f.push_back({"unterminated string", npy_file("{'descr': '<f4, 'fortran_order': False, 'shape': (16, 8), }", 512)});
  f.push_back({"missing key", npy_file("{'descr': '<f4', 'shape': (16, 8), }", 512)});
  f.push_back({"unknown key with a newline",
               npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (16, 8), 'a\nb': 1}", 512)});
  f.push_back({"negative dimension", npy_file(npy_dict("<f4", "(-16, 8)"), 512)});
  f.push_back({"shape not a tuple", npy_file(npy_dict("<f4", "[16, 8]"), 512)});
  f.push_back({"dimension past int64", npy_file(npy_dict("<f4", "(99999999999999999999, 8)"), 0)});
  f.push_back({"strides past int64, empty", npy_file(npy_dict("<f4", "(0, 4294967296429, 2749162)"), 0)});
  f.push_back({"bytes past int64", npy_file(npy_dict("<f4", "(4611686018427387904, 4)"), 0)});
  f.push_back({"rank 5", npy_file(npy_dict("<f4", "(1, 1, 1, 16, 8)"), 512)});
  f.push_back({"Fortran order", npy_file("{'descr': '<f4', 'fortran_order': True, 'shape': (16, 8), }", 512)});
  f.push_back({"big-endian", npy_file(npy_dict(">f4", "(16, 8)"), 512)});
  f.push_back({"float64", npy_file(npy_dict("<f8", "(16, 8)"), 1024)});
  f.push_back({"structured dtype", npy_file("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (16, 8), }", 512)});
  f.push_back({"trailing bytes", npy_file(npy_dict("<f4", "(16, 8)"), 520)});
  f.push_back({"bytes not text in the dict", npy_file("{'descr': '<f4', 'fortran_order': \x01\xfe\xff, }", 0)});
  return f;
}
const char* const kNpyNeedles[] = {
    "empty file",          "bad magic",        "truncated .npy file (4 bytes)", "truncated .npy header", "truncated .npy header",
    "truncated .npy data", "format version 9", "truncated .npy header", "expected '{'",       "bad .npy header",
    "must hold",           "unexpected key 'a\\x0ab'", "non-negative", "shape must be a tuple", "too large",
    "is too large",        "is too large",     "rank 5",            "Fortran-order",         "big-endian",
    "'<f8'",               "structured",       "trailing bytes",    "True or False",
};

TEST_F(BadInput, NpyInputsOfRouteAndLayer) {
  const auto files = bad_npy_files();
  ASSERT_EQ(files.size(), std::size(kNpyNeedles));
  std::vector<Case> cases;
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string path = in("bad" + std::to_string(i) + ".npy");
    write_bytes(path, files[i].second);
    cases.push_back({"route --logits: " + files[i].first,
                     "route --method renormalize --top-k 2 --logits " + path + " --out-ids " + out("ids.npy") +
                         " --out-weights " + out("w.npy") + " --out-counts " + out("counts.npy"),
                     kNpyNeedles[i]});
    cases.push_back({"layer --hidden: " + files[i].first,
                     "layer --weights " + in("w.safetensors") + " --hidden " + path + " --out " + out("o.npy") +
                         " --method softmax_topk --top-k 2",
                     kNpyNeedles[i]});
  }
  snapshot_ = snapshot();
  expect_rejected(cases);
}

TEST_F(BadInput, RouteValuesShapesAndFlags) {
  std::mt19937_64 rng(5);
  HostTensor nan = testing::random_tensor(rng, DType::kF32, {16, kE}, 1.0);
  nan.data<float>()[19] = std::nanf("");
  write_bytes(in("nan.npy"), encode(nan));
  HostTensor inf = testing::random_tensor(rng, DType::kF32, {16, kE}, 1.0);
  inf.data<float>()[33] = -INFINITY;
  write_bytes(in("inf.npy"), encode(inf));
  write_bytes(in("ints.npy"), encode(HostTensor(DType::kI32, {16, kE})));
  write_bytes(in("rank3.npy"), encode(HostTensor(DType::kF32, {2, 8, kE})));
  write_bytes(in("no_rows.npy"), encode(HostTensor(DType::kF32, {0, kE})));
  write_bytes(in("bias4.npy"), encode(HostTensor(DType::kF32, {4})));
  HostTensor bias_nan(DType::kF32, {kE});
  for (int64_t e = 0; e < kE; ++e) bias_nan.data<float>()[e] = e == 5 ? std::nanf("") : 0.0f;
  write_bytes(in("bias_nan.npy"), encode(bias_nan));
  snapshot_ = snapshot();
  const std::string outs = " --out-ids " + out("ids.npy") + " --out-weights " + out("w.npy");
  const std::string route = "route --logits " + in("logits.npy") + outs;
  const std::string ds = route + " --method deepseek_v3 --top-k 2 --num-groups 4 --topk-groups 2";
  const std::string rn = "route --method renormalize --top-k 2 ";
  const std::vector<Case> cases = {
      {"NaN logits", rn + "--logits " + in("nan.npy") + outs, "is NaN"},
      {"-Inf logits", rn + "--logits " + in("inf.npy") + outs, "-Inf"},
      {"i32 logits", rn + "--logits " + in("ints.npy") + outs, "f32 or bf16"},
      {"rank-3 logits", rn + "--logits " + in("rank3.npy") + outs, "must be [M, E]"},
      {"no rows", rn + "--logits " + in("no_rows.npy") + outs, "logits are empty"},
      {"missing logits", rn + "--logits " + in("none.npy") + outs, "NotFound"},
      {"a folder as logits", rn + "--logits " + in("a_folder.npy") + outs, "not a regular file"},
      {"bias of another E", ds + " --bias " + in("bias4.npy"), "bias must be [8]"},
      {"NaN bias", ds + " --bias " + in("bias_nan.npy"), "score_bias[5] is not finite"},
      {"bias without deepseek_v3", route + " --method renormalize --top-k 2 --bias " + in("bias.npy"),
       "deepseek_v3 only"},
      {"empty bias path", ds + " --bias ''", "--bias: the input path is empty"},
      {"scaling inf", ds + " --scaling inf", "--scaling: must be a finite number > 0"},
      {"scaling 1e39 (inf in f32)", ds + " --scaling 1e39", "--scaling: must be a finite number > 0"},
      {"scaling nan", ds + " --scaling nan", "--scaling: must be a finite number > 0"},
      {"scaling -1", ds + " --scaling -1", "--scaling: must be a finite number > 0"},
      {"scaling 0", ds + " --scaling 0", "--scaling: must be a finite number > 0"},
      {"scaling text", ds + " --scaling two", "--scaling: must be a finite number > 0"},
      {"top-k 0", route + " --method renormalize --top-k 0", "routing.top_k"},
      {"top-k above E", route + " --method renormalize --top-k 9", "routing.top_k"},
      {"top-k past int", route + " --method renormalize --top-k 99999999999", "--top-k"},
      {"top-k text", route + " --method renormalize --top-k two", "--top-k"},
      {"no top-k", route + " --method renormalize", "--top-k is required"},
      {"unknown method", route + " --method bogus --top-k 2", "unknown routing method 'bogus'"},
      {"custom method", route + " --method custom --top-k 2", "unknown routing method 'custom'"},
      {"groups not dividing E", route + " --method deepseek_v3 --top-k 2 --num-groups 3", "num_groups"},
      {"kept groups above groups", route + " --method deepseek_v3 --top-k 2 --num-groups 4 --topk-groups 5",
       "topk_groups"},
      {"groups without deepseek_v3", route + " --method renormalize --top-k 2 --num-groups 2", "deepseek_v3 only"},
      {"unknown flag", route + " --method renormalize --top-k 2 --frobnicate 3", "--frobnicate"},
  };
  expect_rejected(cases);
}

// ----------------------------------------------------------------- outputs

TEST_F(BadInput, OutputPathsOfRouteAndLayer) {
  fs::create_directories(out("a_folder"));
  fs::create_symlink(out("ids.npy"), out("ids_link.npy"));
  snapshot_ = snapshot();
  const std::string r = "route --method renormalize --top-k 2 --logits " + in("logits.npy");
  const std::string l = "layer --weights " + in("w.safetensors") + " --hidden " + in("hidden.npy") +
                        " --method softmax_topk --top-k 2";
  const std::vector<Case> cases = {
      // A later output that cannot be put in place: the earlier sentinels keep their bytes.
      {"route: --out-weights is a folder",
       r + " --out-ids " + out("ids.npy") + " --out-weights " + out("a_folder") + " --out-counts " + out("c.npy"),
       "--out-weights: '" + out("a_folder") + "' is a folder"},
      {"route: --out-counts in a missing folder",
       r + " --out-ids " + out("ids.npy") + " --out-weights " + out("w.npy") + " --out-counts " + out("no/c.npy"),
       "--out-counts: folder '" + out("no") + "' does not exist"},
      {"route: --out-ids ends with /", r + " --out-ids " + out("x/") + " --out-weights " + out("w.npy"),
       "is a folder"},
      {"route: empty --out-ids", r + " --out-ids '' --out-weights " + out("w.npy"), "--out-ids: the output path is empty"},
      {"route: empty --out-counts",
       r + " --out-ids " + out("ids.npy") + " --out-weights " + out("w.npy") + " --out-counts ''",
       "--out-counts: the output path is empty"},
      {"route: ids and weights on one path", r + " --out-ids " + out("ids.npy") + " --out-weights " + out("ids.npy"),
       "--out-weights and --out-ids name the same file"},
      {"route: weights on a symlink to ids",
       r + " --out-ids " + out("ids.npy") + " --out-weights " + out("ids_link.npy"),
       "--out-weights and --out-ids name the same file"},
      {"route: the same file through ..",
       r + " --out-ids " + out("ids.npy") + " --out-weights " + out("a_folder/../ids.npy"), "name the same file"},
      {"route: counts on one path with a new file",
       r + " --out-ids " + out("new.npy") + " --out-weights " + out("w.npy") + " --out-counts " + out("new.npy"),
       "--out-counts and --out-ids name the same file"},
      {"route: an output over its input",
       r + " --out-ids " + out("ids.npy") + " --out-weights " + in("logits.npy"),
       "--out-weights names the input of --logits"},
      {"route: --out-counts over --bias",
       "route --method deepseek_v3 --top-k 2 --num-groups 4 --topk-groups 2 --logits " + in("logits.npy") +
           " --bias " + in("bias.npy") + " --out-ids " + out("ids.npy") + " --out-weights " + out("w.npy") +
           " --out-counts " + in("bias.npy"),
       "--out-counts names the input of --bias"},
      {"route: no --out-weights", r + " --out-ids " + out("ids.npy"), "--out-weights is required"},
      {"layer: --capture is a folder (after --out)", l + " --out " + out("o.npy") + " --capture " + out("a_folder"),
       "--capture: '" + out("a_folder") + "' is a folder"},
      {"layer: --out and --capture on one path", l + " --out " + out("o.npy") + " --capture " + out("o.npy"),
       "--capture and --out name the same file"},
      {"layer: --out over --hidden", l + " --out " + in("hidden.npy"), "--out names the input of --hidden"},
      {"layer: --capture over --weights", l + " --out " + out("o.npy") + " --capture " + in("w.safetensors"),
       "--capture names the input of --weights"},
      {"layer: --out over --replay", l + " --out " + in("ids.npy") + " --replay " + in("ids.npy"),
       "--out names the input of --replay"},
      {"layer: empty --out", l + " --out ''", "--out: the output path is empty"},
      {"layer: empty --capture", l + " --out " + out("o.npy") + " --capture ''", "--capture: the output path is empty"},
      {"layer: empty --logits", l + " --out " + out("o.npy") + " --logits ''", "--logits: the input path is empty"},
      {"layer: --out in a missing folder", l + " --out " + out("no/o.npy"), "does not exist"},
      {"layer: no --out", l, "--out is required"},
  };
  expect_rejected(cases);
}

// ----------------------------------------------------------------- checkpoints

TEST_F(BadInput, LayerCheckpoints) {
  std::vector<std::pair<std::string, LayerTensors>> files;
  auto edited = [&](const std::string& what, auto edit) {
    LayerTensors t = layer_tensors("model.layers.3.mlp.", 11);
    edit(t);
    files.push_back({what, std::move(t)});
  };
  auto rename = [](LayerTensors& t, const std::string& from, const std::string& to) {
    for (auto& n : t.names) {
      if (n.find(from) != std::string::npos) n = replace_once(n, from, to);
    }
  };
  auto drop = [](LayerTensors& t, const std::string& part) {
    for (size_t i = t.names.size(); i-- > 0;) {
      if (t.names[i].find(part) != std::string::npos) {
        t.names.erase(t.names.begin() + static_cast<std::ptrdiff_t>(i));
        t.tensors.erase(t.tensors.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
  };
  edited("expert index past int64", [&](LayerTensors& t) { rename(t, "experts.1.", "experts.99999999999999999999."); });
  edited("expert index past E limit", [&](LayerTensors& t) { rename(t, "experts.1.", "experts.40000."); });
  edited("expert index with a leading zero", [&](LayerTensors& t) { rename(t, "experts.1.", "experts.01."); });
  edited("missing expert", [&](LayerTensors& t) { drop(t, "experts.3."); });
  edited("missing projection", [&](LayerTensors& t) { drop(t, "experts.2.down_proj"); });
  edited("mixed namings", [&](LayerTensors& t) { rename(t, "experts.0.gate_proj", "experts.0.w1"); });
  edited("expert of another shape", [&](LayerTensors& t) { t.tensors[5 * 3 + 1] = HostTensor(DType::kBF16, {kI, kH + 1}); });
  edited("expert of another dtype", [&](LayerTensors& t) { t.tensors[4 * 3] = HostTensor(DType::kF32, {kI, kH}); });
  edited("integer weights", [&](LayerTensors& t) {
    for (size_t i = 0; i + 1 < t.tensors.size(); ++i) t.tensors[i] = HostTensor(DType::kI16, t.tensors[i].shape());
  });
  edited("router of another shape", [&](LayerTensors& t) { t.tensors.back() = HostTensor(DType::kF32, {kE, kH - 1}); });
  edited("no router and no --logits", [&](LayerTensors& t) { drop(t, "gate.weight"); });
  const char* const needles[] = {
      "expert index '99999999999999999999' is not a number in [0, 32766]",
      "expert index '40000' is not a number in [0, 32766]",
      "expert index '01'",
      "experts.3: expert missing",
      "experts.2.down_proj.weight is missing",
      "mixes the",
      "experts.5.up_proj.weight: shape [16, 33], expected [16, 32]",
      "experts.4.gate_proj.weight: dtype F32 differs from the layer's other weights (bf16)",
      "dtype I16 (moekit loads BF16 or F32, or F8_E4M3 with its scales, weights)",
      "gate.weight: shape [8, 31], expected [8, 32]",
      "--logits is required",
  };
  ASSERT_EQ(files.size(), std::size(needles));
  std::vector<Case> cases;
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string path = in("ckpt" + std::to_string(i) + ".safetensors");
    ASSERT_TRUE(files[i].second.write(path).ok()) << files[i].first;
    cases.push_back({files[i].first,
                     "layer --weights " + path + " --hidden " + in("hidden.npy") + " --out " + out("o.npy") +
                         " --capture " + out("cap.npy") + " --method softmax_topk --top-k 2",
                     needles[i]});
  }
  // Two layers in one file.
  LayerTensors two = layer_tensors("model.layers.1.mlp.", 12);
  LayerTensors three = layer_tensors("model.layers.3.mlp.", 13);
  two.names.insert(two.names.end(), three.names.begin(), three.names.end());
  for (auto& t : three.tensors) two.tensors.push_back(std::move(t));
  ASSERT_TRUE(two.write(in("two.safetensors")).ok());
  // Raw headers: what no writer makes.
  const std::string entry = R"({"dtype":"BF16","shape":[16,32],"data_offsets":[0,1024]})";
  const std::string name = "model.layers.3.mlp.experts.0.gate_proj.weight";
  const std::vector<std::pair<std::string, std::pair<Bytes, std::string>>> raw = {
      {"empty file", {{}, "too short for a safetensors file"}},
      {"header length past the end", {Bytes{0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'}, "exceeds the 2 bytes"}},
      {"header not JSON", {safetensors_file("{\"a\": nope}", 0), "header is not valid JSON"}},
      {"header a JSON array", {safetensors_file("[1, 2, 3]", 0), "header is not a JSON object"}},
      {"one tensor name twice",
       {safetensors_file("{\"" + name + "\":" + entry + ",\"" + name + "\":" + entry + "}", 1024),
        "key '" + name + "' appears twice"}},
      {"NUL byte, then more tensors",
       {safetensors_file("{\"" + name + "\":" + entry + std::string(1, '\0') + ",\"x\":" + entry + "}", 1024),
        "NUL byte at offset"}},
      {"overlapping tensors",
       {safetensors_file("{\"a\":" + entry + ",\"b\":" + entry + "}", 1024), "overlaps tensor"}},
      {"offsets past the data",
       {safetensors_file("{\"a\":" + entry + "}", 1000), "extends past the data section"}},
      {"offsets ending before they begin",
       {safetensors_file(R"({"a":{"dtype":"BF16","shape":[0],"data_offsets":[8,4]}})", 8), "ends before it begins"}},
      {"size not shape x dtype",
       {safetensors_file(R"({"a":{"dtype":"BF16","shape":[16,31],"data_offsets":[0,1024]}})", 1024),
        "holds 1024 bytes, but BF16 x [16, 31] needs 992"}},
      {"unknown dtype", {safetensors_file(R"({"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", 1), "unknown dtype"}},
      {"shape past int64",
       {safetensors_file(R"({"a":{"dtype":"F32","shape":[0,4398046511104,4398046511104],"data_offsets":[0,0]}})", 0),
        "is too large"}},
      {"metadata not strings", {safetensors_file(R"({"__metadata__":{"a":1}})", 0), "must be a string"}},
      {"no expert tensors", {safetensors_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4),
                             "no MoE layer weights"}},
  };
  for (size_t i = 0; i < raw.size(); ++i) {
    const std::string path = in("raw" + std::to_string(i) + ".safetensors");
    write_bytes(path, raw[i].second.first);
    cases.push_back({"raw header: " + raw[i].first,
                     "layer --weights " + path + " --hidden " + in("hidden.npy") + " --out " + out("o.npy") +
                         " --method softmax_topk --top-k 2",
                     raw[i].second.second});
  }
  Bytes cut = read_bytes(in("w.safetensors"));
  cut.resize(cut.size() - 10);
  write_bytes(in("cut.safetensors"), cut);
  const std::string base = " --hidden " + in("hidden.npy") + " --out " + out("o.npy") + " --method softmax_topk --top-k 2";
  cases.push_back({"truncated checkpoint", "layer --weights " + in("cut.safetensors") + base, "extends past the data section"});
  cases.push_back({"missing checkpoint", "layer --weights " + in("none.safetensors") + base, "NotFound"});
  cases.push_back({"a folder as checkpoint", "layer --weights " + in("a_folder.npy") + base, "not a regular file"});
  cases.push_back({"two layers, no --layer", "layer --weights " + in("two.safetensors") + base, "pick one with --layer N"});
  cases.push_back({"--layer absent from the file", "layer --layer 7 --weights " + in("two.safetensors") + base,
                   "no MoE layer weights for layer 7"});
  snapshot_ = snapshot();
  expect_rejected(cases);
}

// fp8 checkpoints (docs/fp8.md): every bad scale, scheme or quantize input.
// kH = 32, kI = 16: one (partial) 128-block per matrix, which the CPU handles.
LayerTensors fp8_layer_tensors(QuantMethod method, bool static_act = false) {
  LayerTensors bf16 = layer_tensors("model.layers.3.mlp.", 11);
  LayerTensors t;
  const char* suffix = method == QuantMethod::kFp8Block128 ? "_scale_inv" : "_scale";
  for (size_t i = 0; i < bf16.names.size(); ++i) {
    if (bf16.names[i].find("experts.") == std::string::npos) {
      t.add(bf16.names[i], std::move(bf16.tensors[i]));
      continue;
    }
    io::Fp8Matrix m = io::quantize_fp8(bf16.tensors[i].view(), method, bf16.names[i]).value();
    t.add(bf16.names[i], std::move(m.weight));
    t.add(bf16.names[i] + suffix, std::move(m.scale));
    if (static_act) {
      HostTensor a(DType::kF32, {1});
      a.data<float>()[0] = 4.0f / 448.0f;
      t.add(replace_once(bf16.names[i], ".weight", ".input_scale"), std::move(a));
    }
  }
  return t;
}

TEST_F(BadInput, Fp8Checkpoints) {
  std::vector<std::pair<Case, LayerTensors>> files;
  const std::string p = "model.layers.3.mlp.experts.";
  auto index_of = [](const LayerTensors& t, const std::string& name) {
    return static_cast<size_t>(std::find(t.names.begin(), t.names.end(), name) - t.names.begin());
  };
  auto edited = [&](const std::string& what, const std::string& needle, QuantMethod m, auto edit, bool stat = false) {
    LayerTensors t = fp8_layer_tensors(m, stat);
    edit(t);
    files.push_back({Case{what, "", needle}, std::move(t)});
  };
  const QuantMethod block = QuantMethod::kFp8Block128, tensor = QuantMethod::kFp8PerTensor;
  const std::string up2 = p + "2.up_proj.weight_scale_inv";
  edited("block scale missing", up2 + " is missing", block, [&](LayerTensors& t) {
    const size_t i = index_of(t, up2);
    t.names.erase(t.names.begin() + static_cast<std::ptrdiff_t>(i));
    t.tensors.erase(t.tensors.begin() + static_cast<std::ptrdiff_t>(i));
  });
  edited("block scale misshapen", up2 + ": expected shape [1, 1], got [2, 1]", block,
         [&](LayerTensors& t) { t.tensors[index_of(t, up2)] = HostTensor(DType::kF32, {2, 1}); });
  edited("block scale bf16", up2 + ": scales must be F32, got BF16", block,
         [&](LayerTensors& t) { t.tensors[index_of(t, up2)] = HostTensor(DType::kBF16, {1, 1}); });
  const std::pair<const char*, float> bad_values[] = {
      {"NaN", std::nanf("")}, {"Inf", INFINITY}, {"zero", 0.0f}, {"negative", -0.5f}};
  for (const auto& [name, v] : bad_values) {
    const float value = v;
    edited(std::string("block scale ") + name, up2 + ": element 0 is", block,
           [&](LayerTensors& t) { t.tensors[index_of(t, up2)].data<float>()[0] = value; });
  }
  const std::string down1 = p + "1.down_proj.weight_scale";
  edited("per-tensor scale negative", down1 + ": element 0 is", tensor,
         [&](LayerTensors& t) { t.tensors[index_of(t, down1)].data<float>()[0] = -1.0f; });
  edited("per-tensor scale [2]", down1 + ": expected shape [] or [1], got [2]", tensor,
         [&](LayerTensors& t) { t.tensors[index_of(t, down1)] = HostTensor(DType::kF32, {2}); });
  edited("schemes mixed across experts", "cannot mix the block-128 and per-tensor schemes", block,
         [&](LayerTensors& t) { t.names[index_of(t, p + "5.gate_proj.weight_scale_inv")] = p + "5.gate_proj.weight_scale"; });
  edited("static scale missing on one projection", p + "4.down_proj.input_scale is missing", tensor,
         [&](LayerTensors& t) { t.names[index_of(t, p + "4.down_proj.input_scale")] = "unrelated"; }, true);
  edited("fp8 weights without any scale", "are both missing", block, [&](LayerTensors& t) {
    for (auto& n : t.names) {
      if (n.ends_with("weight_scale_inv")) n = replace_once(n, "weight_scale_inv", "scale_of_something");
    }
  });
  // A BF16 layer with a scale beside a weight: refused, not ignored.
  LayerTensors bf16 = layer_tensors("model.layers.3.mlp.", 11);
  HostTensor one(DType::kF32, {1, 1});
  one.data<float>()[0] = 1.0f;
  bf16.add(p + "0.gate_proj.weight_scale_inv", std::move(one));
  files.push_back({Case{"scale beside a BF16 weight", "", "not F8_E4M3"}, std::move(bf16)});

  std::vector<Case> cases;
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string path = in("fp8_" + std::to_string(i) + ".safetensors");
    ASSERT_TRUE(files[i].second.write(path).ok()) << files[i].first.what;
    cases.push_back({files[i].first.what,
                     "layer --weights " + path + " --hidden " + in("hidden.npy") + " --out " + out("o.npy") +
                         " --capture " + out("cap.npy") + " --method softmax_topk --top-k 2",
                     files[i].first.needle});
  }
  // quantize: bad scheme, fp8 input, no expert weights, output onto the input.
  ASSERT_TRUE(fp8_layer_tensors(block).write(in("fp8.safetensors")).ok());
  ASSERT_TRUE(io::write_safetensors(in("plain.safetensors"), {{"a", HostTensor(DType::kF32, {2}).view()}}).ok());
  const std::string q = "quantize --out " + out("q.safetensors");
  cases.push_back({"quantize: unknown scheme", q + " --scheme fp8 --weights " + in("w.safetensors"),
                   "--scheme must be fp8_block128 or fp8_per_tensor, got 'fp8'"});
  cases.push_back({"quantize: fp8 input", q + " --scheme fp8_block128 --weights " + in("fp8.safetensors"),
                   "already F8_E4M3"});
  cases.push_back({"quantize: no expert weights", q + " --scheme fp8_per_tensor --weights " + in("plain.safetensors"),
                   "no expert weights to quantize"});
  cases.push_back({"quantize: output is the input",
                   "quantize --scheme fp8_block128 --weights " + in("w.safetensors") + " --out " + in("w.safetensors"),
                   "--out"});
  snapshot_ = snapshot();
  expect_rejected(cases);
}

TEST_F(BadInput, LayerInputsFlagsAndReplay) {
  std::mt19937_64 rng(21);
  write_bytes(in("hidden_h16.npy"), encode(testing::random_tensor(rng, DType::kF32, {kM, 16}, 1.0)));
  write_bytes(in("hidden_i32.npy"), encode(HostTensor(DType::kI32, {kM, kH})));
  write_bytes(in("hidden_rank1.npy"), encode(HostTensor(DType::kF32, {kH})));
  write_bytes(in("logits_e4.npy"), encode(testing::random_tensor(rng, DType::kF32, {kM, 4}, 1.0)));
  write_bytes(in("logits_m5.npy"), encode(testing::random_tensor(rng, DType::kF32, {5, kE}, 1.0)));
  HostTensor logits_nan = testing::random_tensor(rng, DType::kF32, {kM, kE}, 1.0);
  logits_nan.data<float>()[kE * 2 + 3] = std::nanf("");
  write_bytes(in("logits_nan.npy"), encode(logits_nan));
  auto ids = [](int64_t rows, int64_t cols, auto value) {
    HostTensor t(DType::kI32, {rows, cols});
    for (int64_t i = 0; i < rows * cols; ++i) t.data<int32_t>()[i] = value(i);
    return t;
  };
  const auto valid = [](int64_t i) { return static_cast<int32_t>(i % kK); };
  write_bytes(in("ids_range.npy"), encode(ids(kM, kK, [&](int64_t i) { return i == 5 ? 8 : valid(i); })));
  write_bytes(in("ids_dup.npy"), encode(ids(kM, kK, [](int64_t i) { return 3 + 0 * i; })));
  write_bytes(in("ids_sentinel.npy"), encode(ids(kM, kK, [&](int64_t i) { return i == 7 ? -1 : valid(i); })));
  write_bytes(in("ids_k3.npy"), encode(ids(kM, 3, [](int64_t i) { return static_cast<int32_t>(i % 3); })));
  write_bytes(in("ids_m5.npy"), encode(ids(5, kK, valid)));
  // Ids captured on a layer with 16 experts, replayed on this one with 8.
  write_bytes(in("ids_e16.npy"), encode(ids(kM, kK, [](int64_t i) { return static_cast<int32_t>(15 - i % kK); })));
  write_bytes(in("ids_f32.npy"), encode(HostTensor(DType::kF32, {kM, kK})));
  snapshot_ = snapshot();
  const std::string w = "layer --weights " + in("w.safetensors");
  const std::string io = " --out " + out("o.npy") + " --capture " + out("cap.npy");
  const std::string l = w + " --hidden " + in("hidden.npy") + io;
  const std::string sm = " --method softmax_topk --top-k 2";
  const std::vector<Case> cases = {
      {"hidden of another H", w + " --hidden " + in("hidden_h16.npy") + io + sm, "hidden must be [M, 32]"},
      {"hidden i32", w + " --hidden " + in("hidden_i32.npy") + io + sm, "must be f32, bf16 or f16, got i32"},
      {"hidden rank 1", w + " --hidden " + in("hidden_rank1.npy") + io + sm, "hidden must be [M, 32]"},
      {"logits of another E", l + sm + " --logits " + in("logits_e4.npy"), "router logits must be [12, 8], got [12, 4]"},
      {"logits of another M", l + sm + " --logits " + in("logits_m5.npy"), "router logits must be [12, 8], got [5, 8]"},
      {"NaN logits", l + sm + " --logits " + in("logits_nan.npy"), "is NaN"},
      {"forced id out of range", l + sm + " --replay " + in("ids_range.npy"), "forced_ids[2, 1] = 8"},
      {"forced ids repeated in a row", l + sm + " --replay " + in("ids_dup.npy"), "duplicates"},
      {"forced id -1", l + sm + " --replay " + in("ids_sentinel.npy"), "the capture sentinel"},
      {"forced ids [M, 3] for k = 2", l + sm + " --replay " + in("ids_k3.npy"), "forced ids must be [12, 2], got [12, 3]"},
      {"forced ids of another M", l + sm + " --replay " + in("ids_m5.npy"), "forced ids must be [12, 2], got [5, 2]"},
      {"forced ids of another config (E = 16)", l + sm + " --replay " + in("ids_e16.npy"),
       "is not an expert id in [0, 8)"},
      {"forced ids f32", l + sm + " --replay " + in("ids_f32.npy"), "forced ids must be i32, i16 or u8"},
      {"--layer -5", l + sm + " --layer -5", "--layer: must be an integer in [0, 2147483647], got '-5'"},
      {"--layer past int", l + sm + " --layer 4294967296", "--layer: must be an integer in [0, 2147483647]"},
      {"--dtype i32", l + sm + " --dtype i32", "--dtype must be f32 or bf16, got 'i32'"},
      {"--dtype bogus", l + sm + " --dtype float", "--dtype must be f32 or bf16, got 'float'"},
      {"--activation bogus", l + sm + " --activation tanh", "unknown activation 'tanh'"},
      {"relu2 on gated weights", l + sm + " --activation relu2", "w13 has 32 rows per expert"},
      {"--backend unknown", l + sm + " --backend tpu", "tpu"},
      {"--top-k above E", l + " --method softmax_topk --top-k 9", "routing.top_k"},
      {"--scaling 1e39", l + " --method deepseek_v3 --top-k 2 --num-groups 4 --topk-groups 2 --scaling 1e39",
       "--scaling: must be a finite number > 0"},
      {"--no-bias is a flag", l + sm + " --no-bias=maybe", "--no-bias"},
  };
  expect_rejected(cases);
}

// ----------------------------------------------------------------- capture files

class BadCapture : public BadInput {
 protected:
  void SetUp() override {
    BadInput::SetUp();
    const testing::CommandResult r = testing::run_command(
        std::string(MOEKIT_CLI_PATH) +
        " run --layers 2 --experts 16 --top-k 4 --num-groups 4 --topk-groups 2 --hidden 64 --intermediate 32 "
        "--tokens 40 --requests 2 --decode 2 --max-batch-tokens 16 --capture " + in("cap.safetensors"));
    ASSERT_EQ(r.code, 0) << r.out;
    auto f = io::SafetensorsFile::open(in("cap.safetensors"));
    ASSERT_TRUE(f.ok());
    meta_ = f->metadata();
    for (const auto& e : f->entries()) {
      names_.push_back(e.name);
      tensors_.push_back(f->read(e.name).value());
    }
  }
  // The capture with one metadata value replaced (or removed when `value` is
  // empty), and optionally its ids edited.
  std::string edited(const std::string& name, const std::string& key, const std::string& value,
                     void (*edit_ids)(HostTensor&) = nullptr) {
    std::map<std::string, std::string> meta = meta_;
    if (value.empty()) {
      meta.erase(key);
    } else {
      meta[key] = value;
    }
    std::vector<HostTensor> tensors = tensors_;
    if (edit_ids) edit_ids(tensors[0]);
    std::vector<io::NamedTensor> named;
    for (size_t i = 0; i < names_.size(); ++i) named.push_back({names_[i], tensors[i].view()});
    const std::string path = in(name + ".safetensors");
    EXPECT_TRUE(io::write_safetensors(path, named, meta).ok());
    return path;
  }
  std::string run_meta(const std::string& from, const std::string& to) {
    return replace_once(meta_.at("moekit_run"), from, to);
  }
  std::map<std::string, std::string> meta_;
  std::vector<std::string> names_;
  std::vector<HostTensor> tensors_;
};

TEST_F(BadCapture, ReplayOfBrokenCaptures) {
  const std::string run = meta_.at("moekit_run");
  const size_t digests = run.find("\"step_digests\":[\"") + 16;  // the first digest's opening quote
  const std::string first_digest = run.substr(digests, 18);
  std::vector<Case> cases = {
      {"format_version 4294967297 (1 in 32 bits)", edited("v", "format_version", "4294967297"),
       "capture format version 4294967297"},
      {"top_k 4294967300", edited("k", "top_k", "4294967300"), "\"top_k\" must be an integer in [1, 2147483647]"},
      {"num_moe_layers 4294967298", edited("l", "num_moe_layers", "4294967298"),
       "\"num_moe_layers\" must be an integer in [1, 2147483647]"},
      {"num_experts not an integer", edited("e", "num_experts", "\"16\""), "\"num_experts\" must be an integer"},
      {"routing with a key twice",
       edited("dup", "routing", replace_once(meta_.at("routing"), "{", R"({"top_k":3,)")), "key 'top_k' appears twice"},
      {"routing scaling 1e39",
       edited("scale", "routing", replace_once(meta_.at("routing"), "\"routed_scaling_factor\":2.5",
                                               "\"routed_scaling_factor\":1e39")),
       "must be a finite number (f32)"},
      {"not JSON", edited("json", "requests", "[{"), "\"requests\" is not valid JSON"},
      {"missing key", edited("miss", "model_layers", ""), "lacks \"model_layers\""},
      {"id out of range", edited("ids", "format", "moekit.routed_experts", [](HostTensor& t) { t.data<uint8_t>()[3] = 200; }),
       "id 200 outside [0, 16)"},
      {"digest not hex", edited("hex", "moekit_run", run_meta(first_digest, "\"zzzzzzzzzzzzzzzz\"")),
       "step digest 0 is not 16 hex digits"},
      {"digest short", edited("short", "moekit_run", run_meta(first_digest, "\"abc\"")),
       "step digest 0 is not 16 hex digits"},
      {"one digest too few", edited("few", "moekit_run", run_meta(first_digest + ",", "")), "the capture recorded"},
      {"num_layers 4294967298 in the run", edited("rl", "moekit_run", run_meta("\"num_layers\":2", "\"num_layers\":4294967298")),
       "\"num_layers\" must be an integer in [1, 2147483647]"},
      {"run scaling 1e39", edited("rs", "moekit_run", run_meta("\"routed_scaling_factor\":2.5", "\"routed_scaling_factor\":1e39")),
       "\"routed_scaling_factor\" must be a finite number > 0"},
      {"run seed negative", edited("seed", "moekit_run", run_meta("\"seed\":1234", "\"seed\":-1")), "\"seed\" must be an integer"},
      {"run claims enormous H and I",
       edited("huge", "moekit_run", run_meta("\"hidden\":64", "\"hidden\":1000000000000")), "replay needs about"},
      {"run of another config (E = 32)", edited("e32", "moekit_run", run_meta("\"num_experts\":16", "\"num_experts\":32")),
       "has E=32"},
      {"run description not JSON", edited("rj", "moekit_run", "{\"spec\":"), "is not a JSON object"},
      {"no run description", edited("norun", "moekit_run", ""), "not made by `moekit run`"},
  };
  for (Case& c : cases) c.args = "replay --captures " + c.args;
  Bytes bytes = read_bytes(in("cap.safetensors"));
  Bytes cut(bytes.begin(), bytes.end() - 5);
  write_bytes(in("cut.safetensors"), cut);
  cases.push_back({"truncated", "replay --captures " + in("cut.safetensors"), "extends past the data section"});
  // A NUL in the header's padding: what follows it would be ignored by a lenient reader.
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  bytes[8 + header - 1] = '\0';
  write_bytes(in("nul.safetensors"), bytes);
  cases.push_back({"NUL in the header", "replay --captures " + in("nul.safetensors"), "NUL byte at offset"});
  cases.push_back({"weights, not a capture", "replay --captures " + in("w.safetensors"), "lacks \"format\""});
  cases.push_back({"missing", "replay --captures " + in("none.safetensors"), "NotFound"});
  cases.push_back({"a folder", "replay --captures " + in("a_folder.npy"), "not a regular file"});
  cases.push_back({"no --captures", "replay", "--captures is required"});
  snapshot_ = snapshot();
  expect_rejected(cases);
}

// ----------------------------------------------------------------- run, sizes, commands

TEST_F(BadInput, RunFlagsSizesAndCommands) {
  fs::create_directories(out("a_folder"));
  snapshot_ = snapshot();
  // A small run with some flags changed.
  const std::string capture = out("run.safetensors");
  auto run = [&](std::map<std::string, std::string> changed) {
    std::map<std::string, std::string> flags = {
        {"--layers", "1"},   {"--experts", "8"},       {"--top-k", "2"},  {"--num-groups", "1"},
        {"--topk-groups", "1"}, {"--hidden", "8"},     {"--intermediate", "8"}, {"--tokens", "8"},
        {"--requests", "1"}, {"--decode", "1"},        {"--capture", capture}};
    for (const auto& [flag, value] : changed) flags[flag] = value;
    std::string args = "run";
    for (const auto& [flag, value] : flags) args += " " + flag + " " + value;
    return args;
  };
  const std::vector<Case> cases = {
      {"--threads past the bound", run({{"--threads", "5000"}}), "--threads: must be an integer in [0, 1024]"},
      {"--threads negative", run({{"--threads", "-1"}}), "--threads: must be an integer in [0, 1024]"},
      {"--tokens past 2^40", run({{"--tokens", "2000000000000"}}), "at most 2^40 per run"},
      {"--decode past 2^40 in total", run({{"--requests", "1000"}, {"--decode", "10000000000"}, {"--tokens", "1000"}}),
       "at most 2^40 per run"},
      {"a schedule that does not fit (10^12 tokens, steps of 1)",
       run({{"--tokens", "1000000000000"}, {"--max-batch-tokens", "1"}}), "run needs about"},
      {"weights that do not fit", run({{"--hidden", "1000000000"}, {"--intermediate", "1000000000"}}),
       "run needs about"},
      {"a capture that does not fit", run({{"--layers", "1000000"}, {"--tokens", "1000000000"}}), "run needs about"},
      {"--experts past the int16 ids", run({{"--experts", "40000"}}), "must be <= 32767"},
      {"--layers 0", run({{"--layers", "0"}}), "--layers must be >= 1"},
      {"--layers past int", run({{"--layers", "4294967297"}}), "--layers"},
      {"--requests 0", run({{"--requests", "0"}}), "--requests must be >= 1"},
      {"--decode -1", run({{"--decode", "-1"}}), "--decode must be >= 0"},
      {"--max-batch-tokens 0", run({{"--max-batch-tokens", "0"}}), "max_num_tokens"},
      {"--hidden 0", run({{"--hidden", "0"}}), "hidden"},
      {"--top-k above E", run({{"--top-k", "9"}}), "routing.top_k"},
      {"--scaling inf", run({{"--scaling", "inf"}}), "--scaling: must be a finite number > 0"},
      {"--scaling 1e39", run({{"--scaling", "1e39"}}), "--scaling: must be a finite number > 0"},
      {"--seed -1 (2^64 - 1 when wrapped)", run({{"--seed", "-1"}}), "--seed: must be an integer in [0, 2^64)"},
      {"--seed past 2^64", run({{"--seed", "18446744073709551616"}}), "--seed: must be an integer in [0, 2^64)"},
      {"--capture empty", run({{"--capture", "''"}}), "--capture: the output path is empty"},
      {"--capture a folder", run({{"--capture", out("a_folder")}}), "--capture: '" + out("a_folder") + "' is a folder"},
      {"--capture in a missing folder", run({{"--capture", out("no/c.safetensors")}}), "does not exist"},
      {"--backend unknown", run({{"--backend", "tpu"}}), "tpu"},
      {"a flag given twice", run({}) + " --tokens 9", "--tokens"},
      {"unknown command", "frobnicate --x 1", "unknown command 'frobnicate'"},
      {"unknown command with a newline", "'frob\nnicate'", "unknown command 'frob\\x0anicate'"},
      {"no command", "", "a command is required"},
      {"unknown flag", "run --frobnicate", "--frobnicate"},
      {"backends: scaling inf", "backends --method deepseek_v3 --num-groups 8 --topk-groups 4 --scaling inf",
       "--scaling: must be a finite number > 0"},
      {"backends: unknown dtype", "backends --act-dtype f64", "--act-dtype: unknown dtype 'f64'"},
  };
  expect_rejected(cases);
}

// Inputs larger than memory, as sparse files: refused from their headers with
// what they would need, before anything is allocated.
TEST_F(BadInput, InputsLargerThanMemory) {
  // Logits [2^20, 2^20] f32: 4 TiB.
  const int64_t big = int64_t{1} << 20;
  const Bytes logits_head = npy_file(npy_dict("<f4", "(1048576, 1048576)"), 0);
  if (!write_sparse(in("huge_logits.npy"), logits_head, logits_head.size() + uint64_t(big) * big * 4)) {
    GTEST_SKIP() << "this file system cannot hold a sparse 4 TiB file";
  }
  // Hidden [2^34, 32] f32: 2 TiB of input, and a workspace far beyond it.
  const Bytes hidden_head = npy_file(npy_dict("<f4", "(17179869184, 32)"), 0);
  ASSERT_TRUE(write_sparse(in("huge_hidden.npy"), hidden_head, hidden_head.size() + (uint64_t{1} << 34) * 32 * 4));
  // Stacked weights w13 [8, 2^19, 2^19] bf16 (4 TiB) and w2 [8, 2^19, 2^18] bf16.
  const uint64_t w13 = uint64_t{8} << 38 << 1, w2 = uint64_t{8} << 37 << 1;
  const std::string json = R"({"w13":{"dtype":"BF16","shape":[8,524288,524288],"data_offsets":[0,)" +
                           std::to_string(w13) + R"(]},"w2":{"dtype":"BF16","shape":[8,524288,262144],"data_offsets":[)" +
                           std::to_string(w13) + "," + std::to_string(w13 + w2) + "]}}";
  const Bytes weights_head = safetensors_file(json, 0);
  ASSERT_TRUE(write_sparse(in("huge.safetensors"), weights_head, weights_head.size() + w13 + w2));
  snapshot_ = snapshot();
  const std::vector<Case> cases = {
      {"route: 4 TiB of logits",
       "route --method renormalize --top-k 2 --logits " + in("huge_logits.npy") + " --out-ids " + out("ids.npy") +
           " --out-weights " + out("w.npy"),
       "route needs about"},
      {"layer: 2^34 tokens",
       "layer --weights " + in("w.safetensors") + " --hidden " + in("huge_hidden.npy") + " --out " + out("o.npy") +
           " --method softmax_topk --top-k 2",
       "layer needs about"},
      {"layer: 6 TiB of weights",
       "layer --weights " + in("huge.safetensors") + " --hidden " + in("hidden.npy") + " --out " + out("o.npy") +
           " --method softmax_topk --top-k 2",
       "layer needs about"},
  };
  expect_rejected(cases);
}

}  // namespace
}  // namespace moekit
