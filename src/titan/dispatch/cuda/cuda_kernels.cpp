// The CUDA library's kernels, registered with the registry beside the CPU's (built into titan_cuda
// with -DTITAN_CUDA=ON). The kernels themselves live in src/titan/ops/cuda/ (*.cu), each entry
// with DeviceKind::cuda, its dtypes and the same fp32 reference the CPU's are checked against;
// this file also sets the default kernel of each op kind on CUDA and adds the CUDA DeviceOps.
// None is written yet (issue 41): until then a CUDA run's model finds no default kernel and stops
// with one line saying so (KernelRegistry::default_kernel).
#include "titan/dispatch/registry.h"

namespace titan {

void register_cuda_kernels(KernelRegistry&) {}

}  // namespace titan
