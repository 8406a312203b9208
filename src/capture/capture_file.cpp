// The capture file: safetensors with a self-describing "__metadata__" map
// (docs/capture.md). Version 2 (written): ids u8 when E <= 255, else u16, the
// sentinel -1 stored as the type's all-ones value; optional router weights.
// Version 1 (read): ids u8 when E <= 256, else i16, no sentinel.
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "capture/capture_file.h"
#include "core/printable.h"
#include "io/json_strict.h"
#include "moekit/capture.h"
#include "moekit/io.h"

namespace moekit {

namespace {

constexpr const char* kFormatName = "moekit.routed_experts";
constexpr int64_t kMaxU8ExpertsV1 = 256;
constexpr int64_t kMaxInt = std::numeric_limits<int>::max();  // counts stored as int in CaptureInfo

using Json = nlohmann::json;

// The "__metadata__" keys the format defines; any other key is extra metadata.
const std::set<std::string> kFormatKeys = {"format",       "format_version", "routing_spec_version", "routing",
                                           "num_experts",  "top_k",          "num_moe_layers",       "model_layers",
                                           "id_space",     "id_order",       "id_dtype",             "layout",
                                           "requests",     "id_sentinel",    "backend",              "router_weights"};

std::string tensor_name(size_t i) { return "routed_experts." + std::to_string(i); }
std::string weights_tensor_name(size_t i) { return "router_weights." + std::to_string(i); }

// How ids are stored in a file of a version: the safetensors dtype name, its
// element size, and the stored value of the sentinel (-1 in memory); v1 has none.
struct StoredIds {
  const char* dtype;     // "U8", "U16" or "I16"
  const char* id_dtype;  // the "id_dtype" metadata value
  int bytes;
  int64_t sentinel;  // -1: no sentinel in this version
};

StoredIds stored_ids(int version, int64_t num_experts) {
  if (version == 1) return num_experts <= kMaxU8ExpertsV1 ? StoredIds{"U8", "u8", 1, -1} : StoredIds{"I16", "i16", 2, -1};
  // NOTE: E <= 255 keeps 255 free for the sentinel; E <= 32767 (routing.md) keeps 65535 free.
  return num_experts <= kMaxU8CaptureExperts ? StoredIds{"U8", "u8", 1, 0xff} : StoredIds{"U16", "u16", 2, 0xffff};
}

Json routing_json(const RoutingConfig& r) {
  return Json{{"method", routing_method_name(r.method)},
              {"top_k", r.top_k},
              {"num_groups", r.num_groups},
              {"topk_groups", r.topk_groups},
              {"routed_scaling_factor", r.routed_scaling_factor},
              {"score_bias", r.has_score_bias},
              {"renormalize", r.renormalize}};
}

// Parses a metadata value as JSON (strictly: one value, unique keys), naming the key on failure.
StatusOr<Json> parse_value(const std::map<std::string, std::string>& meta, const std::string& key,
                           const std::string& file) {
  auto it = meta.find(key);
  if (it == meta.end()) return DataLoss(file + ": capture metadata lacks \"" + key + "\"");
  return io::parse_json_strict(it->second, file + ": capture metadata \"" + key + "\"");
}

// An integer metadata value in [lo, hi]; a number outside it is an error, never truncated.
StatusOr<int64_t> int_value(const std::map<std::string, std::string>& meta, const std::string& key,
                            const std::string& file, int64_t lo, int64_t hi) {
  MOEKIT_ASSIGN_OR_RETURN(Json j, parse_value(meta, key, file));
  const std::optional<int64_t> v = io::json_integer(j, lo, hi);
  if (!v) {
    return DataLoss(file + ": capture metadata \"" + key + "\" must be an integer in [" + std::to_string(lo) + ", " +
                    std::to_string(hi) + "], got " + printable(meta.at(key), 40));
  }
  return *v;
}

StatusOr<std::string> string_value(const std::map<std::string, std::string>& meta, const std::string& key,
                                   const std::string& file) {
  auto it = meta.find(key);
  if (it == meta.end()) return DataLoss(file + ": capture metadata lacks \"" + key + "\"");
  return it->second;
}

// A field of a JSON object, of type T; integers must fit T and be >= 0 where
// the format says so (min), floats must be finite f32 values.
template <typename T>
StatusOr<T> json_field(const Json& j, const char* key, const std::string& what, int64_t min = 0) {
  if (!j.is_object() || !j.contains(key)) return DataLoss(what + ": missing field \"" + key + "\"");
  const Json& v = j.at(key);
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) return DataLoss(what + ": field \"" + key + "\" must be a boolean");
    return v.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    const std::optional<int64_t> n = io::json_integer(v, min, std::numeric_limits<T>::max());
    if (!n) {
      return DataLoss(what + ": field \"" + key + "\" must be an integer in [" + std::to_string(min) + ", " +
                      std::to_string(std::numeric_limits<T>::max()) + "]");
    }
    return static_cast<T>(*n);
  } else if constexpr (std::is_floating_point_v<T>) {
    const double d = v.is_number() ? v.get<double>() : std::nan("");
    if (!std::isfinite(d) || std::fabs(d) > std::numeric_limits<T>::max()) {
      return DataLoss(what + ": field \"" + key + "\" must be a finite number (f32)");
    }
    return static_cast<T>(d);
  } else {
    if (!v.is_string()) return DataLoss(what + ": field \"" + key + "\" must be a string");
    return v.get<T>();
  }
}

StatusOr<RoutingConfig> parse_routing(const Json& j, const std::string& what) {
  RoutingConfig r;
  MOEKIT_ASSIGN_OR_RETURN(std::string method, json_field<std::string>(j, "method", what));
  auto m = parse_routing_method(method);
  if (!m) return DataLoss(what + ": unknown routing method \"" + printable(method, 40) + "\"");
  r.method = *m;
  MOEKIT_ASSIGN_OR_RETURN(r.top_k, json_field<int>(j, "top_k", what));
  MOEKIT_ASSIGN_OR_RETURN(r.num_groups, json_field<int>(j, "num_groups", what));
  MOEKIT_ASSIGN_OR_RETURN(r.topk_groups, json_field<int>(j, "topk_groups", what));
  MOEKIT_ASSIGN_OR_RETURN(r.routed_scaling_factor, json_field<float>(j, "routed_scaling_factor", what));
  MOEKIT_ASSIGN_OR_RETURN(r.has_score_bias, json_field<bool>(j, "score_bias", what));
  // Optional: files written before the flag existed renormalize (the default).
  if (j.is_object() && j.contains("renormalize")) {
    MOEKIT_ASSIGN_OR_RETURN(r.renormalize, json_field<bool>(j, "renormalize", what));
  }
  return r;
}

Status check_info(const CaptureInfo& info, const std::string& what) {
  if (info.num_moe_layers() < 1) return InvalidArgument(what + ": a capture needs >= 1 MoE layer");
  MOEKIT_RETURN_IF_ERROR(info.routing.validate(static_cast<int>(info.num_experts)));
  for (size_t l = 1; l < info.model_layers.size(); ++l) {
    if (info.model_layers[l] <= info.model_layers[l - 1]) {
      return InvalidArgument(what + ": model_layers must increase, got " +
                             Json(info.model_layers).dump());
    }
  }
  if (info.id_space != "logical") {
    return InvalidArgument(what + ": id_space must be \"logical\", got \"" + printable(info.id_space, 40) + "\"");
  }
  return Status::Ok();
}

// Ids in [0, E) or the sentinel -1 (named by request for the writer's error).
Status check_writable_ids(const RequestCapture& r, int64_t num_experts) {
  const int16_t* ids = r.ids.data<int16_t>();
  for (int64_t e = 0; e < r.ids.numel(); ++e) {
    if (ids[e] != kUnwrittenExpertId && (ids[e] < 0 || ids[e] >= num_experts)) {
      return OutOfRange("write_capture_file: request '" + r.request + "' holds id " + std::to_string(ids[e]) +
                        " outside [0, " + std::to_string(num_experts) + ") (and not the sentinel -1)");
    }
  }
  return Status::Ok();
}

// i16 ids -> the stored type: the low bits of the two's complement value, so
// -1 becomes all ones (255 or 65535) and ids in [0, E) are unchanged.
HostTensor to_stored(const HostTensor& ids, const StoredIds& st) {
  if (st.bytes == 2) {
    HostTensor out(DType::kI16, ids.shape());  // the same bits; written under "U16"
    if (ids.numel()) std::memcpy(out.data<void>(), ids.data<void>(), ids.nbytes());
    return out;
  }
  HostTensor out(DType::kU8, ids.shape());
  const int16_t* src = ids.data<int16_t>();
  uint8_t* dst = out.data<uint8_t>();
  for (int64_t i = 0; i < ids.numel(); ++i) dst[i] = static_cast<uint8_t>(src[i] & 0xff);
  return out;
}

}  // namespace

Status write_capture_file(const std::string& path, const CaptureSet& captures) {
  const CaptureInfo& info = captures.info;
  MOEKIT_RETURN_IF_ERROR(check_info(info, "write_capture_file(" + path + ")"));
  const std::optional<DType> wdt = info.router_weights_dtype;
  if (wdt && *wdt != DType::kF32 && *wdt != DType::kBF16) {
    return InvalidArgument(std::string("write_capture_file: router weights must be f32 or bf16, got ") +
                           dtype_name(*wdt));
  }
  const StoredIds st = stored_ids(kCaptureFormatVersion, info.num_experts);
  std::vector<io::NamedTensor> tensors;
  std::vector<HostTensor> converted;  // keeps the stored copies alive until written
  converted.reserve(captures.requests.size());
  Json requests = Json::array();
  std::set<std::string> names;
  for (size_t i = 0; i < captures.requests.size(); ++i) {
    const RequestCapture& r = captures.requests[i];
    const std::vector<int64_t>& shape = r.ids.shape();
    if (!names.insert(r.request).second) {
      return InvalidArgument("write_capture_file: request '" + r.request + "' appears twice");
    }
    if (r.ids.dtype() != DType::kI16 || shape.size() != 3 || shape[1] != info.num_moe_layers() ||
        shape[2] != info.top_k()) {
      return InvalidArgument("write_capture_file: request '" + r.request + "': ids must be i16 [tokens, " +
                             std::to_string(info.num_moe_layers()) + ", " + std::to_string(info.top_k()) +
                             "], got " + dtype_name(r.ids.dtype()) + " " + r.ids.view().shape_string());
    }
    // A prompt longer than the captured tokens is allowed (a request stopped in its prefill).
    if (r.first_generated_token < -1 || (r.first_generated_token >= 0 && r.first_generated_token < r.first_token)) {
      return InvalidArgument("write_capture_file: request '" + r.request + "': first_generated_token " +
                             std::to_string(r.first_generated_token) + " must be -1 (not known) or >= first_token " +
                             std::to_string(r.first_token));
    }
    MOEKIT_RETURN_IF_ERROR(check_writable_ids(r, info.num_experts));
    converted.push_back(to_stored(r.ids, st));
    tensors.push_back({tensor_name(i), converted.back().view(), st.dtype});
    Json entry = {{"request", r.request},
                  {"tensor", tensor_name(i)},
                  {"first_token", r.first_token},
                  {"num_tokens", r.num_tokens()},
                  {"first_generated_token", r.first_generated_token < 0 ? Json(nullptr) : Json(r.first_generated_token)}};
    if (wdt) {
      if (r.router_weights.dtype() != *wdt || r.router_weights.shape() != shape) {
        return InvalidArgument("write_capture_file: request '" + r.request + "': router weights must be " +
                               dtype_name(*wdt) + " " + r.ids.view().shape_string() + ", got " +
                               dtype_name(r.router_weights.dtype()) + " " + r.router_weights.view().shape_string());
      }
      tensors.push_back({weights_tensor_name(i), r.router_weights.view(), ""});
      entry["router_weights_tensor"] = weights_tensor_name(i);
    } else if (!r.router_weights.shape().empty()) {  // a default HostTensor (none) has no shape
      return InvalidArgument("write_capture_file: request '" + r.request +
                             "' has router weights but the capture's router_weights_dtype is not set");
    }
    requests.push_back(std::move(entry));
  }
  std::map<std::string, std::string> meta = {
      {"format", kFormatName},
      {"format_version", std::to_string(kCaptureFormatVersion)},
      {"routing_spec_version", std::to_string(info.routing_spec_version)},
      {"routing", routing_json(info.routing).dump()},
      {"num_experts", std::to_string(info.num_experts)},
      {"top_k", std::to_string(info.top_k())},
      {"num_moe_layers", std::to_string(info.num_moe_layers())},
      {"model_layers", Json(info.model_layers).dump()},
      {"id_space", info.id_space},
      {"id_order", info.id_order},
      {"id_dtype", st.id_dtype},
      {"id_sentinel", std::to_string(st.sentinel)},
      {"layout", "[num_tokens, num_moe_layers, top_k]"},
      {"backend", info.backend},
      {"router_weights", wdt ? dtype_name(*wdt) : "none"},
      {"requests", requests.dump()},
  };
  for (const auto& [key, value] : captures.extra_metadata) {
    if (!meta.emplace(key, value).second) {
      return InvalidArgument("write_capture_file: extra metadata key \"" + key + "\" is one of the format's own keys");
    }
  }
  return io::write_safetensors(path, tensors, meta);
}

StatusOr<CaptureSet> read_capture_file(const std::string& path, const CaptureReadOptions& options) {
  MOEKIT_ASSIGN_OR_RETURN(io::SafetensorsFile file, io::SafetensorsFile::open(path));
  return read_capture(file, options);
}

StatusOr<CaptureSet> read_capture(const io::SafetensorsFile& file, const CaptureReadOptions& options) {
  const std::string& path = file.path();
  const auto& meta = file.metadata();
  MOEKIT_ASSIGN_OR_RETURN(std::string format, string_value(meta, "format", path));
  if (format != kFormatName) {
    return InvalidArgument(path + ": not a moekit capture file (format \"" + printable(format, 40) +
                           "\", expected \"" + kFormatName + "\")");
  }
  CaptureSet set;
  CaptureInfo& info = set.info;
  MOEKIT_ASSIGN_OR_RETURN(Json version, parse_value(meta, "format_version", path));
  const std::optional<int64_t> v = io::json_integer(version, 1, kCaptureFormatVersion);
  if (!v) {
    return Unsupported(path + ": capture format version " + printable(meta.at("format_version"), 40) +
                       " (this build reads 1 to " + std::to_string(kCaptureFormatVersion) + ")");
  }
  info.format_version = static_cast<int>(*v);
  MOEKIT_ASSIGN_OR_RETURN(const int64_t spec, int_value(meta, "routing_spec_version", path, 0, kMaxInt));
  info.routing_spec_version = static_cast<int>(spec);
  MOEKIT_ASSIGN_OR_RETURN(Json routing, parse_value(meta, "routing", path));
  MOEKIT_ASSIGN_OR_RETURN(info.routing, parse_routing(routing, path + ": capture metadata \"routing\""));
  MOEKIT_ASSIGN_OR_RETURN(info.num_experts, int_value(meta, "num_experts", path, 1, kMaxInt));
  MOEKIT_ASSIGN_OR_RETURN(const int64_t top_k, int_value(meta, "top_k", path, 1, kMaxInt));
  if (top_k != info.routing.top_k) {
    return DataLoss(path + ": top_k (" + std::to_string(top_k) + ") disagrees with the routing's top_k (" +
                    std::to_string(info.routing.top_k) + ")");
  }
  MOEKIT_ASSIGN_OR_RETURN(Json layers, parse_value(meta, "model_layers", path));
  if (!layers.is_array()) return DataLoss(path + ": model_layers must be a JSON array of integers");
  for (const Json& l : layers) {
    const std::optional<int64_t> n = io::json_integer(l, 0, kMaxInt);
    if (!n) return DataLoss(path + ": model_layers must be a JSON array of integers in [0, " + std::to_string(kMaxInt) + "]");
    info.model_layers.push_back(static_cast<int>(*n));
  }
  MOEKIT_ASSIGN_OR_RETURN(const int64_t num_layers, int_value(meta, "num_moe_layers", path, 1, kMaxInt));
  if (num_layers != info.num_moe_layers()) {
    return DataLoss(path + ": num_moe_layers (" + std::to_string(num_layers) + ") disagrees with model_layers (" +
                    std::to_string(info.num_moe_layers()) + " entries)");
  }
  MOEKIT_ASSIGN_OR_RETURN(info.id_space, string_value(meta, "id_space", path));
  MOEKIT_ASSIGN_OR_RETURN(info.id_order, string_value(meta, "id_order", path));
  if (info.id_order != "score_desc_index_asc") {
    return Unsupported(path + ": id order \"" + printable(info.id_order, 40) +
                       "\" (this build reads score_desc_index_asc)");
  }
  MOEKIT_RETURN_IF_ERROR(check_info(info, path));
  const StoredIds st = stored_ids(info.format_version, info.num_experts);
  if (info.format_version >= 2) {
    MOEKIT_ASSIGN_OR_RETURN(std::string id_dtype, string_value(meta, "id_dtype", path));
    if (id_dtype != st.id_dtype) {
      return DataLoss(path + ": id_dtype \"" + printable(id_dtype, 20) + "\" but E = " +
                      std::to_string(info.num_experts) + " stores ids as " + st.id_dtype);
    }
    MOEKIT_ASSIGN_OR_RETURN(const int64_t sentinel, int_value(meta, "id_sentinel", path, 0, 0xffff));
    if (sentinel != st.sentinel) {
      return DataLoss(path + ": id_sentinel " + std::to_string(sentinel) + ", expected " + std::to_string(st.sentinel) +
                      " for " + st.id_dtype + " ids");
    }
    MOEKIT_ASSIGN_OR_RETURN(info.backend, string_value(meta, "backend", path));
    MOEKIT_ASSIGN_OR_RETURN(std::string weights, string_value(meta, "router_weights", path));
    if (weights == "f32") {
      info.router_weights_dtype = DType::kF32;
    } else if (weights == "bf16") {
      info.router_weights_dtype = DType::kBF16;
    } else if (weights != "none") {
      return DataLoss(path + ": router_weights must be \"none\", \"f32\" or \"bf16\", got \"" + printable(weights, 20) + "\"");
    }
  }

  MOEKIT_ASSIGN_OR_RETURN(Json requests, parse_value(meta, "requests", path));
  if (!requests.is_array()) return DataLoss(path + ": \"requests\" must be a JSON array");
  std::set<std::string> names, tensors;
  for (size_t i = 0; i < requests.size(); ++i) {
    const std::string what = path + ": requests[" + std::to_string(i) + "]";
    RequestCapture r;
    MOEKIT_ASSIGN_OR_RETURN(r.request, json_field<std::string>(requests[i], "request", what));
    MOEKIT_ASSIGN_OR_RETURN(std::string tensor, json_field<std::string>(requests[i], "tensor", what));
    MOEKIT_ASSIGN_OR_RETURN(r.first_token, json_field<int64_t>(requests[i], "first_token", what));
    MOEKIT_ASSIGN_OR_RETURN(int64_t tokens, json_field<int64_t>(requests[i], "num_tokens", what));
    if (info.format_version >= 2) {
      if (!requests[i].contains("first_generated_token")) return DataLoss(what + ": missing field \"first_generated_token\"");
      if (!requests[i].at("first_generated_token").is_null()) {
        MOEKIT_ASSIGN_OR_RETURN(r.first_generated_token,
                                json_field<int64_t>(requests[i], "first_generated_token", what, r.first_token));
      }
    }
    if (!names.insert(r.request).second) {
      return DataLoss(what + ": request '" + printable(r.request, 60) + "' appears twice");
    }
    // One tensor per request: a tensor shared by many requests would be read (and held) many times.
    if (!tensors.insert(tensor).second) {
      return DataLoss(what + ": tensor \"" + printable(tensor, 60) + "\" belongs to an earlier request too");
    }
    const io::SafetensorsEntry* entry = file.find(tensor);
    if (entry == nullptr) return DataLoss(what + ": tensor \"" + printable(tensor, 60) + "\" is not in the file");
    const std::vector<int64_t> want = {tokens, info.num_moe_layers(), info.top_k()};
    if (entry->dtype_name != st.dtype || entry->shape != want) {
      return DataLoss(what + ": tensor \"" + printable(tensor, 60) + "\" must be " + st.id_dtype + " " +
                      Json(want).dump() + ", got " + entry->dtype_name + " " + Json(entry->shape).dump());
    }
    MOEKIT_ASSIGN_OR_RETURN(const uint8_t* bytes, file.bytes(tensor));
    r.ids = HostTensor(DType::kI16, want);
    int16_t* ids = r.ids.data<int16_t>();
    for (int64_t e = 0; e < r.ids.numel(); ++e) {
      int64_t stored = 0;
      if (st.bytes == 1) {
        stored = bytes[e];
      } else {
        uint16_t u;
        std::memcpy(&u, bytes + 2 * e, 2);  // little endian, maybe unaligned
        stored = std::string_view(st.dtype) == "I16" ? static_cast<int16_t>(u) : static_cast<int64_t>(u);
      }
      const bool sentinel = st.sentinel >= 0 && stored == st.sentinel;
      ids[e] = sentinel ? kUnwrittenExpertId : static_cast<int16_t>(stored);
      if (!sentinel && options.check_ids && (stored < 0 || stored >= info.num_experts)) {
        return DataLoss(what + ": id " + std::to_string(stored) + " outside [0, " + std::to_string(info.num_experts) +
                        ")" + (st.sentinel >= 0 ? " (and not the sentinel " + std::to_string(st.sentinel) + ")" : ""));
      }
      // Only with check_ids off: a u16 id above 32767 stays out of range (E <= 32767) in i16.
      if (!sentinel && stored > 0x7fff) ids[e] = 0x7fff;
    }
    if (info.router_weights_dtype) {
      MOEKIT_ASSIGN_OR_RETURN(std::string wname, json_field<std::string>(requests[i], "router_weights_tensor", what));
      const io::SafetensorsEntry* we = file.find(wname);
      if (we == nullptr || we->dtype != info.router_weights_dtype || we->shape != want || !tensors.insert(wname).second) {
        return DataLoss(what + ": router weights tensor \"" + printable(wname, 60) + "\" must be a " +
                        dtype_name(*info.router_weights_dtype) + " " + Json(want).dump() +
                        " tensor of this request only");
      }
      MOEKIT_ASSIGN_OR_RETURN(r.router_weights, file.read(wname));
    }
    set.requests.push_back(std::move(r));
  }
  for (const auto& [key, value] : meta) {
    if (!kFormatKeys.count(key)) set.extra_metadata.emplace(key, value);
  }
  return set;
}

}  // namespace moekit
