"""The workloads of `ember bench --suite ops`, through PyTorch, printing the same
JSON rows (one per line). Usage:
    python3 bench/pytorch/device_ops.py [--device cpu|cuda:N|all] [--sizes 1024,4096] [--lesson] [--quick]
GPU rows are timed with CUDA events around repeated calls, after a warm-up."""
import argparse, json, time
import torch

p = argparse.ArgumentParser()
p.add_argument("--device", default="all")
p.add_argument("--sizes", default=None)
p.add_argument("--lesson", action="store_true")
p.add_argument("--quick", action="store_true")
args = p.parse_args()

budget = 0.03 if args.quick else 0.4


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def measure(dev, f):
    f(); sync(dev)
    t0 = time.perf_counter(); f(); sync(dev)
    one = max(time.perf_counter() - t0, 1e-9)
    inner = min(max(int(2e-3 / one + 0.999), 1), 100000)
    samples = min(max(int(budget / (one * inner)), 5), 200)
    times = []
    for _ in range(samples):
        if dev.type == "cuda":
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(inner):
                f()
            e.record(); e.synchronize()
            t = s.elapsed_time(e) * 1e-3
        else:
            t0 = time.perf_counter()
            for _ in range(inner):
                f()
            t = time.perf_counter() - t0
        times.append(t / inner)
    times.sort()
    q = lambda x: times[min(int(round(x * (len(times) - 1))), len(times) - 1)]
    return q(0.5), q(0.25), q(0.75), len(times)


rows = []


def row(dev, name, kind, amount, f):
    med, p25, p75, n = measure(dev, f)
    tp = amount / med / 1e9 if kind else None
    unit = {"flops": "GFLOP/s", "bytes": "GB/s", None: "s/call"}[kind]
    r = {"device": str(dev), "name": name, "median_s": med, "p25_s": p25, "p75_s": p75,
         "samples": n, "throughput": tp, "unit": unit, "framework": "pytorch " + torch.__version__}
    rows.append(r)
    print(json.dumps(r), flush=True)


def suite(dev):
    gpu = dev.type == "cuda"
    q = args.quick
    torch.manual_seed(0)
    rand = lambda *s: torch.randn(*s).to(dev)
    n = 256 if q else (4096 if gpu else 2048)
    x = rand(n, n)
    row(dev, f"copy {n}x{n} f32", "bytes", 8.0 * n * n, lambda: x.clone())
    a, b = rand(n, n), rand(n, n)
    row(dev, f"mul {n}x{n} f32", "bytes", 12.0 * n * n, lambda: a * b)
    row(dev, f"sum {n}x{n} f32", "bytes", 4.0 * n * n, lambda: a.sum())
    row(dev, f"softmax {n}x{n} f32", "bytes", 8.0 * n * n, lambda: a.softmax(-1))
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else (
        [128] if q else ([1024, 4096, 8192] if gpu else [256, 1024]))
    if args.lesson and 10000 not in sizes:
        sizes.append(10000)
    dtypes = [("f32", torch.float32, False)]
    if gpu:
        dtypes += [("tf32", torch.float32, True), ("bf16", torch.bfloat16, False), ("f16", torch.float16, False)]
    for s in sizes:
        a32, b32 = rand(s, s), rand(s, s)
        for label, dt, tf32 in dtypes:
            torch.backends.cuda.matmul.allow_tf32 = tf32
            a, b = a32.to(dt), b32.to(dt)
            row(dev, f"matmul {s} {label}", "flops", 2.0 * s ** 3, lambda: a @ b)
            torch.backends.cuda.matmul.allow_tf32 = False
    bn, c, o, hw = (8, 8, 16, 12) if q else (64, 32, 64, 26)
    xc, wc = rand(bn, c, hw, hw), rand(o, c, 3, 3)
    flops = 2.0 * bn * o * (hw - 2) ** 2 * c * 9
    row(dev, f"conv2d {bn}x{c}x{hw}x{hw} k3 o{o}", "flops", flops,
        lambda: torch.nn.functional.conv2d(xc, wc))
    t1, t2 = rand(4, 4), rand(4, 4)
    row(dev, "tiny add 4x4 (per op)", None, 0, lambda: t1 + t2)
    if gpu:
        nb = (1 << 20) if q else (16 << 20)
        host = torch.randn(nb)
        row(dev, f"host to device {nb >> 20}M f32", "bytes", 4.0 * nb, lambda: host.to(dev))
        on_dev = host.to(dev)
        row(dev, f"device to host {nb >> 20}M f32", "bytes", 4.0 * nb, lambda: on_dev.cpu())


devs = [torch.device("cpu")] + [torch.device(f"cuda:{i}") for i in range(torch.cuda.device_count())] \
    if args.device == "all" else [torch.device(args.device)]
with torch.no_grad():
    for d in devs:
        suite(d)
