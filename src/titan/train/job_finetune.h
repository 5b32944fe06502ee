// A run given a Hugging Face model folder and no model of its own fine-tunes the folder:
//   titan train --model.hf_assets_path=DIR --training.dataset_path=FILE --training.steps=N
// starts from DIR's weights (flavor "hf": the dims of its config.json) and ends with a Hugging
// Face folder (job.dump_folder/hf), with fine-tuning's defaults rather than pre-training's for
// every key the TOML file and the command line leave unset (docs/TRAINING.md, "Fine-tune a
// Hugging Face folder in one command"). A model named -- model.flavor, or a preset other than the
// default one -- keeps the folder to its tokenizer (and, with flavor "hf", its config.json).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "titan/train/job_config.h"

namespace titan {

// Fine-tuning's defaults: 2e-5, the learning rate of TRL's full SFT example (`trl sft
// --learning_rate 2.0e-5`; Transformers' Trainer defaults to 5e-5), gentle on pre-trained weights
// where pre-training's 8e-4 would undo them; no weight decay (the Trainer's default: a short
// fine-tune should not pull every weight, norms included, towards zero); a warm-up of 3 % of the
// steps rounded up, as the Trainer rounds warmup_ratio = 0.03 (at least one step, so the first
// update of a fresh AdamW is not taken at the full rate). The decay stays titan's (and the
// Trainer's) default: linear to 0 after the warm-up.
inline constexpr double kFinetuneLr = 2e-5;
inline constexpr double kFinetuneWeightDecay = 0.0;
inline constexpr int64_t kFinetuneWarmupPercent = 3;
int64_t finetune_warmup_steps(int64_t steps);

// Whether `config`, built on the preset named `preset`, fine-tunes model.hf_assets_path: the folder
// named by the TOML file or the command line, model.flavor not named, and the default preset.
bool job_finetunes_folder(const JobConfig& config, std::string_view preset);

// For a config job_finetunes_folder accepts: checks the folder (one line each: not a folder, no
// config.json, no weights while checkpoint.initial_load_path is unset), sets model.flavor "hf",
// checkpoint.initial_load_path to the folder (in HF format) and, for each key not named,
// checkpoint.last_save_in_hf = true, the defaults above and training.dataset from the data's first
// record ("chat" when it has "messages", else "documents"). Returns the start-up line listing
// the defaults applied, or "" when every one was named.
std::string apply_finetune_defaults(JobConfig& config);

}  // namespace titan
