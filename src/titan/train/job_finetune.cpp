#include "titan/train/job_finetune.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <string>
#include <vector>

#include "titan/core/error.h"
#include "titan/data/dataset.h"
#include "titan/data/dataset_read.h"
#include "titan/io/safetensors.h"

namespace titan {
namespace {

bool named(const JobConfig& c, std::string_view key) {
  return std::find(c.set_keys.begin(), c.set_keys.end(), key) != c.set_keys.end();
}

// The shortest decimal that reads back as `v` (2e-05, 0).
std::string shortest(double v) {
  char text[32];
  const auto [end, ec] = std::to_chars(text, text + sizeof text, v);
  return std::string(text, end);
}

// "chat" when the first record of the data's first file has "messages", else "documents". A file
// that cannot be read is reported now, as the loader would report it.
std::string data_kind(const std::string& dataset_path) {
  try {
    const std::string first = expand_data_paths({dataset_path}).front();
    const DocumentFile file = DocumentFile::open(first, DatasetOptions{});
    return file.size() > 0 && file.has_messages(0) ? "chat" : "documents";
  } catch (const Error& e) {
    fail("training.dataset_path: ", e.what());
  }
}

}  // namespace

int64_t finetune_warmup_steps(int64_t steps) {
  if (steps <= 0) return 0;
  // ceil(3 % of steps) in integers, exact for any count (the Trainer's math.ceil(steps * 0.03)
  // gives the same up to 100000 steps at least); hundreds apart so that no product overflows.
  const int64_t p = kFinetuneWarmupPercent;
  return std::max<int64_t>(1, steps / 100 * p + (steps % 100 * p + 99) / 100);
}

bool job_finetunes_folder(const JobConfig& c, std::string_view preset) {
  return preset == kDefaultPreset && named(c, "model.hf_assets_path") &&
         !c.model.hf_assets_path.empty() && !named(c, "model.flavor");
}

std::string apply_finetune_defaults(JobConfig& c) {
  const std::string& dir = c.model.hf_assets_path;
  namespace fs = std::filesystem;
  std::error_code ec;
  TITAN_CHECK(fs::is_directory(dir, ec), "model.hf_assets_path ", dir,
              ": no such folder (a Hugging Face model folder: config.json, model.safetensors, "
              "tokenizer.json)");
  TITAN_CHECK(fs::is_regular_file(fs::path(dir) / "config.json", ec), "model.hf_assets_path ", dir,
              " has no config.json, so it is not a Hugging Face model folder to fine-tune (to "
              "train a built-in model with only its tokenizer, name the model: "
              "--model.flavor=tiny)");
  const bool own_weights = !named(c, "checkpoint.initial_load_path");
  TITAN_CHECK(!own_weights || SafetensorsCheckpoint::in_folder(dir), "model.hf_assets_path ", dir,
              " has a config.json but no weights to fine-tune (no model.safetensors nor "
              "model.safetensors.index.json); to train its architecture from random weights, set "
              "model.flavor = \"hf\"");
  c.model.flavor = "hf";
  if (own_weights) {
    c.checkpoint.initial_load_path = dir;
    c.checkpoint.initial_load_in_hf = true;
  }
  std::vector<std::string> applied;  // "key = value", for the start-up line
  const auto unset = [&](std::string_view key) { return !named(c, key); };
  if (unset("optimizer.lr")) {
    c.optimizer.lr = kFinetuneLr;
    applied.push_back("optimizer.lr = " + shortest(kFinetuneLr));
  }
  if (unset("optimizer.weight_decay")) {
    c.optimizer.weight_decay = kFinetuneWeightDecay;
    applied.push_back("optimizer.weight_decay = " + shortest(kFinetuneWeightDecay));
  }
  if (unset("lr_scheduler.warmup_steps")) {
    c.lr_scheduler.warmup_steps = finetune_warmup_steps(c.training.steps);
    applied.push_back("lr_scheduler.warmup_steps = " + std::to_string(c.lr_scheduler.warmup_steps) +
                      " (" + std::to_string(kFinetuneWarmupPercent) + " % of " +
                      std::to_string(c.training.steps) + " steps, rounded up)");
  }
  // Without data the run trains on the built-in corpus (with the folder's tokenizer).
  if (unset("training.dataset") && !c.training.dataset_path.empty()) {
    c.training.dataset = data_kind(c.training.dataset_path);
    applied.push_back("training.dataset = \"" + c.training.dataset +
                      "\" (the data's first record has " +
                      (c.training.dataset == "chat" ? "\"messages\")" : "no \"messages\")"));
  }
  if (unset("checkpoint.last_save_in_hf")) {
    c.checkpoint.last_save_in_hf = true;
    applied.push_back("checkpoint.last_save_in_hf = true");
  }
  std::string line;
  for (const std::string& a : applied) line += (line.empty() ? "" : ", ") + a;
  return line.empty() ? "" : "fine-tune defaults for the keys not set: " + line;
}

}  // namespace titan
