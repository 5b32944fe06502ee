// safetensors export and load speed on a Qwen3-0.6B-dims checkpoint (issue 3's bars: load into
// fp32 >= 1 GB/s from the page cache, export >= 0.5 GB/s). fp32 parameters with random values are
// exported as one bf16 model.safetensors (~1.19 GB, fsync included), then loaded back into the
// same fp32 buffers while the file is in the page cache. GB/s are checkpoint-file bytes per
// second; a plain memcpy of those bytes is printed as the machine's reference.
//   bench_safetensors [folder]   (default: a temporary folder, removed at the end)
#include <cstdio>
#include <filesystem>
#include <vector>

#include "bench_main.h"
#include "titan/backend/cpu/threads.h"
#include "titan/core/dtype.h"
#include "titan/io/safetensors.h"
#include "titan/io/safetensors_writer.h"
#include "titan/models/qwen3/flavors.h"

namespace {

using titan::bench::memcpy_seconds;
using titan::bench::now_seconds;

using namespace titan;
// Spec §3's tensors for a dense model, fp32, filled with a cheap random stream in [-0.05, 0.05).
std::vector<SafetensorsTensor> model_tensors(const ModelArgs& a) {
  const int64_t h = a.hidden_size;
  const int64_t q = a.num_attention_heads * a.head_dim;
  const int64_t kv = a.num_key_value_heads * a.head_dim;
  std::vector<std::pair<std::string, Shape>> shapes = {
      {"model.embed_tokens.weight", {a.vocab_size, h}}};
  for (int64_t i = 0; i < a.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    shapes.push_back({p + "input_layernorm.weight", {h}});
    shapes.push_back({p + "self_attn.q_proj.weight", {q, h}});
    shapes.push_back({p + "self_attn.k_proj.weight", {kv, h}});
    shapes.push_back({p + "self_attn.v_proj.weight", {kv, h}});
    shapes.push_back({p + "self_attn.o_proj.weight", {h, q}});
    shapes.push_back({p + "self_attn.q_norm.weight", {a.head_dim}});
    shapes.push_back({p + "self_attn.k_norm.weight", {a.head_dim}});
    shapes.push_back({p + "post_attention_layernorm.weight", {h}});
    shapes.push_back({p + "mlp.gate_proj.weight", {a.intermediate_size, h}});
    shapes.push_back({p + "mlp.up_proj.weight", {a.intermediate_size, h}});
    shapes.push_back({p + "mlp.down_proj.weight", {h, a.intermediate_size}});
  }
  shapes.push_back({"model.norm.weight", {h}});
  std::vector<SafetensorsTensor> tensors;
  for (size_t t = 0; t < shapes.size(); ++t) {
    Tensor x = Tensor::empty(shapes[t].second, DType::f32, MemCategory::parameters);
    float* d = x.data<float>();
    const int64_t n = x.numel();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      uint64_t s =
          (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull ^ (t * 0xD1B54A32D192ED03ull);
      s ^= s >> 29;
      s *= 0xBF58476D1CE4E5B9ull;
      s ^= s >> 32;
      d[i] = (static_cast<float>(s >> 40) / 16777216.0f - 0.5f) * 0.1f;
    }
    tensors.push_back({shapes[t].first, std::move(x)});
  }
  return tensors;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    set_thread_count(default_thread_count());
    const bool own_dir = argc < 2;
    const std::string dir =
        own_dir ? (std::filesystem::temp_directory_path() / "titan_bench_safetensors").string()
                : argv[1];
    const ModelArgs& args = flavor("0.6B");
    std::vector<SafetensorsTensor> tensors = model_tensors(args);
    size_t n_params = 0;
    for (const auto& t : tensors) n_params += static_cast<size_t>(t.tensor.numel());
    // Remember bf16-rounded samples to check the loaded values against.
    std::vector<float> samples;
    for (const auto& t : tensors)
      samples.push_back(bf16_to_f32(f32_to_bf16(t.tensor.data<float>()[t.tensor.numel() / 2])));

    std::printf("safetensors bench: Qwen3-0.6B dims, %zu tensors, %.3f G params, %d threads\n",
                tensors.size(), static_cast<double>(n_params) / 1e9, thread_count());
    SafetensorsWriteOptions options;
    options.float_dtype = DType::bf16;
    const std::string file = (std::filesystem::path(dir) / "model.safetensors").string();
    double gb = 0;
    double best_export = 1e30;
    for (int run = 0; run < 3; ++run) {
      const double start = now_seconds();
      write_safetensors_checkpoint(dir, tensors, options);
      const double s = now_seconds() - start;
      best_export = std::min(best_export, s);
      gb = static_cast<double>(std::filesystem::file_size(file)) / 1e9;
      std::printf(
          "export fp32 -> bf16 file : %.3f GB in %.3f s = %.2f GB/s (run %d, fsync included)\n", gb,
          s, gb / s, run + 1);
    }
    double best = 1e30;
    for (int run = 0; run < 3; ++run) {
      const double start = now_seconds();
      const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(dir);
      for (const SafetensorsFile& f : ckpt.files()) f.prefetch();  // as a full load should
      for (auto& t : tensors) {
        read_f32(ckpt.at(t.name), t.tensor.data<float>(), static_cast<size_t>(t.tensor.numel()));
      }
      const double s = now_seconds() - start;
      best = std::min(best, s);
      std::printf("load bf16 file -> fp32   : %.3f GB in %.3f s = %.2f GB/s (run %d)\n", gb, s,
                  gb / s, run + 1);
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      const Tensor& t = tensors[i].tensor;
      if (t.data<float>()[t.numel() / 2] != samples[i]) {
        std::fprintf(stderr, "loaded value of %s differs\n", tensors[i].name.c_str());
        return 1;
      }
    }
    // Reference: copying the file's bytes once in memory (one thread).
    const double copy_s = memcpy_seconds(static_cast<size_t>(gb * 1e9));
    std::printf("reference memcpy         : %.2f GB/s\n", gb / copy_s);
    std::printf("best: load %.2f GB/s (%.2fx memcpy), export %.2f GB/s (%.2fx memcpy)\n", gb / best,
                copy_s / best, gb / best_export, copy_s / best_export);
    if (own_dir) std::filesystem::remove_all(dir);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_safetensors: %s\n", e.what());
    return 1;
  }
}
