// The dense GEMM peaks NVIDIA's datasheets give for the GPUs titan knows, by the device's name and
// compute capability as cudaGetDeviceProperties reports them: the MFU denominator on CUDA. A GPU's
// rate cannot be derived from quantities titan measures (the tensor cores' per-SM rate depends on
// the architecture and the boost clock), so the datasheet's figure is taken as PyTorch's and
// torchtitan's MFU takes it; a device not in the table has no peak (the trainer then asks for
// metrics.peak_tflops) rather than a guess. Header-only: the CUDA backend and the host tests both
// read it.
#pragma once

#include <optional>
#include <string_view>

#include "titan/core/dtype.h"

namespace titan {

struct DatasheetPeak {
  std::string_view device;   // cudaDeviceProp::name
  int major = 0, minor = 0;  // compute capability
  // Dense (no structured sparsity) TFLOP/s: bf16 operands with fp32 accumulation on the tensor
  // cores; fp32 on the CUDA cores (titan's fp32 GEMMs by default); TF32 on the tensor cores (fp32
  // GEMMs under training.allow_tf32).
  double bf16_tflops = 0.0, fp32_tflops = 0.0, tf32_tflops = 0.0;
  std::string_view source;  // the datasheet the figures are from
};

// H100 SXM and H200 SXM: 1,979 TFLOP/s bf16 and 989 TF32 "with sparsity", half of each dense; 67
// TFLOP/s fp32 (NVIDIA H100 Tensor Core GPU datasheet; NVIDIA H200 Tensor Core GPU datasheet). A100
// SXM4 (40 and 80 GB): 312 bf16, 19.5 fp32, 156 TF32 (NVIDIA A100 Tensor Core GPU datasheet). PCIe
// and NVL boards run at other clocks and powers and are left out until someone reads their sheets.
inline constexpr DatasheetPeak kDatasheetPeaks[] = {
    {"NVIDIA H100 80GB HBM3", 9, 0, 989.5, 67.0, 494.5,
     "NVIDIA H100 Tensor Core GPU datasheet (SXM5)"},
    {"NVIDIA H200", 9, 0, 989.5, 67.0, 494.5, "NVIDIA H200 Tensor Core GPU datasheet (SXM)"},
    {"NVIDIA A100-SXM4-80GB", 8, 0, 312.0, 19.5, 156.0,
     "NVIDIA A100 Tensor Core GPU datasheet (SXM4)"},
    {"NVIDIA A100-SXM4-40GB", 8, 0, 312.0, 19.5, 156.0,
     "NVIDIA A100 Tensor Core GPU datasheet (SXM4)"},
};

// The row for a device, matched on its exact name and compute capability; nullopt for any other.
inline std::optional<DatasheetPeak> datasheet_peak(std::string_view device, int major, int minor) {
  for (const DatasheetPeak& p : kDatasheetPeaks) {
    if (p.device == device && p.major == major && p.minor == minor) return p;
  }
  return std::nullopt;
}

// GFLOP/s for GEMMs with `dtype` operands on that row, fp32 as TF32 where `tf32`
// (training.allow_tf32); nullopt for a dtype the table has no column for (fp16, int8).
inline std::optional<double> datasheet_peak_gflops(const DatasheetPeak& p, DType dtype,
                                                   bool tf32 = false) {
  if (dtype == DType::bf16) return p.bf16_tflops * 1e3;
  if (dtype == DType::f32) return (tf32 ? p.tf32_tflops : p.fp32_tflops) * 1e3;
  return std::nullopt;
}

}  // namespace titan
