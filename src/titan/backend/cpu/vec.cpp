#include "titan/backend/cpu/vec.h"

namespace titan {
namespace vec_scalar {
extern const VecKernels kKernels;
}
namespace vec_avx2 {
extern const VecKernels kKernels;
}
namespace vec_avx512 {
extern const VecKernels kKernels;
}
namespace vec_avx512_bf16 {
extern const VecKernels kKernels;
}

const VecKernels& vec_kernels(Isa isa) {
  switch (isa) {
    case Isa::avx512_bf16:
      return vec_avx512_bf16::kKernels;
    case Isa::avx512:
      return vec_avx512::kKernels;
    case Isa::avx2:
      return vec_avx2::kKernels;
    case Isa::scalar:
      break;
  }
  return vec_scalar::kKernels;
}

const VecKernels& vec() {
  static const VecKernels& kernels = vec_kernels(active_isa());
  return kernels;
}

}  // namespace titan
