#include "titan/models/hf_checkpoint.h"

#include "titan/nn/shard_runs.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <unordered_map>
#include <unordered_set>

#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/core/progress.h"
#include "titan/io/convert.h"
#include "titan/io/json_util.h"
#include "titan/models/causal_lm.h"
#include "titan/models/hf_config.h"
#include "titan/models/nonfinite_weights.h"
#include "titan/models/registry.h"
#include "titan/nn/host_params.h"
#include "titan/nn/shard_runs.h"

namespace titan {
namespace {

bool is_float(const SafetensorsEntry& e) {
  return e.dtype == DType::f32 || e.dtype == DType::bf16 || e.dtype == DType::f16;
}

// Value equality of two float tensors of equal element count, bit for bit once both are fp32
// (a bf16 lm_head equals an fp32 embedding only if the embedding is exactly representable).
bool same_values(const SafetensorsEntry& a, const SafetensorsEntry& b) {
  if (a.dtype == b.dtype) return std::memcmp(a.data, b.data, a.nbytes) == 0;
  constexpr size_t kChunk = 1 << 16;
  std::vector<float> x(kChunk), y(kChunk);
  const auto n = static_cast<size_t>(a.numel());
  const size_t a_size = dtype_size(*a.dtype), b_size = dtype_size(*b.dtype);
  for (size_t begin = 0; begin < n; begin += kChunk) {
    const size_t len = std::min(kChunk, n - begin);
    convert_to_f32(static_cast<const unsigned char*>(a.data) + begin * a_size, *a.dtype, len,
                   x.data());
    convert_to_f32(static_cast<const unsigned char*>(b.data) + begin * b_size, *b.dtype, len,
                   y.data());
    if (std::memcmp(x.data(), y.data(), len * sizeof(float)) != 0) return false;
  }
  return true;
}

void check_float(const SafetensorsEntry& e) {
  TITAN_CHECK(is_float(e), e.file, ": tensor ", json_quote(e.name), " has dtype ", e.dtype_name,
              "; model weights must be F32, BF16 or F16");
}

// A tied model's extra lm_head.weight: accepted only as a copy of the embedding.
void check_tied_lm_head(const SafetensorsEntry& lm_head, const SafetensorsEntry& embedding,
                        const std::string& config_source) {
  check_float(lm_head);
  TITAN_CHECK(lm_head.shape == embedding.shape, lm_head.file,
              ": tensor \"lm_head.weight\" has shape ", shape_str(lm_head.shape),
              ", but model.embed_tokens.weight (tied to it by ", config_source, ") has ",
              shape_str(embedding.shape));
  TITAN_CHECK(same_values(lm_head, embedding), lm_head.file,
              ": tensor \"lm_head.weight\" differs from model.embed_tokens.weight, but ",
              config_source, " says tie_word_embeddings = true (one matrix for both)");
}

}  // namespace

std::vector<HfCheckpointTensor> match_hf_checkpoint(const ModelArgs& args,
                                                    const SafetensorsCheckpoint& checkpoint,
                                                    const std::string& config_source) {
  std::vector<HfKey> keys = hf_keys(args);
  std::vector<HfCheckpointTensor> matched;
  matched.reserve(keys.size());
  std::vector<std::string> missing;
  for (HfKey& key : keys) {
    const SafetensorsEntry* e = checkpoint.find(key.key);
    if (e == nullptr) {
      missing.push_back(key.key);
    } else {
      TITAN_CHECK(e->shape == key.shape, e->file, ": tensor ", json_quote(e->name), " has shape ",
                  shape_str(e->shape), ", but ", config_source, " implies ", shape_str(key.shape));
      check_float(*e);
    }
    matched.push_back({std::move(key), e});
  }
  std::unordered_set<std::string_view> expected;  // views into `matched`, which no longer grows
  for (const HfCheckpointTensor& t : matched) expected.insert(t.key.key);

  for (const std::string& name : checkpoint.names()) {  // sorted: the same first fault every run
    if (expected.contains(name)) continue;
    const SafetensorsEntry& e = checkpoint.at(name);
    if (args.tie_word_embeddings && name == "lm_head.weight") {
      const SafetensorsEntry* embedding = checkpoint.find("model.embed_tokens.weight");
      if (embedding != nullptr) check_tied_lm_head(e, *embedding, config_source);
      continue;
    }
    fail(e.file, ": unexpected tensor ", json_quote(name), ": not a parameter of ",
         args.architecture, " as ", config_source, " describes it");
  }
  TITAN_CHECK(missing.empty(), checkpoint.path(), ": tensor ",
              json_quote(missing.empty() ? "" : missing[0]), " is missing",
              missing.size() > 1 ? " (and " + std::to_string(missing.size() - 1) + " more)" : "",
              "; ", config_source, " expects ", matched.size(), " tensors");
  return matched;
}

namespace {

// A checkpoint's elements converted into a device's memory: into a pinned host buffer
// (Backend::host_staging_memory) kPieceBytes at most at a time, then copied in.
class DeviceStaging {
 public:
  // Elements [first, first + count) of `entry` as `dtype` at dst (device memory).
  void write(const SafetensorsEntry& entry, size_t first, size_t count, DType dtype, void* dst) {
    const size_t element = dtype_size(dtype), piece = kPieceBytes / element;
    if (buffer_.bytes() == 0) {
      buffer_ = Buffer(backend().host_staging_memory(), kPieceBytes, MemCategory::other);
    }
    for (size_t done = 0; done < count; done += piece) {
      const size_t n = std::min(piece, count - done);
      read_range_as(entry, first + done, n, dtype, buffer_.data());
      backend().copy_from_host(static_cast<unsigned char*>(dst) + done * element, buffer_.data(),
                               n * element);
    }
  }

 private:
  static constexpr size_t kPieceBytes = size_t{64} << 20;
  Buffer buffer_;
};

// Where a parameter's elements go: the held runs of its row-major whole (nn/shard_runs.h), at
// `data` in `dtype` (fp32 into a parameter group, bf16 into a Bf16Destinations entry).
struct HeldElements {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::vector<ShardRun> runs;
};

// The tensors `matched` in `checkpoint` (of `path`) converted into `groups`, which hold the model
// of `specs` cut by each parameter's placement under `plan` and then `shard`: each HF tensor's
// elements that fall in the held runs, or, for a parameter named in `bf16`, all of them into its
// bf16 destination instead (the group's view is then not touched). Every destination is resolved
// and size-checked before the first write; non-finite values are refused unless allowed. Groups in
// a device's memory (nn/host_params.h's in_device_memory; their bf16 destinations then in it too:
// the model's copies) are written through the backend's pinned staging, a piece of a run at a
// time (DeviceStaging), never by the host's stores.
void copy_hf_weights(const SafetensorsCheckpoint& checkpoint,
                     const std::vector<HfCheckpointTensor>& tensors,
                     const std::vector<ParamGroupSpec>& specs, std::vector<ParamGroup>& groups,
                     Shard shard, const std::string& path, bool allow_nonfinite,
                     const Bf16Destinations& bf16, const ParallelizePlan& plan) {
  TITAN_CHECK(specs.size() == groups.size(), "model: ", groups.size(),
              " parameter groups for a model of ", specs.size());
  const bool on_device = in_device_memory(groups);
  TITAN_CHECK(shard.dim == 0,
              "model: loading Hugging Face weights into shards cut along dimension ", shard.dim,
              " is not supported (only FSDP's dimension 0)");
  std::unordered_map<std::string, std::pair<HeldElements, int64_t>> params;  // -> (held, numel)
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const ParamView& v : groups[g].views()) {
      const ParamSpec& whole = specs[g].param(v.spec.name);
      const ShardBox box =
          shard_box(whole.shape, {plan.placement_of(whole), plan.fsdp_cut_of(whole, shard)});
      TITAN_CHECK(v.numel == shape_numel(box.part), "model: parameter ", v.spec.name,
                  " is not shard ", shard.index, " of ", shard.count, " of ",
                  shape_str(whole.shape));
      TITAN_CHECK(!on_device || box.real_numel() == v.numel, "model: parameter ", v.spec.name,
                  " is padded past its real elements; a device's memory takes only whole ones");
      if (const auto it = bf16.find(v.spec.name); it != bf16.end()) {
        if (box.real_numel() != v.numel) std::fill(it->second, it->second + v.numel, uint16_t{0});
        params.emplace(v.spec.name, std::pair(HeldElements{it->second, DType::bf16, box.runs},
                                              shape_numel(whole.shape)));
        continue;
      }
      float* data = groups[g].params() + v.offset;
      if (box.real_numel() != v.numel) std::fill(data, data + v.numel, 0.0f);  // the padding
      params.emplace(v.spec.name,
                     std::pair(HeldElements{data, DType::f32, box.runs}, shape_numel(whole.shape)));
    }
  }
  TITAN_CHECK(std::all_of(bf16.begin(), bf16.end(),
                          [&](const auto& entry) { return params.count(entry.first) == 1; }),
              "model: a bf16 destination names no parameter of the model");
  std::vector<const HeldElements*> destinations;
  destinations.reserve(tensors.size());
  for (const HfCheckpointTensor& t : tensors) {
    const auto it = params.find(t.key.param);
    TITAN_CHECK(it != params.end() && t.key.offset + shape_numel(t.key.shape) <= it->second.second,
                "the model has no parameter ", t.key.param, " laid out for ", t.key.key);
    destinations.push_back(&it->second.first);
  }

  int64_t total_bytes = 0;
  for (const HfCheckpointTensor& t : tensors) total_bytes += static_cast<int64_t>(t.entry->nbytes);
  Progress progress("loading " + path, total_bytes, ProgressUnit::bytes);
  for (const SafetensorsFile& file : checkpoint.files()) file.prefetch();
  NonfiniteScan scan;
  DeviceStaging staging;
  for (size_t i = 0; i < tensors.size(); ++i) {
    // The tensor is elements [offset, offset + numel) of its parameter; its part in each run:
    const HfKey& key = tensors[i].key;
    const HeldElements& held = *destinations[i];
    const SafetensorsEntry& entry = *tensors[i].entry;
    for (const ShardRun& run : held.runs) {
      const int64_t lo = std::max(key.offset, run.whole_first);
      const int64_t hi = std::min(key.offset + entry.numel(), run.whole_first + run.count);
      if (lo >= hi) continue;
      const auto first = static_cast<size_t>(lo - key.offset), count = static_cast<size_t>(hi - lo);
      void* dst =
          static_cast<unsigned char*>(held.data) +
          static_cast<size_t>(run.part_first + lo - run.whole_first) * dtype_size(held.dtype);
      if (on_device) {
        staging.write(entry, first, count, held.dtype, dst);
      } else {
        read_range_as(entry, first, count, held.dtype, dst);
      }
      // The stored values: rounding into bf16 neither makes nor hides a NaN or Inf that matters.
      scan.add(entry.file, key.key,
               static_cast<const unsigned char*>(entry.data) + first * dtype_size(*entry.dtype),
               *entry.dtype, count);
    }
    progress.advance(static_cast<int64_t>(tensors[i].entry->nbytes));
  }
  scan.check(allow_nonfinite);
}

}  // namespace

void load_hf_weights(const ModelArgs& args, std::vector<ParamGroup>& groups,
                     const std::string& path, const std::string& config_source,
                     bool allow_nonfinite, Shard shard, const Bf16Destinations& bf16,
                     const ParallelizePlan& plan) {
  const SafetensorsCheckpoint checkpoint = SafetensorsCheckpoint::open(path);
  copy_hf_weights(checkpoint, match_hf_checkpoint(args, checkpoint, config_source),
                  model_param_specs(args), groups, shard, path, allow_nonfinite, bf16, plan);
}

void load_hf_weights(CausalLM& model, const std::string& dir, bool allow_nonfinite) {
  load_hf_weights(model.args(), model.param_groups(), dir, "the model's config", allow_nonfinite);
}

namespace {

// config.json, then the weights checked against it before make_model(args) allocates the model:
// a config that disagrees with them (100000 layers beside a 2-layer file) fails in milliseconds,
// not after allocating what it describes. Then `load(model, checkpoint, tensors)`.
template <typename MakeModel, typename Load>
std::unique_ptr<CausalLM> load_checked(const std::string& dir, const MakeModel& make_model_of,
                                       const Load& load) {
  const std::string config = (std::filesystem::path(dir) / "config.json").string();
  const ModelArgs args = read_hf_config(config);
  const SafetensorsCheckpoint checkpoint = SafetensorsCheckpoint::open(dir);
  const std::vector<HfCheckpointTensor> tensors = match_hf_checkpoint(args, checkpoint, config);
  std::unique_ptr<CausalLM> model = make_model_of(args);
  load(*model, checkpoint, tensors);
  return model;
}

}  // namespace

std::unique_ptr<CausalLM> load_hf_model(const std::string& dir,
                                        const std::vector<OverrideRule>& overrides,
                                        bool allow_nonfinite, DType compute_dtype) {
  return load_checked(
      dir, [&](const ModelArgs& args) { return make_model(args, overrides, compute_dtype); },
      [&](CausalLM& model, const SafetensorsCheckpoint& checkpoint,
          const std::vector<HfCheckpointTensor>& tensors) {
        copy_hf_weights(checkpoint, tensors, model_param_specs(model.args()), model.param_groups(),
                        Shard{}, dir, allow_nonfinite, {}, ParallelizePlan{});
      });
}

std::unique_ptr<CausalLM> load_hf_model_bf16_only(const std::string& dir, bool allow_nonfinite,
                                                  const Bf16DestinationsOf& destinations) {
  return load_checked(
      dir,
      [](const ModelArgs& args) { return make_model(args, {}, DType::bf16, Residency::released); },
      [&](CausalLM& model, const SafetensorsCheckpoint& checkpoint,
          const std::vector<HfCheckpointTensor>& tensors) {
        const Bf16Destinations bf16 = destinations(model, checkpoint);
        for (const std::vector<ComputeCopyTarget>& group : model.bf16_only_params()) {
          for (const ComputeCopyTarget& t : group) {
            TITAN_CHECK(bf16.count(t.param) == 1, "model: no bf16 destination for ", t.param,
                        ", which it reads only in bf16");
          }
        }
        for (ParamGroup& g : model.param_groups()) {
          g.acquire_params_where([&](const ParamView& v) { return bf16.count(v.spec.name) == 0; });
        }
        copy_hf_weights(checkpoint, tensors, model_param_specs(model.args()), model.param_groups(),
                        Shard{}, dir, allow_nonfinite, bf16, ParallelizePlan{});
      });
}

bool embedding_held_in_bf16(const CausalLM& model, const SafetensorsCheckpoint& checkpoint) {
  const Embedding& embed = model.modules().embed_tokens;
  return checkpoint.at(embed.name + ".weight").dtype == DType::bf16 &&
         embed.kernel->forward_bf16 != nullptr;
}

}  // namespace titan
