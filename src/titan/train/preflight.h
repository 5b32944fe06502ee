// What `titan train` checks before it allocates anything, so that a mistake costs a second, not
// the run: where the data and the tokenizer come from, that every input exists, that every output
// is writable and apart from every source, and that the initial weights fit the model.
#pragma once

#include <string>
#include <vector>

#include "titan/data/chat_template.h"
#include "titan/models/model_args.h"
#include "titan/train/job_config.h"

namespace titan {

struct DataSources {
  std::string tokenizer;  // folder with tokenizer.json
  std::vector<std::string> train, validation;
};

// dataset "default": the embedded corpus and the tokenizer titan trains on it (docs/DATA.md);
// otherwise dataset_path, with the tokenizer of model.hf_assets_path.
DataSources resolve_data_sources(const JobConfig& c);
// training.dataset = "chat": the chat template of the tokenizer's folder, or one line saying why
// there is none.
ChatTemplate load_chat_template(const std::string& dir);
// Every input path exists (a glob matches), so a typo stops the run now, not at the first
// validation pass.
void check_inputs(const DataSources& d);
// What the run will write -- checkpoints, the exported model folder: the folders writable, and the
// export apart from every source and replaceable (a model folder titan wrote: io/atomic_dir.h).
void check_outputs(const JobConfig& c, const DataSources& d);
// The initial weights checked against the model from their headers, before it is allocated.
void check_initial_weights(const JobConfig::Checkpoint& ck, const ModelArgs& args);

}  // namespace titan
