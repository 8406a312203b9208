#include "io/npy.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/checked_size.h"
#include "core/printable.h"
#include "io/file_util.h"

namespace moekit::io {
namespace npy {
namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

uint32_t load_le(const uint8_t* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// A cursor over the header dict, e.g.
//   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
class DictParser {
 public:
  DictParser(std::string_view text, std::string_view name) : s_(text), name_(name) {}

  Status parse(std::string* descr, bool* fortran, std::vector<int64_t>* shape) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    skip_ws();
    if (!eat('{')) return error("expected '{'");
    while (true) {
      skip_ws();
      if (eat('}')) break;
      std::string key;
      MOEKIT_RETURN_IF_ERROR(parse_string(&key));
      skip_ws();
      if (!eat(':')) return error("expected ':' after '" + printable(key, 40) + "'");
      skip_ws();
      if (key == "descr") {
        if (peek() == '[') return error("structured dtypes are not supported");
        MOEKIT_RETURN_IF_ERROR(parse_string(descr));
        have_descr = true;
      } else if (key == "fortran_order") {
        if (eat_word("True")) {
          *fortran = true;
        } else if (eat_word("False")) {
          *fortran = false;
        } else {
          return error("fortran_order must be True or False");
        }
        have_fortran = true;
      } else if (key == "shape") {
        MOEKIT_RETURN_IF_ERROR(parse_shape(shape));
        have_shape = true;
      } else {
        return error("unexpected key '" + printable(key, 40) + "'");
      }
      skip_ws();
      if (eat(',')) continue;
      skip_ws();
      if (eat('}')) break;
      return error("expected ',' or '}'");
    }
    skip_ws();
    if (pos_ != s_.size()) return error("unexpected text after the dict");
    if (!have_descr || !have_fortran || !have_shape) {
      return error("the dict must hold 'descr', 'fortran_order' and 'shape'");
    }
    return Status::Ok();
  }

 private:
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  bool eat(char c) {
    if (peek() != c) return false;
    ++pos_;
    return true;
  }
  bool eat_word(std::string_view w) {
    if (s_.substr(pos_, w.size()) != w) return false;
    pos_ += w.size();
    return true;
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\t' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  // One line: the header's own bytes only as an escaped excerpt at the error.
  Status error(const std::string& what) const {
    const size_t at = std::min(pos_, s_.size());
    return DataLoss(std::string(name_) + ": bad .npy header: " + what + " at offset " + std::to_string(at) +
                    " of the header dict (near \"" + printable(s_.substr(at), 24) + "\")");
  }
  Status parse_string(std::string* out) {
    const char q = peek();
    if (q != '\'' && q != '"') return error("expected a quoted string");
    ++pos_;
    const size_t end = s_.find(q, pos_);
    if (end == std::string_view::npos) return error("unterminated string");
    *out = std::string(s_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return Status::Ok();
  }
  Status parse_shape(std::vector<int64_t>* shape) {
    shape->clear();
    if (!eat('(')) return error("shape must be a tuple");
    while (true) {
      skip_ws();
      if (eat(')')) return Status::Ok();
      if (peek() < '0' || peek() > '9') return error("shape entries must be non-negative integers");
      int64_t v = 0;
      while (peek() >= '0' && peek() <= '9') {
        const int digit = s_[pos_] - '0';
        if (v > (std::numeric_limits<int64_t>::max() - digit) / 10) return error("shape entry too large");
        v = v * 10 + digit;
        ++pos_;
      }
      eat('L');  // Python 2 long literal
      shape->push_back(v);
      skip_ws();
      if (eat(',')) continue;
      skip_ws();
      if (eat(')')) return Status::Ok();
      return error("expected ',' or ')' in shape");
    }
  }

  std::string_view s_;
  std::string_view name_;
  size_t pos_ = 0;
};

struct DescrEntry {
  const char* descr;
  DType dtype;
};
// Accepted spellings; the first one of each dtype is what we write.
constexpr DescrEntry kDescrs[] = {
    {"<f4", DType::kF32}, {"<f2", DType::kF16}, {"<i4", DType::kI32}, {"<i2", DType::kI16},
    {"|u1", DType::kU8},  {"<u1", DType::kU8},  {"u1", DType::kU8},   {"<u2", DType::kBF16},
    {"|V2", DType::kBF16}, {"<V2", DType::kBF16}, {"V2", DType::kBF16},
};

StatusOr<DType> dtype_from_descr(const std::string& descr, std::string_view name) {
  for (const DescrEntry& e : kDescrs) {
    if (descr == e.descr) return e.dtype;
  }
  if (!descr.empty() && descr[0] == '>') {
    return InvalidArgument(std::string(name) + ": big-endian dtype '" + printable(descr, 40) + "' is not supported");
  }
  return InvalidArgument(std::string(name) + ": unsupported .npy dtype '" + printable(descr, 40) +
                         "' (supported: <f4, <f2, <i4, <i2, |u1, and bf16 as <u2 or |V2)");
}

}  // namespace

StatusOr<size_t> preamble_size(const uint8_t* b, size_t available, std::string_view name) {
  const std::string n(name);
  if (available == 0) return DataLoss(n + ": empty file (0 bytes), not a .npy file");
  const size_t compare = std::min(available, kMagicLen);
  if (std::memcmp(b, kMagic, compare) != 0) return DataLoss(n + ": not a .npy file (bad magic)");
  if (available < kMagicLen + 2) {
    return DataLoss(n + ": truncated .npy file (" + std::to_string(available) + " bytes)");
  }
  const uint8_t major = b[6];
  if (major == 1) return size_t{10};
  if (major == 2 || major == 3) return size_t{12};
  return DataLoss(n + ": unsupported .npy format version " + std::to_string(major) + "." + std::to_string(b[7]));
}

StatusOr<Header> parse_header(const uint8_t* b, size_t size, std::string_view name) {
  const std::string n(name);
  MOEKIT_ASSIGN_OR_RETURN(const size_t pre, preamble_size(b, size, name));
  if (size < pre) return DataLoss(n + ": truncated .npy header (" + std::to_string(size) + " bytes)");
  const uint64_t dict_len = load_le(b + 8, static_cast<int>(pre - 8));
  Header h;
  h.header_bytes = pre + dict_len;
  if (h.header_bytes > size) {
    return DataLoss(n + ": truncated .npy header: it declares " + std::to_string(h.header_bytes) +
                    " bytes, the file has " + std::to_string(size));
  }
  std::string descr;
  bool fortran = false;
  const std::string_view dict(reinterpret_cast<const char*>(b + pre), dict_len);
  MOEKIT_RETURN_IF_ERROR(DictParser(dict, name).parse(&descr, &fortran, &h.shape));
  MOEKIT_ASSIGN_OR_RETURN(h.dtype, dtype_from_descr(descr, name));
  if (fortran) {
    return InvalidArgument(n + ": Fortran-order arrays are not supported; save a C-order array "
                           "(numpy.ascontiguousarray)");
  }
  if (static_cast<int>(h.shape.size()) > kMaxRank) {
    return InvalidArgument(n + ": rank " + std::to_string(h.shape.size()) + " exceeds the maximum " +
                           std::to_string(kMaxRank));
  }
  const std::optional<int64_t> bytes = checked_nbytes(h.shape, static_cast<int64_t>(dtype_size(h.dtype)));
  if (!bytes) return DataLoss(n + ": shape " + shape_text(h.shape) + " is too large (its sizes overflow 64 bits)");
  h.data_bytes = static_cast<uint64_t>(*bytes);
  return h;
}

std::vector<uint8_t> format_header(std::string_view descr, const std::vector<int64_t>& shape) {
  // The exact text numpy.save writes: sorted keys, repr() values, then spare
  // room for the first axis to grow (GROWTH_AXIS_MAX_DIGITS = 21).
  std::string dict = "{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) {
    dict += std::to_string(shape[i]);
    if (shape.size() == 1 || i + 1 < shape.size()) dict += shape.size() == 1 ? "," : ", ";
  }
  dict += "), }";
  if (!shape.empty()) dict += std::string(21 - std::to_string(shape[0]).size(), ' ');
  // Version 1.0 stores the dict length in 2 bytes; 2.0 in 4.
  size_t pre = 10;
  size_t pad = kAlign - (pre + dict.size() + 1) % kAlign;
  if (dict.size() + 1 + pad > 0xffff) {
    pre = 12;
    pad = kAlign - (pre + dict.size() + 1) % kAlign;
  }
  const uint32_t dict_len = static_cast<uint32_t>(dict.size() + pad + 1);
  std::vector<uint8_t> out(kMagic, kMagic + kMagicLen);
  out.push_back(pre == 10 ? 1 : 2);
  out.push_back(0);
  for (size_t i = 0; i < pre - 8; ++i) out.push_back(static_cast<uint8_t>(dict_len >> (8 * i)));
  out.insert(out.end(), dict.begin(), dict.end());
  out.insert(out.end(), pad, ' ');
  out.push_back('\n');
  return out;
}

}  // namespace npy

namespace {

Status check_writable(const TensorView& t) {
  if (!t.defined() && t.numel() != 0) return InvalidArgument("npy: tensor has no data");
  if (t.device.type != DeviceType::kCpu) return InvalidArgument("npy: tensor must be on the host, got " + t.device.to_string());
  if (!t.is_contiguous()) return InvalidArgument("npy: tensor must be contiguous");
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] < 0) return InvalidArgument("npy: negative dimension in " + t.shape_string());
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::vector<uint8_t>> encode_npy(const TensorView& t, const NpyWriteOptions& opts) {
  MOEKIT_RETURN_IF_ERROR(check_writable(t));
  const std::vector<int64_t> shape(t.shape.begin(), t.shape.begin() + t.rank);
  const int64_t n = t.numel();
  const char* descr = nullptr;
  bool widen = false;  // bf16 / f8 written as exact f32
  switch (t.dtype) {
    case DType::kF32: descr = "<f4"; break;
    case DType::kF16: descr = "<f2"; break;
    case DType::kI32: descr = "<i4"; break;
    case DType::kI16: descr = "<i2"; break;
    case DType::kU8: descr = "|u1"; break;
    case DType::kBF16:
      switch (opts.bf16) {
        case Bf16Storage::kAsF32: descr = "<f4"; widen = true; break;
        case Bf16Storage::kRaw: descr = "<u2"; break;
      }
      break;
    case DType::kF8E4M3: descr = "<f4"; widen = true; break;
  }
  std::vector<uint8_t> out = npy::format_header(descr, shape);
  const size_t head = out.size();
  if (widen) {
    out.resize(head + static_cast<size_t>(n) * 4);
    float* dst = reinterpret_cast<float*>(out.data() + head);  // [numel] f32, little-endian host
    for (int64_t i = 0; i < n; ++i) {
      dst[i] = t.dtype == DType::kBF16 ? bf16_bits_to_f32(t.ptr<const uint16_t>()[i])
                                       : f8e4m3_bits_to_f32(t.ptr<const uint8_t>()[i]);
    }
  } else {
    const auto* src = static_cast<const uint8_t*>(t.data);
    if (n > 0) out.insert(out.end(), src, src + t.nbytes());
  }
  return out;
}

Status write_npy(const std::string& path, const TensorView& t, const NpyWriteOptions& opts) {
  auto bytes = encode_npy(t, opts);
  if (!bytes.ok()) return Status(bytes.status().code(), path + ": " + bytes.status().message());
  return write_file_atomic(path, *bytes);
}

namespace {

// The data must be exactly what the header's shape needs.
Status check_data_size(const npy::Header& h, uint64_t file_size, const std::string& name) {
  const uint64_t have = file_size - h.header_bytes;
  if (have == h.data_bytes) return Status::Ok();
  std::string shape;
  for (size_t i = 0; i < h.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(h.shape[i]);
  return DataLoss(name + ": " + (have < h.data_bytes ? "truncated .npy data" : "trailing bytes after .npy data") +
                  ": shape (" + shape + ") of " + dtype_name(h.dtype) + " needs " + std::to_string(h.data_bytes) +
                  " data bytes, the file has " + std::to_string(have));
}

// Reads and checks the header of an open file, leaving it positioned at the data.
StatusOr<npy::Header> read_header(InputFile& f, const std::string& path) {
  // Magic and version, then the 2- or 4-byte dict length they imply.
  uint8_t first[12] = {};  // preamble: magic(6) version(2) length(2|4)
  const size_t n_first = static_cast<size_t>(std::min<uint64_t>(f.size, 8));
  MOEKIT_RETURN_IF_ERROR(read_exact(f, first, n_first, path));
  MOEKIT_ASSIGN_OR_RETURN(const size_t pre, npy::preamble_size(first, n_first, path));
  if (f.size < pre) return DataLoss(path + ": truncated .npy header (" + std::to_string(f.size) + " bytes)");
  MOEKIT_RETURN_IF_ERROR(read_exact(f, first + 8, pre - 8, path));
  uint64_t dict_len = 0;
  for (size_t i = pre; i-- > 8;) dict_len = (dict_len << 8) | first[i];
  if (pre + dict_len > f.size) {
    return DataLoss(path + ": truncated .npy header: it declares " + std::to_string(pre + dict_len) +
                    " bytes, the file has " + std::to_string(f.size));
  }
  std::vector<uint8_t> header(pre + dict_len);
  std::memcpy(header.data(), first, pre);
  MOEKIT_RETURN_IF_ERROR(read_exact(f, header.data() + pre, dict_len, path));
  MOEKIT_ASSIGN_OR_RETURN(npy::Header h, npy::parse_header(header.data(), header.size(), path));
  MOEKIT_RETURN_IF_ERROR(check_data_size(h, f.size, path));
  return h;
}

}  // namespace

// Header first (so a huge declared size is refused before any allocation),
// then the data straight into the tensor.
StatusOr<HostTensor> parse_npy(const void* bytes, size_t size, std::string_view name) {
  const auto* b = static_cast<const uint8_t*>(bytes);
  const std::string n(name);
  MOEKIT_ASSIGN_OR_RETURN(npy::Header h, npy::parse_header(b, size, name));
  MOEKIT_RETURN_IF_ERROR(check_data_size(h, size, n));
  MOEKIT_ASSIGN_OR_RETURN(HostTensor t, allocate_host_tensor(h.dtype, h.shape, n));
  if (h.data_bytes) std::memcpy(t.data<uint8_t>(), b + h.header_bytes, h.data_bytes);
  return t;
}

StatusOr<HostTensor> read_npy(const std::string& path) {
  InputFile f;
  MOEKIT_RETURN_IF_ERROR(open_input(path, &f));
  MOEKIT_ASSIGN_OR_RETURN(const npy::Header h, read_header(f, path));
  MOEKIT_ASSIGN_OR_RETURN(HostTensor t, allocate_host_tensor(h.dtype, h.shape, path));
  MOEKIT_RETURN_IF_ERROR(read_exact(f, t.data<uint8_t>(), h.data_bytes, path));
  return t;
}

StatusOr<NpyInfo> read_npy_info(const std::string& path) {
  InputFile f;
  MOEKIT_RETURN_IF_ERROR(open_input(path, &f));
  MOEKIT_ASSIGN_OR_RETURN(const npy::Header h, read_header(f, path));
  return NpyInfo{h.dtype, h.shape};
}

}  // namespace moekit::io
