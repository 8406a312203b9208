#include "output_paths.h"

#include <filesystem>
#include <system_error>

#include "moekit/checkpoint.h"

namespace moekit::tools {
namespace {

namespace fs = std::filesystem;

fs::path resolved(const std::string& p) {
  std::error_code ec;
  fs::path r = fs::weakly_canonical(fs::absolute(p, ec), ec);
  return ec ? fs::path(p).lexically_normal() : r;
}

}  // namespace

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (fs::exists(a, ec) && fs::exists(b, ec)) return fs::equivalent(a, b, ec) && !ec;
  return resolved(a) == resolved(b);
}

std::vector<PathFlag> model_folder_inputs(const std::string& model_dir, const std::string& flag) {
  std::vector<PathFlag> inputs;
  for (const std::string& f : model_folder_files(model_dir)) inputs.push_back({flag, f});
  return inputs;
}

Status check_output_paths(const std::vector<PathFlag>& outputs, const std::vector<PathFlag>& inputs) {
  for (const PathFlag& in : inputs) {
    if (in.path.empty()) return InvalidArgument(in.flag + ": the input path is empty");
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const PathFlag& o = outputs[i];
    if (o.path.empty()) return InvalidArgument(o.flag + ": the output path is empty");
    std::error_code ec;
    if (fs::is_directory(o.path, ec) || o.path.back() == '/') {
      return InvalidArgument(o.flag + ": '" + o.path + "' is a folder; give a file name");
    }
    const fs::path parent = fs::path(o.path).parent_path();
    if (!parent.empty() && !fs::is_directory(parent, ec)) {
      return NotFound(o.flag + ": folder '" + parent.string() + "' does not exist");
    }
    for (size_t j = 0; j < i; ++j) {
      if (same_file(o.path, outputs[j].path)) {
        return InvalidArgument(o.flag + " and " + outputs[j].flag + " name the same file '" + o.path +
                               "'; give each output its own path");
      }
    }
    for (const PathFlag& in : inputs) {
      if (same_file(o.path, in.path)) {
        const std::string also = in.path == o.path ? "" : ", the same file as '" + in.path + "'";
        return InvalidArgument(o.flag + " names the input of " + in.flag + " ('" + o.path + "'" + also +
                               "); write the output to another path");
      }
    }
  }
  return Status::Ok();
}

}  // namespace moekit::tools
