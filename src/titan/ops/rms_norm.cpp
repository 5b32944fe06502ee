#include "titan/ops/rms_norm.h"

#include <omp.h>

#include <cmath>
#include <vector>

#include "titan/backend/backend.h"
#include "titan/ops/host_parallel.h"

namespace titan {

void rms_norm_forward(float* out, float* rstd, const float* x, const float* weight, int64_t rows,
                      int64_t dim, float eps) {
  const VecKernels& v = backend().vec();
#pragma omp parallel for schedule(static) if (rows * dim >= kMinParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    const float s = 1.0f / std::sqrt(v.sum_squares(xr, dim) / static_cast<float>(dim) + eps);
    rstd[r] = s;
    v.scale_mul(out + r * dim, xr, s, weight, dim);
  }
}

void rms_norm_backward(float* dx, float* dweight, const float* dout, const float* x,
                       const float* weight, const float* rstd, int64_t rows, int64_t dim) {
  const VecKernels& v = backend().vec();
  const int n_threads = omp_get_max_threads();
  // Per-thread partial dweight, summed in thread order afterwards: deterministic for a fixed
  // thread count.
  std::vector<float> partial(static_cast<size_t>(n_threads) * dim, 0.0f);
#pragma omp parallel
  {
    float* dw = partial.data() + static_cast<int64_t>(omp_get_thread_num()) * dim;
    std::vector<float> n_row(dim), dn_row(dim);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * dim;
      const float* gr = dout + r * dim;
      const float s = rstd[r];
      // n = x * rstd; dweight += dout * n; dn = dout * weight;
      // dx = rstd * (dn - n * mean(dn * n))
      for (int64_t i = 0; i < dim; ++i) {
        n_row[i] = xr[i] * s;
        dn_row[i] = gr[i] * weight[i];
      }
      if (dweight != nullptr) {
        for (int64_t i = 0; i < dim; ++i) dw[i] += gr[i] * n_row[i];
      }
      const float mean_dn_n = v.dot(dn_row.data(), n_row.data(), dim) / static_cast<float>(dim);
      float* dxr = dx + r * dim;
      for (int64_t i = 0; i < dim; ++i) dxr[i] = s * (dn_row[i] - n_row[i] * mean_dn_n);
    }
  }
  if (dweight == nullptr) return;  // a frozen weight (LoRA's base)
  for (int t = 0; t < n_threads; ++t) v.axpy(dweight, 1.0f, partial.data() + t * dim, dim);
}

void rms_norm_forward_reference(float* out, float* rstd, const float* x, const float* weight,
                                int64_t rows, int64_t dim, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
    const float s = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps));
    rstd[r] = s;
    for (int64_t i = 0; i < dim; ++i) out[r * dim + i] = weight[i] * (x[r * dim + i] * s);
  }
}

void rms_norm_backward_reference(float* dx, float* dweight, const float* dout, const float* x,
                                 const float* weight, const float* rstd, int64_t rows,
                                 int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    const float s = rstd[r];
    double mean_dn_n = 0.0;
    for (int64_t i = 0; i < dim; ++i) {
      const double n = static_cast<double>(x[r * dim + i]) * s;
      mean_dn_n += static_cast<double>(dout[r * dim + i]) * weight[i] * n;
      if (dweight != nullptr) dweight[i] += static_cast<float>(dout[r * dim + i] * n);
    }
    mean_dn_n /= static_cast<double>(dim);
    for (int64_t i = 0; i < dim; ++i) {
      const double n = static_cast<double>(x[r * dim + i]) * s;
      dx[r * dim + i] = static_cast<float>(
          s * (static_cast<double>(dout[r * dim + i]) * weight[i] - n * mean_dn_n));
    }
  }
}

}  // namespace titan
