"""PyTorch's scaled_dot_product_attention on the shape bench_cuda_attention times, on the same GPU
in the same run (scripts/cuda-device-check.sh): batch 8 x 2048 tokens, 16 query / 8 kv heads x 128,
bf16, causal, q, k, v laid out (B, S, heads, hd) as titan's projections write them and viewed as
(B, heads, S, hd). Forward, then backward from a fixed output gradient, with PyTorch's default
choice of kernel and with each SDPA backend forced where it runs this shape. TFLOP/s as
bench_cuda_attention counts them (the causal half of 2 forward and 5 backward GEMMs).
Usage: python3 bench/cuda_attention_torch.py"""
import contextlib
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

B, S, H, KV, D = 8, 2048, 16, 8, 128
GEMM = 2.0 * B * H * S * S * D / 2.0


def seconds_per_call(fn, reps):
    fn()
    torch.cuda.synchronize()
    best = 1e30
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def main():
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    torch.manual_seed(0)
    q = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(B, S, KV, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    v = torch.randn(B, S, KV, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    dout = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
    print(f"{'sdpa, B 8 x S 2048, 16/8 heads x 128, bf16, causal':58s} {'ms':>9s} {'TFLOP/s':>9s}")
    backends = [("default", None), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    for name, backend in backends:
        def forward(grad):
            qq, kk, vv = (t.detach().requires_grad_(grad) for t in (q, k, v))
            return qq, kk, vv, F.scaled_dot_product_attention(qq, kk, vv, is_causal=True,
                                                              enable_gqa=True)

        def both():
            qq, kk, vv, out = forward(True)
            torch.autograd.grad(out, (qq, kk, vv), dout)

        try:
            with sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext():
                with torch.no_grad():
                    fwd = seconds_per_call(lambda: forward(False), 20)
                total = seconds_per_call(both, 10)
        except RuntimeError as e:  # a backend that does not take this shape on this GPU
            print(f"  {name}: not run ({str(e).splitlines()[0][:80]})")
            continue
        bwd = total - fwd
        print(f"  {name + ' forward':56s} {fwd * 1e3:9.3f} {2 * GEMM / fwd * 1e-12:9.1f}")
        print(f"  {name + ' backward (forward + backward - forward)':56s} {bwd * 1e3:9.3f} "
              f"{5 * GEMM / bwd * 1e-12:9.1f}")
        print(f"  {name + ' forward + backward':56s} {total * 1e3:9.3f} "
              f"{7 * GEMM / total * 1e-12:9.1f}")


if __name__ == "__main__":
    main()
