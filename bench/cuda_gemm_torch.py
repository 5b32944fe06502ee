"""PyTorch's matmul on the shapes bench_cuda_gemm times, on the same GPU in the same run: the
reference the CUDA backend's rates are read against (and a device-to-device copy's) (docs/GEMM.md). fp32 without TF32 (what
cublasSgemm computes by default), bf16 inputs with an fp32 result (`out_dtype` where this PyTorch
has it, else bf16) and with a bf16 result. Usage: python3 bench/cuda_gemm_torch.py"""
import time

import torch

SHAPES = [  # what, trans_a, trans_b, m, n, k -- row-major, as bench_cuda_gemm.cpp lists them
    ("square 8192^3", False, False, 8192, 8192, 8192),
    ("small mlp up, x W^T (2048 x 2048 x 512)", False, True, 2048, 2048, 512),
    ("small mlp down dX, dY W (2048 x 512 x 2048)", False, False, 2048, 512, 2048),
    ("small mlp up dW, dY^T X (2048 x 512 x 2048)", True, False, 2048, 512, 2048),
    ("small lm_head chunk, x E^T (512 x 151936 x 512)", False, True, 512, 151936, 512),
    ("0.6B prefill q, x W^T (512 x 2048 x 1024)", False, True, 512, 2048, 1024),
    ("0.6B prefill mlp up, x W^T (512 x 3072 x 1024)", False, True, 512, 3072, 1024),
]


def operand(rows, cols, transposed, dtype):
    # Stored as the row-major array bench_cuda_gemm passes, then viewed transposed if asked; values
    # uniform in [-1, 1) as there (constant operands run at a higher clock than a model's).
    shape = (cols, rows) if transposed else (rows, cols)
    stored = (torch.rand(shape, device="cuda") * 2 - 1).to(dtype)
    return stored.t() if transposed else stored


def rate(fn, work):
    """Work (FLOPs or bytes) per second, in units of 1e9, best of five timings."""
    reps = max(1, int(2e12 / work))
    fn()
    torch.cuda.synchronize()
    best = 1e30
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / reps)
    return work / best * 1e-9


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    src = torch.empty(1 << 30, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    moved = 2.0 * src.numel() * src.element_size()  # bytes read plus bytes written
    print(f"copy of {src.numel() * src.element_size() / 2**30:.1f} GiB: "
          f"{rate(lambda: dst.copy_(src), moved):.0f} GB/s (read + written)")
    del src, dst
    print(f"{'shape':50s} {'route':18s} {'GFLOP/s':>12s}")
    for what, ta, tb, m, n, k in SHAPES:
        flops = 2.0 * m * n * k
        for route in ("gemm_f32", "gemm_bf16", "gemm_bf16_to_bf16"):
            dtype = torch.float32 if route == "gemm_f32" else torch.bfloat16
            a = operand(m, k, ta, dtype)
            b = operand(k, n, tb, dtype)
            fn = lambda: torch.mm(a, b)
            if route == "gemm_bf16":
                try:
                    torch.mm(a, b, out_dtype=torch.float32)
                    fn = lambda: torch.mm(a, b, out_dtype=torch.float32)
                except TypeError:
                    route = "gemm_bf16 (bf16 C)"
            print(f"{what:50s} {route:18s} {rate(fn, flops):12.0f}")


if __name__ == "__main__":
    main()
