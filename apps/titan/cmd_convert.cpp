// `titan convert SRC DST [--dtype D] [--shard-size S]`: re-exports a Hugging Face model folder
// in another dtype or shard size, tensor by tensor, or exports a titan step-N training checkpoint
// as a Hugging Face folder (fp32 unless --dtype says otherwise).
#include <cstdio>
#include <string>

#include "commands.h"
#include "titan/backend/cpu/threads.h"
#include "titan/io/byte_size.h"
#include "titan/models/hf_config.h"
#include "titan/models/hf_export.h"
#include "titan/train/checkpoint_export.h"

namespace titan::cli {

Action add_convert_command(CLI::App& app) {
  CLI::App* command = app.add_subcommand(
      "convert",
      "re-export a Hugging Face model folder with another dtype or shard size, or export a titan "
      "step-N checkpoint as one");
  static int threads;
  static std::string src, dst, dtype, shard_size = "5GB";
  static bool overwrite = false, allow_nonfinite = false;
  add_threads_option(*command, threads);
  command->add_option("src", src, "source model folder, or a titan step-N checkpoint")->required();
  command->add_option("dst", dst, "destination folder (new or empty; apart from SRC)")->required();
  command->add_option("--dtype", dtype,
                      "float32|bfloat16|float16 (or fp32|bf16|fp16); default: the source's");
  command->add_option("--shard-size", shard_size,
                      "largest shard, e.g. 5GB (default), 500MB, 2GiB or bytes");
  command->add_flag("--overwrite", overwrite,
                    "replace DST if it is a model folder titan wrote (its titan.json lists every "
                    "file in it)");
  command->add_flag("--allow-nonfinite-weights", allow_nonfinite,
                    "convert weights holding NaN or Inf (refused otherwise; for debugging)");
  return [] {
    set_thread_count(threads);
    HfConvertOptions options;
    if (!dtype.empty()) options.dtype = parse_export_dtype(dtype);
    options.max_shard_bytes = parse_byte_size(shard_size, "--shard-size");
    options.overwrite = overwrite;
    options.allow_nonfinite = allow_nonfinite;
    refuse_dcp_checkpoint(src, "titan convert");
    if (is_training_checkpoint(src)) {
      HfExportOptions out;
      out.dtype = options.dtype.value_or(DType::f32);  // the checkpoint's: fp32 master weights
      out.max_shard_bytes = options.max_shard_bytes;
      out.overwrite = overwrite;
      const CheckpointExport r = export_training_checkpoint(src, dst, out, allow_nonfinite);
      std::printf("%s: %s of titan checkpoint step %lld, %s weights\n", dst.c_str(),
                  r.args.architecture.c_str(), static_cast<long long>(r.state.step),
                  torch_dtype_name(out.dtype).c_str());
      return 0;
    }
    const HfConvertResult r = convert_hf_folder(src, dst, options);
    std::printf("%s: %s, %zu tensors, %.3f GB of %s weights\n", dst.c_str(),
                r.args.architecture.c_str(), r.tensors, static_cast<double>(r.data_bytes) / 1e9,
                torch_dtype_name(r.dtype).c_str());
    return 0;
  };
}

}  // namespace titan::cli
