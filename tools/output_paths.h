// The output paths of a command, checked before it does any work: none empty,
// none a folder or in a folder that does not exist, no two naming the same
// file, and none naming one of the command's inputs (which the atomic write
// would replace). Errors name the flags.
#pragma once

#include <string>
#include <vector>

#include "moekit/status.h"

namespace moekit::tools {

struct PathFlag {
  std::string flag;  // "--out-ids"
  std::string path;  // as given
};

// Flags that were not given are left out of both lists; an empty path given
// for an input is refused too.
Status check_output_paths(const std::vector<PathFlag>& outputs, const std::vector<PathFlag>& inputs);

// Every file a --model load reads (config.json, the index, the shards), each
// an input of `flag`, so that no output of the command replaces one.
std::vector<PathFlag> model_folder_inputs(const std::string& model_dir, const std::string& flag = "--model");

// True when a and b name one file: the same inode when both exist, else the
// same absolute path after resolving symlinks and "..".
bool same_file(const std::string& a, const std::string& b);

}  // namespace moekit::tools
