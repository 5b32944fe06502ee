// Tensor comparison for reference tests: prints max absolute and relative error per tensor
// (relative to the reference's largest magnitude) and reports whether it is within tolerance.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace titan::testing {

struct ErrorStats {
  double max_abs = 0.0;
  double max_ref = 0.0;
  double rel() const { return max_abs / std::max(max_ref, 1e-30); }
};

inline ErrorStats compare_arrays(const float* got, const float* want, int64_t n) {
  ErrorStats s;
  for (int64_t i = 0; i < n; ++i) {
    const double diff =
        std::isfinite(got[i]) ? std::fabs(static_cast<double>(got[i]) - want[i]) : INFINITY;
    s.max_abs = std::max(s.max_abs, diff);
    s.max_ref = std::max(s.max_ref, std::fabs(static_cast<double>(want[i])));
  }
  return s;
}

// EXPECTs rel <= rel_tol and prints one line per tensor.
inline void expect_close(const std::string& what, const float* got, const float* want, int64_t n,
                         double rel_tol) {
  const ErrorStats s = compare_arrays(got, want, n);
  std::printf("  %-60s max_abs %.3e  rel %.3e  (tol %.0e)\n", what.c_str(), s.max_abs, s.rel(),
              rel_tol);
  EXPECT_LE(s.rel(), rel_tol) << what << ": max abs error " << s.max_abs << " against max |ref| "
                              << s.max_ref;
}

}  // namespace titan::testing
