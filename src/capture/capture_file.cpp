// The capture file: safetensors with a self-describing "__metadata__" map
// (docs/capture.md). Ids are stored u8 when E <= 256, else i16.
#include <cmath>
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
constexpr int64_t kMaxU8Experts = 256;
constexpr int64_t kMaxInt = std::numeric_limits<int>::max();  // counts stored as int in CaptureInfo

using Json = nlohmann::json;

// The "__metadata__" keys the format defines; any other key is extra metadata.
const std::set<std::string> kFormatKeys = {"format",       "format_version", "routing_spec_version", "routing",
                                           "num_experts",  "top_k",          "num_moe_layers",       "model_layers",
                                           "id_space",     "id_order",       "id_dtype",             "layout",
                                           "requests"};

std::string tensor_name(size_t i) { return "routed_experts." + std::to_string(i); }

DType stored_dtype(int64_t num_experts) { return num_experts <= kMaxU8Experts ? DType::kU8 : DType::kI16; }

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

}  // namespace

Status write_capture_file(const std::string& path, const CaptureSet& captures) {
  const CaptureInfo& info = captures.info;
  MOEKIT_RETURN_IF_ERROR(check_info(info, "write_capture_file(" + path + ")"));
  const DType dtype = stored_dtype(info.num_experts);
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
    const int16_t* ids = r.ids.data<int16_t>();
    for (int64_t e = 0; e < r.ids.numel(); ++e) {
      if (ids[e] < 0 || ids[e] >= info.num_experts) {
        return OutOfRange("write_capture_file: request '" + r.request + "' holds id " + std::to_string(ids[e]) +
                          " outside [0, " + std::to_string(info.num_experts) + ")");
      }
    }
    MOEKIT_ASSIGN_OR_RETURN(HostTensor stored, io::convert(r.ids.view(), dtype));
    converted.push_back(std::move(stored));
    tensors.push_back({tensor_name(i), converted.back().view()});
    requests.push_back({{"request", r.request},
                        {"tensor", tensor_name(i)},
                        {"first_token", r.first_token},
                        {"num_tokens", r.num_tokens()}});
  }
  std::map<std::string, std::string> meta = {
      {"format", kFormatName},
      {"format_version", std::to_string(info.format_version)},
      {"routing_spec_version", std::to_string(info.routing_spec_version)},
      {"routing", routing_json(info.routing).dump()},
      {"num_experts", std::to_string(info.num_experts)},
      {"top_k", std::to_string(info.top_k())},
      {"num_moe_layers", std::to_string(info.num_moe_layers())},
      {"model_layers", Json(info.model_layers).dump()},
      {"id_space", info.id_space},
      {"id_order", info.id_order},
      {"id_dtype", dtype_name(dtype)},
      {"layout", "[num_tokens, num_moe_layers, top_k]"},
      {"requests", requests.dump()},
  };
  for (const auto& [key, value] : captures.extra_metadata) {
    if (!meta.emplace(key, value).second) {
      return InvalidArgument("write_capture_file: extra metadata key \"" + key + "\" is one of the format's own keys");
    }
  }
  return io::write_safetensors(path, tensors, meta);
}

StatusOr<CaptureSet> read_capture_file(const std::string& path) {
  MOEKIT_ASSIGN_OR_RETURN(io::SafetensorsFile file, io::SafetensorsFile::open(path));
  return read_capture(file);
}

StatusOr<CaptureSet> read_capture(const io::SafetensorsFile& file) {
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
  if (io::json_integer(version, kCaptureFormatVersion, kCaptureFormatVersion) != kCaptureFormatVersion) {
    return Unsupported(path + ": capture format version " + printable(meta.at("format_version"), 40) +
                       " (this build reads " + std::to_string(kCaptureFormatVersion) + ")");
  }
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
    const std::optional<int64_t> v = io::json_integer(l, 0, kMaxInt);
    if (!v) return DataLoss(path + ": model_layers must be a JSON array of integers in [0, " + std::to_string(kMaxInt) + "]");
    info.model_layers.push_back(static_cast<int>(*v));
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
  const DType dtype = stored_dtype(info.num_experts);

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
    if (entry->dtype != dtype || entry->shape != want) {
      return DataLoss(what + ": tensor \"" + printable(tensor, 60) + "\" must be " + dtype_name(dtype) + " " +
                      Json(want).dump() + ", got " + entry->dtype_name + " " + Json(entry->shape).dump());
    }
    MOEKIT_ASSIGN_OR_RETURN(HostTensor stored, file.read(tensor));
    MOEKIT_ASSIGN_OR_RETURN(r.ids, io::convert(stored.view(), DType::kI16));
    const int16_t* ids = r.ids.data<int16_t>();
    for (int64_t e = 0; e < r.ids.numel(); ++e) {
      if (ids[e] < 0 || ids[e] >= info.num_experts) {
        return DataLoss(what + ": id " + std::to_string(ids[e]) + " outside [0, " +
                        std::to_string(info.num_experts) + ")");
      }
    }
    set.requests.push_back(std::move(r));
  }
  for (const auto& [key, value] : meta) {
    if (!kFormatKeys.count(key)) set.extra_metadata.emplace(key, value);
  }
  return set;
}

}  // namespace moekit
