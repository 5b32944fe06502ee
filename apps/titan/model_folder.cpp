#include "model_folder.h"

#include <stdlib.h>

#include <cstdio>
#include <filesystem>

#include "titan/core/error.h"
#include "titan/train/checkpoint_export.h"

namespace titan::cli {
namespace fs = std::filesystem;

ModelFolder::ModelFolder(const std::string& path, const std::string& what) : path_(path) {
  refuse_dcp_checkpoint(path, what);
  if (!is_training_checkpoint(path)) return;
  std::string pattern = (fs::temp_directory_path() / "titan-checkpoint-XXXXXX").string();
  TITAN_CHECK(::mkdtemp(pattern.data()) != nullptr, what, " ", path,
              ": cannot create a temporary folder to export the checkpoint into under ",
              fs::temp_directory_path().string());
  temp_ = pattern;
  HfExportOptions options;
  options.dtype = DType::f32;
  try {
    checkpoint_ = export_training_checkpoint(path, temp_, options).state;
  } catch (...) {
    std::error_code ec;
    fs::remove_all(temp_, ec);  // the destructor does not run for a constructor that throws
    throw;
  }
  path_ = temp_;
  std::fprintf(stderr,
               "%s: titan training checkpoint of step %lld, read as the Hugging Face folder it "
               "exports to (fp32; titan convert %s DST keeps one)\n",
               path.c_str(), static_cast<long long>(checkpoint_->step), path.c_str());
}

ModelFolder::~ModelFolder() {
  if (temp_.empty()) return;
  std::error_code ec;
  fs::remove_all(temp_, ec);
}

}  // namespace titan::cli
