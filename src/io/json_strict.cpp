#include "io/json_strict.h"

#include <set>
#include <vector>

#include "core/printable.h"

namespace moekit::io {
namespace {

using Json = nlohmann::json;

// A SAX pass that only watches keys: the set of keys of each open object.
// NOTE: not nlohmann's parse callback, which rescans the parent object at
// the end of every child object (quadratic in a header of 10^5 tensors).
class UniqueKeys : public nlohmann::json_sax<Json> {
 public:
  std::string duplicate;  // the first key seen twice in one object

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    open_.emplace_back();
    return true;
  }
  bool key(string_t& k) override {
    if (!open_.back().insert(k).second) {
      duplicate = k;
      return false;  // stops the parse
    }
    return true;
  }
  bool end_object() override {
    open_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  std::vector<std::set<std::string>> open_;
};

}  // namespace

StatusOr<Json> parse_json_strict(std::string_view text, const std::string& what) {
  const size_t nul = text.find('\0');
  if (nul != std::string_view::npos) {
    return DataLoss(what + ": NUL byte at offset " + std::to_string(nul) + " (must be one JSON value)");
  }
  UniqueKeys keys;
  const bool ok = Json::sax_parse(text.begin(), text.end(), &keys, nlohmann::json::input_format_t::json,
                                  /*strict=*/true);
  if (!keys.duplicate.empty()) {
    return DataLoss(what + ": key '" + printable(keys.duplicate, 60) + "' appears twice");
  }
  if (!ok) return DataLoss(what + " is not valid JSON");
  Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return DataLoss(what + " is not valid JSON");
  return j;
}

std::optional<int64_t> json_integer(const Json& j, int64_t lo, int64_t hi) {
  if (j.is_number_unsigned()) {
    const uint64_t v = j.get<uint64_t>();
    if (hi < 0 || v > static_cast<uint64_t>(hi)) return std::nullopt;
    const auto s = static_cast<int64_t>(v);
    return s >= lo ? std::optional<int64_t>(s) : std::nullopt;
  }
  if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    if (v < lo || v > hi) return std::nullopt;
    return v;
  }
  return std::nullopt;
}

}  // namespace moekit::io
