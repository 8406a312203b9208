#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "core/checked_size.h"
#include "core/printable.h"
#include "io/file_util.h"
#include "io/json_strict.h"
#include "moekit/io.h"

namespace moekit::io {
namespace safetensors {

std::optional<DtypeInfo> dtype_info(std::string_view name) {
  struct Row {
    const char* name;
    std::optional<DType> dtype;
    uint64_t bytes;
  };
  static const Row kRows[] = {
      {"F32", DType::kF32, 4},      {"F16", DType::kF16, 2},   {"BF16", DType::kBF16, 2},
      {"F8_E4M3", DType::kF8E4M3, 1}, {"I32", DType::kI32, 4}, {"I16", DType::kI16, 2},
      {"U8", DType::kU8, 1},
      // Defined by the format, not loaded by moekit (an entry of these is
      // still validated; reading it is refused).
      {"F64", std::nullopt, 8},     {"I64", std::nullopt, 8},  {"U64", std::nullopt, 8},
      {"U32", std::nullopt, 4},     {"U16", std::nullopt, 2},  {"I8", std::nullopt, 1},
      {"BOOL", std::nullopt, 1},    {"F8_E5M2", std::nullopt, 1}, {"F8_E8M0", std::nullopt, 1},
  };
  for (const Row& r : kRows) {
    if (name == r.name) return DtypeInfo{r.dtype, r.bytes};
  }
  return std::nullopt;
}

const char* dtype_to_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kI32: return "I32";
    case DType::kI16: return "I16";
    case DType::kU8: return "U8";
  }
  return "?";
}

}  // namespace safetensors

namespace {

using Json = nlohmann::json;

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// What encode_safetensors and of_views take: unique non-empty names, host
// contiguous views, stored dtypes and shapes that fit the bytes.
Status check_named_tensors(const std::vector<NamedTensor>& tensors) {
  std::set<std::string_view> names;  // (a pairwise check was quadratic in the number of tensors)
  for (size_t i = 0; i < tensors.size(); ++i) {
    const NamedTensor& nt = tensors[i];
    const std::string where = "safetensors: tensor '" + printable(nt.name, 80) + "': ";
    if (nt.name.empty()) return InvalidArgument("safetensors: tensor " + std::to_string(i) + " has an empty name");
    if (nt.name == "__metadata__") return InvalidArgument("safetensors: '__metadata__' is reserved");
    if (!names.insert(nt.name).second) return InvalidArgument(where + "name used twice");
    const TensorView& t = nt.tensor;
    if (!t.defined() && t.numel() != 0) return InvalidArgument(where + "no data");
    if (t.device.type != DeviceType::kCpu) return InvalidArgument(where + "must be on the host");
    if (!t.is_contiguous()) return InvalidArgument(where + "must be contiguous");
    for (int d = 0; d < t.rank; ++d) {
      if (t.shape[d] < 0) return InvalidArgument(where + "negative dimension in " + t.shape_string());
    }
    if (nt.stored_shape) {
      const auto info = safetensors::dtype_info(nt.stored_dtype);
      if (!info) return InvalidArgument(where + "stored_shape needs a safetensors stored_dtype");
      uint64_t need = info->element_bytes;
      for (int64_t d : *nt.stored_shape) {
        if (d < 0) return InvalidArgument(where + "negative dimension in stored_shape");
        need *= static_cast<uint64_t>(d);
      }
      if (t.dtype != DType::kU8 || t.nbytes() != need) {
        return InvalidArgument(where + "stored_shape " + shape_str(*nt.stored_shape) + " of " +
                               printable(nt.stored_dtype, 20) + " needs a u8 view of " + std::to_string(need) +
                               " bytes");
      }
    } else if (!nt.stored_dtype.empty()) {
      const auto info = safetensors::dtype_info(nt.stored_dtype);
      if (!info || info->element_bytes != dtype_size(t.dtype)) {
        return InvalidArgument(where + "cannot store " + dtype_name(t.dtype) + " elements as " +
                               printable(nt.stored_dtype, 20));
      }
    }
  }
  return Status::Ok();
}

// Parses one tensor entry of the header; `data_size` is the data section's length.
StatusOr<SafetensorsEntry> parse_entry(const std::string& file, const std::string& name, const Json& v,
                                       uint64_t data_size) {
  const std::string where = file + ": tensor '" + printable(name, 80) + "': ";
  if (!v.is_object()) return InvalidArgument(where + "header entry is not an object");
  const auto dt = v.find("dtype");
  const auto sh = v.find("shape");
  const auto off = v.find("data_offsets");
  if (dt == v.end() || !dt->is_string()) return InvalidArgument(where + "missing string 'dtype'");
  if (sh == v.end() || !sh->is_array()) return InvalidArgument(where + "missing array 'shape'");
  if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned()) {
    return InvalidArgument(where + "'data_offsets' must be two non-negative integers");
  }
  SafetensorsEntry e;
  e.name = name;
  e.dtype_name = dt->get<std::string>();
  const auto info = safetensors::dtype_info(e.dtype_name);
  if (!info) return InvalidArgument(where + "unknown dtype '" + printable(e.dtype_name, 20) + "'");
  e.dtype = info->dtype;
  uint64_t need = info->element_bytes;
  bool overflow = false;
  for (const Json& d : *sh) {
    if (!d.is_number_unsigned()) return InvalidArgument(where + "shape entries must be non-negative integers");
    const uint64_t n = d.get<uint64_t>();
    if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) overflow = true;
    if (n != 0 && need > std::numeric_limits<uint64_t>::max() / n) overflow = true;
    need *= n;
    e.shape.push_back(static_cast<int64_t>(n));
  }
  // Every stride of it must fit too, even when a zero makes it empty.
  overflow = overflow || !checked_nbytes(e.shape, static_cast<int64_t>(info->element_bytes));
  if (overflow) return DataLoss(where + "shape " + shape_str(e.shape) + " is too large");
  const uint64_t begin = (*off)[0].get<uint64_t>();
  const uint64_t end = (*off)[1].get<uint64_t>();
  const std::string range = "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + ")";
  if (end < begin) return DataLoss(where + range + " ends before it begins");
  if (end - begin != need) {
    return DataLoss(where + range + " holds " + std::to_string(end - begin) + " bytes, but " + e.dtype_name +
                    " x " + shape_str(e.shape) + " needs " + std::to_string(need));
  }
  if (end > data_size) {
    return DataLoss(where + range + " extends past the data section (" + std::to_string(data_size) +
                    " bytes; truncated file?)");
  }
  e.offset = begin;
  e.nbytes = need;
  return e;
}

}  // namespace

struct SafetensorsFile::Mapping {
  std::unique_ptr<ByteSource> bytes;
};

SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

namespace detail {

StatusOr<SafetensorsFile> open_safetensors(const std::string& path, const std::function<void()>& between) {
  MOEKIT_ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> bytes, ByteSource::map_file(path));
  if (between) between();
  auto m = std::make_unique<SafetensorsFile::Mapping>();
  m->bytes = std::move(bytes);
  return SafetensorsFile::from_mapping(std::move(m), path);
}

}  // namespace detail

StatusOr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  return detail::open_safetensors(path, nullptr);
}

StatusOr<SafetensorsFile> SafetensorsFile::parse(const void* bytes, size_t size, std::string_view name) {
  auto m = std::make_unique<Mapping>();
  m->bytes = ByteSource::copy_of(bytes, size);
  return from_mapping(std::move(m), std::string(name));
}

StatusOr<SafetensorsFile> SafetensorsFile::parse_borrowed(const void* bytes, size_t size, std::string_view name) {
  auto m = std::make_unique<Mapping>();
  m->bytes = ByteSource::borrow(bytes, size);
  MOEKIT_ASSIGN_OR_RETURN(SafetensorsFile f, from_mapping(std::move(m), std::string(name)));
  f.borrowed_ = true;
  return f;
}

StatusOr<SafetensorsFile> SafetensorsFile::of_views(const std::vector<NamedTensor>& tensors, std::string_view name) {
  MOEKIT_RETURN_IF_ERROR(check_named_tensors(tensors));
  const std::string path(name);
  // One borrowed span from the lowest tensor to the end of the highest: every
  // entry's offset is its distance from the lowest, so view() finds its bytes.
  const uint8_t* lo = nullptr;
  const uint8_t* hi = nullptr;
  for (const NamedTensor& nt : tensors) {
    if (nt.tensor.nbytes() == 0) continue;
    const auto* p = static_cast<const uint8_t*>(nt.tensor.data);
    if (lo == nullptr || p < lo) lo = p;
    if (hi == nullptr || p + nt.tensor.nbytes() > hi) hi = p + nt.tensor.nbytes();
  }
  auto m = std::make_unique<Mapping>();
  m->bytes = ByteSource::borrow(lo, lo == nullptr ? 0 : static_cast<size_t>(hi - lo));
  SafetensorsFile f;
  f.path_ = path;
  f.borrowed_ = true;
  for (const NamedTensor& nt : tensors) {
    SafetensorsEntry e;
    e.name = nt.name;
    e.dtype_name = nt.stored_dtype.empty() ? safetensors::dtype_to_name(nt.tensor.dtype) : nt.stored_dtype;
    e.dtype = safetensors::dtype_info(e.dtype_name)->dtype;
    e.shape = nt.stored_shape ? *nt.stored_shape
                              : std::vector<int64_t>(nt.tensor.shape.begin(), nt.tensor.shape.begin() + nt.tensor.rank);
    e.nbytes = nt.tensor.nbytes();
    e.offset = e.nbytes == 0 ? 0 : static_cast<uint64_t>(static_cast<const uint8_t*>(nt.tensor.data) - lo);
    f.entries_.push_back(std::move(e));
  }
  std::stable_sort(f.entries_.begin(), f.entries_.end(),
                   [](const SafetensorsEntry& a, const SafetensorsEntry& c) { return a.offset < c.offset; });
  for (size_t i = 0; i < f.entries_.size(); ++i) f.index_.emplace(f.entries_[i].name, i);
  f.data_ = lo;
  f.mapping_ = std::move(m);
  return f;
}

StatusOr<SafetensorsFile> SafetensorsFile::from_mapping(std::unique_ptr<Mapping> mapping, std::string path) {
  // The length and the header are copied through the checked read, never
  // parsed from the mapping: a file cut since it was mapped is then DataLoss,
  // not SIGBUS.
  const ByteSource& src = *mapping->bytes;
  const uint8_t* b = src.data();
  const uint64_t size = src.size();
  if (size < 8) {
    return DataLoss(path + ": " + std::to_string(size) + " bytes is too short for a safetensors file (the "
                    "header length alone takes 8)");
  }
  uint8_t length[8];
  MOEKIT_RETURN_IF_ERROR(src.read(0, 8, length));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | length[i];
  if (header_len > size - 8) {
    return DataLoss(path + ": header length " + std::to_string(header_len) + " exceeds the " +
                    std::to_string(size - 8) + " bytes after the length field (truncated or not safetensors)");
  }
  if (header_len > safetensors::kMaxHeaderBytes) {
    return DataLoss(path + ": header length " + std::to_string(header_len) + " exceeds the format's limit of " +
                    std::to_string(safetensors::kMaxHeaderBytes));
  }
  std::string text;
  try {
    text.resize(header_len);
  } catch (const std::bad_alloc&) {
    return ResourceExhausted(path + ": cannot allocate " + std::to_string(header_len) + " bytes for the header");
  }
  MOEKIT_RETURN_IF_ERROR(src.read(8, header_len, text.data()));
  MOEKIT_ASSIGN_OR_RETURN(const Json header, parse_json_strict(text, path + ": header"));
  if (!header.is_object()) return DataLoss(path + ": header is not a JSON object");

  SafetensorsFile f;
  f.path_ = std::move(path);
  const uint64_t data_size = size - 8 - header_len;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return InvalidArgument(f.path_ + ": '__metadata__' must be an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          return InvalidArgument(f.path_ + ": '__metadata__' value of '" + printable(m.key(), 60) +
                                 "' must be a string");
        }
        f.metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    // The writer refuses an empty name too: a file is read only if it could have been written.
    if (it.key().empty()) return DataLoss(f.path_ + ": a tensor has an empty name");
    MOEKIT_ASSIGN_OR_RETURN(SafetensorsEntry e, parse_entry(f.path_, it.key(), *it, data_size));
    f.entries_.push_back(std::move(e));
  }
  std::stable_sort(f.entries_.begin(), f.entries_.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& c) {
    return a.offset != c.offset ? a.offset < c.offset : a.nbytes < c.nbytes;
  });
  // Sorted by offset, two tensors overlap exactly when one starts before the
  // previous non-empty one ends.
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry& e : f.entries_) {
    if (e.nbytes == 0) continue;
    if (prev && e.offset < prev->offset + prev->nbytes) {
      return DataLoss(f.path_ + ": tensor '" + printable(e.name, 80) + "' (bytes [" + std::to_string(e.offset) + ", " +
                      std::to_string(e.offset + e.nbytes) + ")) overlaps tensor '" + printable(prev->name, 80) + "' (bytes [" +
                      std::to_string(prev->offset) + ", " + std::to_string(prev->offset + prev->nbytes) + "))");
    }
    prev = &e;
  }
  for (size_t i = 0; i < f.entries_.size(); ++i) f.index_.emplace(f.entries_[i].name, i);
  // The entries were checked against the size at mapping time: the file must
  // still have it before any pointer into the mapping is handed out.
  MOEKIT_RETURN_IF_ERROR(src.check_intact(size));
  f.mapping_ = std::move(mapping);
  f.data_ = b + 8 + header_len;
  return f;
}

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

StatusOr<const SafetensorsEntry*> SafetensorsFile::loadable(std::string_view name) const {
  const SafetensorsEntry* e = find(name);
  if (!e) return NotFound(path_ + ": no tensor named '" + printable(name, 80) + "'");
  if (!e->dtype) {
    return Unsupported(path_ + ": tensor '" + printable(e->name, 80) + "' has dtype " + e->dtype_name +
                       ", which moekit does not load (F32, F16, BF16, F8_E4M3, I32, I16, U8)");
  }
  if (static_cast<int>(e->shape.size()) > kMaxRank) {
    return Unsupported(path_ + ": tensor '" + printable(e->name, 80) + "' has rank " + std::to_string(e->shape.size()) +
                       " (at most " + std::to_string(kMaxRank) + ")");
  }
  return e;
}

StatusOr<TensorView> SafetensorsFile::view(std::string_view name) const {
  MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* e, loadable(name));
  const uint8_t* p = data_ + e->offset;
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(*e->dtype) != 0) {
    return FailedPrecondition(path_ + ": tensor '" + printable(e->name, 80) + "' is not aligned to its element size in the "
                              "file; read() it instead");
  }
  MOEKIT_RETURN_IF_ERROR(mapping_->bytes->check_intact(static_cast<uint64_t>(p - mapping_->bytes->data()) + e->nbytes));
  // Views are read-only by contract: the mapping is PROT_READ.
  return TensorView::contiguous(const_cast<uint8_t*>(p), *e->dtype, e->shape);
}

StatusOr<HostTensor> SafetensorsFile::read(std::string_view name) const {
  MOEKIT_ASSIGN_OR_RETURN(const SafetensorsEntry* e, loadable(name));
  MOEKIT_ASSIGN_OR_RETURN(HostTensor t, allocate_host_tensor(*e->dtype, e->shape, path_ + ": tensor '" + printable(e->name, 80) + "'"));
  // Through the checked path: a file truncated since it was opened is an error, not SIGBUS.
  MOEKIT_RETURN_IF_ERROR(mapping_->bytes->read(data_start() + e->offset, e->nbytes, t.data<uint8_t>()));
  return t;
}

StatusOr<const uint8_t*> SafetensorsFile::bytes(std::string_view name) const {
  const SafetensorsEntry* e = find(name);
  if (!e) return NotFound(path_ + ": no tensor named '" + printable(name, 80) + "'");
  MOEKIT_RETURN_IF_ERROR(mapping_->bytes->check_intact(data_start() + e->offset + e->nbytes));
  return data_ + e->offset;
}

StatusOr<std::vector<uint8_t>> SafetensorsFile::copy_bytes(std::string_view name) const {
  const SafetensorsEntry* e = find(name);
  if (!e) return NotFound(path_ + ": no tensor named '" + printable(name, 80) + "'");
  std::vector<uint8_t> out;
  try {
    out.resize(e->nbytes);
  } catch (const std::bad_alloc&) {
    return ResourceExhausted(path_ + ": tensor '" + printable(e->name, 80) + "': cannot allocate " +
                             std::to_string(e->nbytes) + " bytes for a copy");
  }
  MOEKIT_RETURN_IF_ERROR(mapping_->bytes->read(data_start() + e->offset, e->nbytes, out.data()));
  return out;
}

uint64_t SafetensorsFile::data_start() const { return static_cast<uint64_t>(data_ - mapping_->bytes->data()); }

StatusOr<std::vector<uint8_t>> encode_safetensors(const std::vector<NamedTensor>& tensors,
                                                  const std::map<std::string, std::string>& metadata) {
  MOEKIT_RETURN_IF_ERROR(check_named_tensors(tensors));
  // Wider elements first, so every tensor stays aligned to its element size
  // (the data section starts 8-aligned); ties keep the caller's order.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const auto element_bytes = [&](size_t i) -> uint64_t {
    if (tensors[i].stored_shape) return safetensors::dtype_info(tensors[i].stored_dtype)->element_bytes;
    return dtype_size(tensors[i].tensor.dtype);
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return element_bytes(a) > element_bytes(b); });
  // The header as ordered_json would dump it, written entry by entry: its
  // operator[] searches the keys linearly (quadratic in the number of tensors).
  std::string text = "{";
  uint64_t offset = 0;
  try {
    if (!metadata.empty()) text += "\"__metadata__\":" + nlohmann::ordered_json(metadata).dump();
    for (size_t i : order) {
      const TensorView& t = tensors[i].tensor;
      const uint64_t n = t.nbytes();
      nlohmann::ordered_json e;
      e["dtype"] = tensors[i].stored_dtype.empty() ? std::string(safetensors::dtype_to_name(t.dtype))
                                                   : tensors[i].stored_dtype;
      e["shape"] = tensors[i].stored_shape ? *tensors[i].stored_shape
                                           : std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.rank);
      e["data_offsets"] = {offset, offset + n};
      text += (text.size() > 1 ? "," : "") + nlohmann::ordered_json(tensors[i].name).dump() + ":" + e.dump();
      offset += n;
    }
  } catch (const nlohmann::json::exception&) {
    return InvalidArgument("safetensors: tensor names and metadata must be valid UTF-8");
  }
  text += "}";
  text.append((safetensors::kHeaderAlign - text.size() % safetensors::kHeaderAlign) % safetensors::kHeaderAlign, ' ');
  std::vector<uint8_t> out;
  out.reserve(8 + text.size() + offset);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i)));
  out.insert(out.end(), text.begin(), text.end());
  for (size_t i : order) {
    const TensorView& t = tensors[i].tensor;
    const auto* p = static_cast<const uint8_t*>(t.data);
    if (t.nbytes()) out.insert(out.end(), p, p + t.nbytes());
  }
  return out;
}

Status write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  auto bytes = encode_safetensors(tensors, metadata);
  if (!bytes.ok()) return Status(bytes.status().code(), path + ": " + bytes.status().message());
  return write_file_atomic(path, *bytes);
}

}  // namespace moekit::io
