#include "titan/ops/gemv.h"

#include <algorithm>
#include <vector>

#include "titan/backend/backend.h"
#include "titan/core/error.h"

namespace titan {
namespace {

constexpr size_t kMinBlockBytes = size_t{64} << 10, kMaxBlockBytes = size_t{1} << 20;

void check_products(std::span<const GemvProduct> products) {
  TITAN_CHECK(products.size() <= kMaxGemvProducts, "gemv: ", products.size(),
              " products in one call; at most ", kMaxGemvProducts);
  for (const GemvProduct& p : products) {
    TITAN_CHECK(p.w.dtype == DType::f32 || p.w.dtype == DType::bf16, "gemv: weights of dtype ",
                dtype_name(p.w.dtype), "; expected F32 or BF16");
    TITAN_CHECK(p.w.cols == products[0].w.cols, "gemv: weights of ", p.w.cols, " and ",
                products[0].w.cols, " columns in one call (they share x)");
  }
}

// Rows [r0, r0 + rows) of one product; x_split is x in gemv_bf16's layout.
void gemv_rows(const VecKernels& v, const GemvProduct& p, const float* x, const float* x_split,
               int64_t r0, int64_t rows) {
  const int64_t cols = p.w.cols;
  if (p.w.dtype == DType::bf16) {
    v.gemv_bf16(p.y + r0, static_cast<const uint16_t*>(p.w.data) + r0 * cols, cols, x_split, rows,
                cols);
  } else {
    v.gemv_f32(p.y + r0, static_cast<const float*>(p.w.data) + r0 * cols, cols, x, rows, cols);
  }
}

}  // namespace

void gemv_forward(std::span<const GemvProduct> products, const float* x) {
  check_products(products);
  if (products.empty()) return;
  // Blocks of a quarter of each thread's share of the bytes, between 64 KiB and 1 MiB: a thread
  // streams each block as one run of addresses, and the hardware prefetcher ramps up again at
  // every block's start. With 2 threads on this VM, an lm_head in 64 KiB blocks streamed at
  // 46-47 GB/s where 1 MiB blocks reached 55-64 (the read bandwidth then measured 55-67), and
  // both ran at ~34 when the VM gave 35. Four blocks per thread still let a thread the OS
  // deschedules hand most of its share to the others.
  const int64_t cols = products[0].w.cols;
  size_t weight_bytes = 0, element_bytes = 0;
  for (const GemvProduct& p : products) {
    weight_bytes += static_cast<size_t>(p.w.rows * p.w.cols) * dtype_size(p.w.dtype);
    element_bytes = std::max(element_bytes, dtype_size(p.w.dtype));
  }
  const size_t block_bytes =
      std::clamp(weight_bytes / (4 * static_cast<size_t>(backend().threads())), kMinBlockBytes,
                 kMaxBlockBytes);
  const int64_t row_bytes = std::max<int64_t>(cols, 1) * static_cast<int64_t>(element_bytes);
  const int64_t block = std::max<int64_t>(1, static_cast<int64_t>(block_bytes) / row_bytes);
  // Product i owns blocks [first_block[i], first_block[i + 1]).
  int64_t first_block[kMaxGemvProducts + 1] = {0};
  for (size_t i = 0; i < products.size(); ++i) {
    first_block[i + 1] = first_block[i] + (products[i].w.rows + block - 1) / block;
  }
  const int64_t n_blocks = first_block[products.size()];
  const VecKernels& v = backend().vec();
  // x split once per call for the bf16 products, into a buffer that grows to the widest x seen:
  // a decode step makes ~140 calls and allocates nothing.
  thread_local std::vector<float> x_split;
  const bool any_bf16 = std::any_of(products.begin(), products.end(),
                                    [](const GemvProduct& p) { return p.w.dtype == DType::bf16; });
  if (any_bf16) {
    if (x_split.size() < static_cast<size_t>(cols)) x_split.resize(static_cast<size_t>(cols));
    gemv_bf16_split_x(x_split.data(), x, cols);
    for (int64_t c = 0; c < cols; ++c) x_split[c] = round_to_bf16(x_split[c]);
  }
  const float* xs = x_split.data();
#pragma omp parallel for schedule(dynamic)
  for (int64_t b = 0; b < n_blocks; ++b) {
    size_t i = 0;
    while (b >= first_block[i + 1]) ++i;
    const GemvProduct& p = products[i];
    const int64_t r0 = (b - first_block[i]) * block;
    gemv_rows(v, p, x, xs, r0, std::min(block, p.w.rows - r0));
  }
}

void gemv_forward_reference(std::span<const GemvProduct> products, const float* x) {
  check_products(products);
  for (const GemvProduct& p : products) {
    for (int64_t r = 0; r < p.w.rows; ++r) {
      double s = 0.0;
      for (int64_t c = 0; c < p.w.cols; ++c) {
        const int64_t i = r * p.w.cols + c;
        const bool bf16 = p.w.dtype == DType::bf16;
        const float w = bf16 ? bf16_to_f32(static_cast<const uint16_t*>(p.w.data)[i])
                             : static_cast<const float*>(p.w.data)[i];
        s += static_cast<double>(w) * (bf16 ? round_to_bf16(x[c]) : x[c]);
      }
      p.y[r] = static_cast<float>(s);
    }
  }
}

}  // namespace titan
