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

size_t gemv_weight_bytes(const GemvWeight& w) {
  return static_cast<size_t>(w.rows * w.cols) * dtype_size(w.dtype);
}

// Rows [r0, r0 + rows) of products[product]: one task of gemv_forward's parallel loop.
struct RowBlock {
  size_t product;
  int64_t r0, rows;
};

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
  // Blocks of at most a quarter of each thread's share of the bytes, between 64 KiB and 1 MiB: a
  // thread streams each block as one run of addresses, and the hardware prefetcher ramps up again
  // at every block's start. With 2 threads on this VM, an lm_head in 64 KiB blocks streamed at
  // 46-47 GB/s where 1 MiB blocks reached 55-64 (the read bandwidth then measured 55-67), and
  // both ran at ~34 when the VM gave 35. Four blocks per thread still let a thread the OS
  // deschedules hand most of its share to the others. Toward the end of the call the blocks
  // shrink with the bytes left (a quarter of each thread's share of them, down to 64 KiB), so the
  // team reaches the join a few microseconds apart rather than up to a big block apart: a thread
  // that waits longer than libgomp's short spin (threads.h) sleeps, and the next region starts
  // with a futex wake-up of it. A bf16 decode step joins ~140 regions.
  const int64_t cols = products[0].w.cols;
  size_t weight_bytes = 0;
  for (const GemvProduct& p : products) weight_bytes += gemv_weight_bytes(p.w);
  const size_t threads = static_cast<size_t>(backend().threads());
  const size_t max_block_bytes =
      std::clamp(weight_bytes / (4 * threads), kMinBlockBytes, kMaxBlockBytes);
  // Reused, as x_split below: a decode step allocates nothing here. The team reads the calling
  // thread's copies through plain pointers.
  thread_local std::vector<RowBlock> blocks;
  blocks.clear();
  size_t bytes_left = weight_bytes;
  for (size_t i = 0; i < products.size(); ++i) {
    const GemvWeight& w = products[i].w;
    const size_t row_bytes = static_cast<size_t>(std::max<int64_t>(cols, 1)) * dtype_size(w.dtype);
    for (int64_t r0 = 0; r0 < w.rows;) {
      const size_t bytes = std::clamp(bytes_left / (4 * threads), kMinBlockBytes, max_block_bytes);
      const int64_t rows =
          std::clamp<int64_t>(static_cast<int64_t>(bytes / row_bytes), 1, w.rows - r0);
      blocks.push_back({i, r0, rows});
      r0 += rows;
      bytes_left -= static_cast<size_t>(rows) * row_bytes;
    }
  }
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
  const RowBlock* plan = blocks.data();
  const int64_t n_blocks = static_cast<int64_t>(blocks.size());
#pragma omp parallel for schedule(dynamic)
  for (int64_t b = 0; b < n_blocks; ++b) {
    const RowBlock& block = plan[b];
    gemv_rows(v, products[block.product], x, xs, block.r0, block.rows);
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
