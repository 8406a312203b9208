"""What the Python layer adds to a forward, in eager mode: the host time of
moekit.MoeLayer.__call__ (given `out`) minus the host time of the module's
C++ forward on the same tensors, and the same for the registered torch op.
Small shapes (the kernels are not what is measured; on the CPU the layer is
tiny, since its kernel runs on the host); on a CUDA device only the enqueue time
is timed, in batches small enough not to fill the launch queue.

    python python/benchmarks/overhead.py [--device cpu|cuda] [--tokens 1] [--repeats 30]
"""
import argparse
import statistics
import time

import torch

import moekit
from moekit import ops
from moekit._torch import stream_of


def host_us(fn, device, batch=32, repeats=30):
    """Median over `repeats` batches of the host time per call (µs)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        times.append((time.perf_counter() - t0) / batch * 1e6)
    sync()
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tokens", type=int, default=1)
    p.add_argument("--repeats", type=int, default=30)
    a = p.parse_args()
    device = torch.device(a.device)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    # On the CPU the kernel itself is host time: a tiny layer keeps it small next to the overhead.
    E, K, H, I = (64, 8, 1024, 512) if device.type == "cuda" else (16, 4, 64, 32)
    cfg = moekit.MoeConfig(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, routing="deepseek_v3",
                           num_groups=8 if E == 64 else 4, topk_groups=4 if E == 64 else 2, routed_scaling_factor=2.5, max_num_tokens=256)
    g = torch.Generator().manual_seed(0)
    layer = moekit.MoeLayer(cfg, (torch.randn((E, 2 * I, H), generator=g) * 0.02).bfloat16(),
                            (torch.randn((E, H, I), generator=g) * 0.02).bfloat16(),
                            score_bias=torch.zeros(E), device=device)
    h = torch.randn((a.tokens, H), generator=g).bfloat16().to(device)
    l = torch.randn((a.tokens, E), generator=g).to(device)
    out = torch.empty_like(h)
    raw = layer._layer

    def cxx():
        raw.forward(h, l, out, None, None, None, None, stream_of(device))

    def python_layer():
        layer(h, l, out=out)

    def torch_op():
        torch.ops.moekit.moe_forward(layer._handle, h, l, out, None, None, None, None)

    def dlpack():  # what the binding's tensor conversion asks torch for, per tensor
        h.__dlpack__()
        l.__dlpack__()
        out.__dlpack__()

    t_dl = host_us(dlpack, device, repeats=a.repeats)
    t_cxx = host_us(cxx, device, repeats=a.repeats)
    t_py = host_us(python_layer, device, repeats=a.repeats)
    t_op = host_us(torch_op, device, repeats=a.repeats)
    print(f"device {device}, backend {layer.backend}/{layer.kernel}, M={a.tokens}, H={H}, E={E}, k={K}")
    print(f"  C++ forward through the module : {t_cxx:8.2f} us/call (host)")
    print(f"  3 DLPack exports alone       : {t_dl:8.2f} us/call (host)")
    print(f"  moekit.MoeLayer.__call__        : {t_py:8.2f} us/call (host)  -> Python layer adds {t_py - t_cxx:6.2f} us")
    print(f"  torch.ops.moekit.moe_forward    : {t_op:8.2f} us/call (host)  -> the op adds {t_op - t_cxx:6.2f} us")


if __name__ == "__main__":
    main()
