// Model-level Hugging Face folder export and load for Qwen3-0.6B dims (issue 3's bars: load into
// the fp32 parameters >= 1 GB/s from the page cache, export >= 0.5 GB/s). A CausalLM with HF
// init is exported as a complete bf16 folder (~1.19 GB of weights, config, generation config,
// staging folder renamed into place, every file synced), then loaded back into the same model:
// open, validation against the model's keys and shapes, bf16 -> fp32 into the parameter groups.
// GB/s are checkpoint-file bytes per second; a one-thread memcpy of those bytes is printed as the
// machine's reference. Each is run 3 times.
//   bench_hf_folder [folder]   (default: a temporary folder, removed at the end)
#include <cstdio>
#include <filesystem>
#include <vector>

#include "bench_main.h"
#include "titan/backend/cpu/threads.h"
#include "titan/core/dtype.h"
#include "titan/io/safetensors.h"
#include "titan/models/decoder_lm.h"
#include "titan/models/hf_checkpoint.h"
#include "titan/models/hf_export.h"
#include "titan/models/qwen3/flavors.h"

namespace {

using titan::bench::memcpy_seconds;
using titan::bench::now_seconds;

using namespace titan;
namespace fs = std::filesystem;

// One value per parameter (its middle element), rounded to bf16 as the export stores it.
std::vector<float> bf16_samples(const CausalLM& model) {
  std::vector<float> samples;
  for (const ParamGroup& g : model.param_groups()) {
    for (const ParamView& v : g.views()) {
      samples.push_back(bf16_to_f32(f32_to_bf16(g.params()[v.offset + v.numel / 2])));
    }
  }
  return samples;
}

// Overwrites the sampled elements, so the check after loading shows they were loaded. (Clearing
// every parameter instead would cost seconds between export and load, long enough for the VM's
// page reclaimer to drop the freshly written file from the page cache.)
void poison_samples(CausalLM& model) {
  for (ParamGroup& g : model.param_groups()) {
    for (const ParamView& v : g.views()) g.params()[v.offset + v.numel / 2] = -1e30f;
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    set_thread_count(default_thread_count());
    const bool own_dir = argc < 2;
    const fs::path root = own_dir ? fs::temp_directory_path() / "titan_bench_hf_folder" : argv[1];
    fs::remove_all(root);
    fs::create_directories(root);
    DecoderLM model(flavor("0.6B"));
    model.initialize(1);
    const std::vector<float> samples = bf16_samples(model);
    std::printf("hf folder bench: Qwen3-0.6B dims, %.3f G params, %d threads\n",
                static_cast<double>(model.parameter_count()) / 1e9, thread_count());

    HfExportOptions options;
    options.dtype = DType::bf16;
    fs::path folder;
    double gb = 0, best_export = 1e30;
    for (int run = 0; run < 3; ++run) {
      if (!folder.empty()) fs::remove_all(folder);  // outside the timer: not part of an export
      folder = root / ("run" + std::to_string(run));
      const double start = now_seconds();
      export_hf_folder(folder.string(), model, options);
      const double s = now_seconds() - start;
      best_export = std::min(best_export, s);
      gb = static_cast<double>(fs::file_size(folder / "model.safetensors")) / 1e9;
      std::printf("export model -> bf16 folder : %.3f GB in %.3f s = %.2f GB/s (run %d)\n", gb, s,
                  gb / s, run + 1);
    }

    double best_load = 1e30;
    for (int run = 0; run < 3; ++run) {
      poison_samples(model);
      const double start = now_seconds();
      load_hf_weights(model, folder.string());
      const double s = now_seconds() - start;
      best_load = std::min(best_load, s);
      std::printf("load bf16 folder -> model   : %.3f GB in %.3f s = %.2f GB/s (run %d)\n", gb, s,
                  gb / s, run + 1);
    }
    if (bf16_samples(model) != samples) {
      std::fprintf(stderr, "bench_hf_folder: the loaded parameters differ from the exported\n");
      return 1;
    }

    const double copy_s = memcpy_seconds(static_cast<size_t>(gb * 1e9));
    std::printf("reference memcpy            : %.2f GB/s\n", gb / copy_s);
    std::printf("best: load %.2f GB/s (%.2fx memcpy, bar 1), export %.2f GB/s (bar 0.5)\n",
                gb / best_load, copy_s / best_load, gb / best_export);
    if (own_dir) fs::remove_all(root);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_hf_folder: %s\n", e.what());
    return 1;
  }
}
