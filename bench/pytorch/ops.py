"""The workloads of crates/ember/benches/ops.rs through PyTorch, on the CPU.

Prints one JSON line per row: {"name", "median_s", "iqr_s", "throughput", "unit"}.
Timing: warm-up, then repeated timed calls; median and inter-quartile range.
"""
import json
import statistics
import sys
import time

import torch


ONLY = sys.argv[1] if len(sys.argv) > 1 else None


def bench(name, fn, work, unit, min_time=2.0, min_iters=10, inner=1):
    if ONLY and ONLY not in name:
        return
    for _ in range(3):
        fn()
    samples = []
    start = time.perf_counter()
    while time.perf_counter() - start < min_time or len(samples) < min_iters:
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - t0) / inner)
    q = statistics.quantiles(samples, n=4)
    med = statistics.median(samples)
    row = {"name": name, "median_s": med, "iqr_s": q[2] - q[0],
           "throughput": (work / med) if work else None, "unit": unit}
    print(json.dumps(row), flush=True)


def main():
    torch.manual_seed(0)
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads()}), flush=True)
    for n in (256, 1024, 2048):
        a, b = torch.randn(n, n), torch.randn(n, n)
        bench(f"matmul_f32/{n}", lambda: torch.matmul(a, b), 2 * n ** 3 / 1e9, "GFLOP/s")
    for n in (1000, 4096):
        a, b = torch.rand(n, n) + 0.5, torch.rand(n, n) + 0.5
        bench(f"mul_f32/{n}", lambda: torch.mul(a, b), 3 * 4 * n * n / 1e9, "GB/s")
    a, b = torch.ones(4, 4), torch.ones(4, 4)
    bench("tiny_add_4x4", lambda: torch.add(a, b), None, "s/op", inner=1000)
    ag = a.clone().requires_grad_(True)
    bench("tiny_add_4x4_grad", lambda: torch.add(ag, b), None, "s/op", inner=1000)
    for rows, classes in ((1024, 50304), (4096, 1000)):
        x = torch.randn(rows, classes).requires_grad_(True)
        y = torch.randint(0, classes, (rows,))

        def step(x=x, y=y):
            x.grad = None
            torch.nn.functional.cross_entropy(x, y).backward()

        bench(f"cross_entropy_f32/{rows}x{classes}", step, 3 * 4 * rows * classes / 1e9, "GB/s",
              min_time=4.0)
    for n in (1000, 100000):
        seq = torch.sort(torch.rand(n)).values
        values = torch.rand(100000)
        bench(f"searchsorted_f32/{n}", lambda: torch.searchsorted(seq, values), 100000 / 1e6,
              "Melem/s")


if __name__ == "__main__":
    sys.exit(main())
