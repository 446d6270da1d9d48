"""The workloads of `ember bench` (suites ops, train and models), through PyTorch,
printing the same JSON rows (one per line). Usage:
    python3 bench/pytorch/device_ops.py [--device cpu|cuda:N|all]
                                        [--suite ops|train|models|pieces|all]
                                        [--sizes 1024,4096] [--lesson] [--quick]
GPU rows are timed with CUDA events around repeated calls, after a warm-up.
`--suite all` is ops and train, as in ember; `models` (ResNet-50 and GPT-2 small
training steps) also reports each step's peak memory on a GPU and adds PyTorch's
reference rows there: ResNet-50 channels-last with cudnn.benchmark, and both
models under torch.compile (left out with --quick, or with BENCH_NO_COMPILE=1 in
the environment, which bench/compare_devices passes through; BENCH_ONLY_COMPILE=1
runs them alone). `pieces` times those models' layers one by one, forward and
backward (crates/ember-cli/src/bench/pieces.rs). `--filter TEXT` keeps the
models rows whose name contains TEXT; `--profile` prints torch.profiler's top
ops of a few eager steps of each on stderr."""
import argparse, csv, gc, json, os, sys, time
import torch
import torch.nn as nn
import torch.nn.functional as F

from train import mlp  # the MLP builder of the criterion counterpart, bench/pytorch/train.py

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

p = argparse.ArgumentParser()
p.add_argument("--device", default="all")
p.add_argument("--suite", default="all", choices=["ops", "train", "models", "pieces", "all"])
p.add_argument("--json", default=None)
p.add_argument("--sizes", default=None)
p.add_argument("--lesson", action="store_true")
p.add_argument("--quick", action="store_true")
p.add_argument("--filter", default=None, help="models suite: only rows whose name contains this")
p.add_argument("--profile", nargs="?", const="", default=None,
               help="models suite: torch.profiler's table of a few eager steps of each row, on stderr "
                    "(ember's flag takes a trace file; this one ignores it)")
p.add_argument("--profile-steps", type=int, default=3)
args = p.parse_args()

budget = 0.03 if args.quick else 0.4


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def measure(dev, f, budget):
    f(); sync(dev)
    t0 = time.perf_counter(); f(); sync(dev)
    one = max(time.perf_counter() - t0, 1e-9)
    inner = min(max(int(2e-3 / one + 0.999), 1), 100000)
    samples = min(max(int(budget / (one * inner)), 5), 200)
    times, host = [], []
    for _ in range(samples):
        if dev.type == "cuda":
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            h0 = time.perf_counter()
            for _ in range(inner):
                f()
            # the host's time to queue the calls (ember's `host` column)
            host.append((time.perf_counter() - h0) / inner)
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
    host.sort()
    return q(0.5), q(0.25), q(0.75), len(times), host[len(host) // 2] if host else None


rows = []


def row(dev, name, kind, amount, f, peak=False):
    """Times f into a row; with peak, on a GPU also the memory allocated at the peak
    of one more call (max_memory_allocated after reset_peak_memory_stats)."""
    # whole training steps take long and vary more: more samples each (as ember)
    med, p25, p75, n, host = measure(dev, f, budget * 5 if kind == "samples" else budget)
    tp = amount / med / 1e9 if kind else None
    if kind == "samples":
        tp = amount / med
    unit = {"flops": "GFLOP/s", "bytes": "GB/s", "samples": "samples/s", None: "s/call"}[kind]
    r = {"device": str(dev), "name": name, "median_s": med, "p25_s": p25, "p75_s": p75,
         "host_s": host, "samples": n, "throughput": tp, "unit": unit, "framework": "pytorch " + torch.__version__}
    if peak:
        r["peak_bytes"] = None
        if dev.type == "cuda":
            sync(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            f()
            sync(dev)
            r["peak_bytes"] = torch.cuda.max_memory_allocated(dev)
    rows.append(r)
    print(json.dumps(r), flush=True)


def note_row(dev, name, note):
    """A row that could not be measured, with the reason."""
    r = {"device": str(dev), "name": name, "median_s": None, "note": note,
         "framework": "pytorch " + torch.__version__}
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
    bias = rand(n)
    row(dev, f"add bias {n}x{n} + {n} f32", "bytes", 8.0 * n * n, lambda: a + bias)
    bt = b.t()
    row(dev, f"add transposed {n}x{n} f32", "bytes", 12.0 * n * n, lambda: a + bt)
    row(dev, f"sum {n}x{n} f32", "bytes", 4.0 * n * n, lambda: a.sum())
    row(dev, f"sum dim 0 of {n}x{n} f32", "bytes", 4.0 * n * n, lambda: a.sum(0))
    row(dev, f"sum dim 1 of {n}x{n} f32", "bytes", 4.0 * n * n, lambda: a.sum(1))
    row(dev, f"softmax {n}x{n} f32", "bytes", 8.0 * n * n, lambda: a.softmax(-1))
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else (
        [128] if q else ([1024, 4096, 8192] if gpu else [256, 1024]))
    if args.lesson and 10000 not in sizes:
        sizes.append(10000)
    dtypes = [("f32", torch.float32, False)]
    if gpu:
        dtypes += [("tf32", torch.float32, True), ("bf16", torch.bfloat16, False), ("f16", torch.float16, False)]
    else:
        dtypes += [("bf16", torch.bfloat16, False)]
    for s in sizes:
        a32, b32 = rand(s, s), rand(s, s)
        for label, dt, tf32 in dtypes:
            torch.backends.cuda.matmul.allow_tf32 = tf32
            a, b = a32.to(dt), b32.to(dt)
            row(dev, f"matmul {s} {label}", "flops", 2.0 * s ** 3, lambda: a @ b)
            torch.backends.cuda.matmul.allow_tf32 = False
    rows_, fin, fout = (64, 32, 64) if q else (4096, 256, 1024)
    x32, w32, b32 = rand(rows_, fin), rand(fout, fin), rand(fout)
    for label, dt, tf32 in dtypes:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        x, w, b = x32.to(dt), w32.to(dt), b32.to(dt)
        row(dev, f"linear {rows_}x{fin} -> {fout} {label}", "flops", 2.0 * rows_ * fin * fout,
            lambda: torch.nn.functional.linear(x, w, b))
        torch.backends.cuda.matmul.allow_tf32 = False
    bn, c, o, hw = (8, 8, 16, 12) if q else (64, 32, 64, 26)
    xc, wc = rand(bn, c, hw, hw), rand(o, c, 3, 3)
    flops = 2.0 * bn * o * (hw - 2) ** 2 * c * 9
    row(dev, f"conv2d {bn}x{c}x{hw}x{hw} k3 o{o}", "flops", flops,
        lambda: torch.nn.functional.conv2d(xc, wc))
    bn, c, o, hw = (8, 4, 8, 8) if q else (64, 16, 32, 8)
    xs, ws = rand(bn, c, hw, hw).requires_grad_(), rand(o, c, 3, 3).requires_grad_()

    def conv_step():
        with torch.enable_grad():  # the ops suite runs under no_grad
            torch.nn.functional.conv2d(xs, ws, padding=1).sum().backward()
        xs.grad = ws.grad = None

    row(dev, f"conv2d fwd+bwd {bn}x{c}x{hw}x{hw} k3 p1 o{o}", "flops", 3.0 * 2.0 * bn * o * hw * hw * c * 9,
        conv_step)
    # a 3-D convolution's forward and both gradients (ember's row of the same name)
    bn, c, o, d, hw = (1, 2, 4, 4, 8) if q else (8, 64, 64, 16, 56) if gpu else (2, 16, 16, 8, 32)
    x3, w3 = rand(bn, c, d, hw, hw).requires_grad_(), rand(o, c, 3, 3, 3).requires_grad_()

    def conv3d_step():
        with torch.enable_grad():
            torch.nn.functional.conv3d(x3, w3, padding=1).sum().backward()
        x3.grad = w3.grad = None

    row(dev, f"conv3d fwd+bwd {bn}x{c}x{d}x{hw}x{hw} k3 p1 o{o}", "flops",
        3.0 * 2.0 * bn * o * d * hw * hw * c * 27, conv3d_step)
    del x3, w3
    # causal attention forward and backward (ember's rows of the same names)
    attention_rows = [((8, 12, 1024, 64), (torch.bfloat16, "bf16")), ((8, 12, 1024, 64), (torch.float32, "f32"))] \
        if gpu and not q else [((1, 2, 128, 64), (torch.float32, "f32"))]
    for (ab, ah, al, ad), (adt, atag) in attention_rows:
        qkv = [rand(ab, ah, al, ad).to(adt).requires_grad_() for _ in range(3)]

        def attention_step(qkv=qkv):
            with torch.enable_grad():
                F.scaled_dot_product_attention(*qkv, is_causal=True).sum().backward()
            for t in qkv:
                t.grad = None

        row(dev, f"attention fwd+bwd causal {ab}x{ah}x{al}x{ad} {atag}", "flops",
            3.5 * 4.0 * ab * ah * al * al * ad / 2, attention_step)
    # layer norm with its weight and bias, forward and the three gradients
    ln_rows, ln_cols = (64, 32) if q else (8192, 768) if gpu else (2048, 256)
    lx = rand(ln_rows, ln_cols).requires_grad_()
    lw, lb = rand(ln_cols).requires_grad_(), rand(ln_cols).requires_grad_()

    def layer_norm_step():
        with torch.enable_grad():
            F.layer_norm(lx, [ln_cols], lw, lb, 1e-5).sum().backward()
        lx.grad = lw.grad = lb.grad = None

    row(dev, f"layer norm fwd+bwd {ln_rows}x{ln_cols} f32", "bytes", 7.0 * 4.0 * ln_rows * ln_cols,
        layer_norm_step)
    t1, t2 = rand(4, 4), rand(4, 4)
    row(dev, "tiny add 4x4 (per op)", None, 0, lambda: t1 + t2)
    if gpu:
        # PyTorch's default copies use ordinary (pageable) host memory, so the
        # default rows and the "(pageable)" rows measure the same thing here;
        # "(pinned)" copies from and to page-locked tensors
        nb = (1 << 20) if q else (16 << 20)
        mb = nb >> 18
        host = torch.randn(nb)
        on_dev = host.to(dev)
        for how in ["", " (pageable)"]:
            row(dev, f"host to device {mb} MiB{how}", "bytes", 4.0 * nb, lambda: host.to(dev))
            row(dev, f"device to host {mb} MiB{how}", "bytes", 4.0 * nb, lambda: on_dev.cpu())
        pinned = host.pin_memory()
        back = torch.empty(nb, pin_memory=True)
        row(dev, f"host to device {mb} MiB (pinned)", "bytes", 4.0 * nb,
            lambda: pinned.to(dev, non_blocking=True))
        row(dev, f"device to host {mb} MiB (pinned)", "bytes", 4.0 * nb,
            lambda: back.copy_(on_dev, non_blocking=True))


def step(model, opt, x, y, amp=None):
    with torch.autocast(x.device.type, dtype=amp or torch.bfloat16, enabled=amp is not None):
        loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def read_csv(name):
    with open(os.path.join(ROOT, "data", name)) as f:
        return list(csv.reader(f))[1:]


def train_suite(dev):
    """The models of crates/ember-cli/src/bench/train.rs; the loss stays on the device."""
    gpu = dev.type == "cuda"
    q = args.quick
    rows_ = read_csv("iris.csv")
    X = torch.tensor([[float(v) for v in r[:4]] for r in rows_])
    Y = torch.tensor([int(r[4]) for r in rows_])
    perm = torch.randperm(150, generator=torch.Generator().manual_seed(32))[:120]
    x, y = X[perm].to(dev), Y[perm].to(dev)
    epochs = 10 if q else 100

    def iris():
        torch.manual_seed(32)
        model = mlp([4, 8, 9, 3]).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        for _ in range(epochs):
            step(model, opt, x, y)

    row(dev, f"train iris mlp, {epochs} epochs", "samples", 120 * epochs, iris)

    b = 32 if q else 256
    torch.manual_seed(0)
    model = mlp([784, 1024, 1024, 10]).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    xb, yb = torch.randn(b, 784).to(dev), torch.randint(0, 10, (b,)).to(dev)
    row(dev, f"train mlp 784-1024-1024-10 b{b}", "samples", b, lambda: step(model, opt, xb, yb))
    row(dev, f"train mlp 784-1024-1024-10 b{b}, autocast bf16", "samples", b,
        lambda: step(model, opt, xb, yb, torch.bfloat16))

    b = 8 if q else 64
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(9216, 128), nn.ReLU(), nn.Linear(128, 10)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    xb, yb = torch.randn(b, 1, 28, 28).to(dev), torch.randint(0, 10, (b,)).to(dev)
    row(dev, f"train cnn mnist-sized b{b}", "samples", b, lambda: step(model, opt, xb, yb))
    row(dev, f"train cnn mnist-sized b{b}, autocast bf16", "samples", b,
        lambda: step(model, opt, xb, yb, torch.bfloat16))

    rows_ = read_csv("digits.csv")
    X = torch.tensor([[float(v) for v in r[:64]] for r in rows_]).div(16).reshape(-1, 1, 8, 8)
    Y = torch.tensor([int(r[64]) for r in rows_])
    perm = torch.randperm(len(Y), generator=torch.Generator().manual_seed(32))
    xt, yt = X[perm[:1437]], Y[perm[:1437]]
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xt, yt), batch_size=64, shuffle=True,
                                         generator=torch.Generator().manual_seed(32), pin_memory=gpu)
    torch.manual_seed(32)
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Linear(512, 64), nn.ReLU(), nn.Linear(64, 10)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def epoch():
        for xb, yb in loader:
            step(model, opt, xb.to(dev, non_blocking=True), yb.to(dev, non_blocking=True))

    row(dev, f"train digits cnn epoch ({len(yt)} imgs, b64)", "samples", len(yt), epoch)

    # sequence models: a transformer encoder layer's forward and backward, and a
    # step of `ember train text`'s character GPT (AdamW, clipping)
    b, t, w = (4, 32, 64) if q else (32, 128, 256)
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(w, 8, 4 * w, dropout=0.0, batch_first=True).to(dev)
    xs = torch.randn(b, t, w).to(dev)

    def encoder():
        layer.zero_grad()
        layer(xs).square().mean().backward()

    row(dev, f"transformer encoder layer fwd+bwd b{b} l{t} w{w}", "samples", b, encoder)

    b, t, w = (4, 32, 32) if q else (32, 128, 128)
    v = 73
    torch.manual_seed(0)

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok_emb, self.pos_emb = nn.Embedding(v, w), nn.Embedding(t, w)
            layer = nn.TransformerEncoderLayer(w, 4, 4 * w, dropout=0.0, activation="gelu", batch_first=True,
                                               norm_first=True)
            self.blocks = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
            self.ln_f, self.head = nn.LayerNorm(w), nn.Linear(w, v)
            self.register_buffer("mask", torch.ones(t, t, dtype=torch.bool).triu(1))

        def forward(self, idx):
            x = self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[1], device=idx.device))
            # is_causal with the mask: the hint spares the host read that checks the mask
            # (which a CUDA graph capture refuses), and lets attention use its causal kernels
            return self.head(self.ln_f(self.blocks(x, mask=self.mask, is_causal=True)))

    gpt = Gpt().to(dev)
    opt = torch.optim.AdamW(gpt.parameters(), lr=3e-3)
    xi, yi = torch.randint(0, v, (b, t)).to(dev), torch.randint(0, v, (b, t)).to(dev)

    def gpt_step():
        loss = F.cross_entropy(gpt(xi).reshape(-1, v), yi.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(gpt.parameters(), 1.0)
        opt.step()

    row(dev, f"train char-gpt 4x{w} ctx{t} b{b}", "samples", b, gpt_step)

    if dev.type != "cuda":
        return
    # on a GPU, the Iris steps and the GPT step replayed from CUDA graphs (the
    # whole-network capture of PyTorch's CUDA graph notes; Adam capturable)

    def graphed(opt, body):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                body()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            body()
        return g

    torch.manual_seed(32)
    model = mlp([4, 8, 9, 3]).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, capturable=True)
    g_iris = graphed(opt, lambda: (F.cross_entropy(model(x), y).backward(), opt.step()))
    row(dev, f"train iris mlp, {epochs} epochs, cuda graph", "samples", 120 * epochs,
        lambda: [g_iris.replay() for _ in range(epochs)])

    gpt_opt = torch.optim.AdamW(gpt.parameters(), lr=3e-3, capturable=True)

    def gpt_body():
        F.cross_entropy(gpt(xi).reshape(-1, v), yi.reshape(-1)).backward()
        torch.nn.utils.clip_grad_norm_(gpt.parameters(), 1.0)
        gpt_opt.step()

    g_gpt = graphed(gpt_opt, gpt_body)
    row(dev, f"train char-gpt 4x{w} ctx{t} b{b}, cuda graph", "samples", b, g_gpt.replay)


class Gpt(nn.Module):
    """ember::models::gpt2_small's layout (CharGpt::new_tied): token and learned
    position embeddings, nn.TransformerEncoderLayer(norm_first=True) blocks with a
    causal mask, a final LayerNorm, and the head tied to the token embedding.
    Weights drawn as ember's: normal(0, 0.02), biases zero, norms as built."""

    def __init__(self, vocab, context, layers, heads, width):
        super().__init__()
        self.vocab = vocab
        self.tok_emb, self.pos_emb = nn.Embedding(vocab, width), nn.Embedding(context, width)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok_emb.weight
        self.register_buffer("mask", torch.ones(context, context, dtype=torch.bool).triu(1), persistent=False)
        for name, p in self.named_parameters():
            if "norm" in name or name.startswith("ln_f"):
                continue
            nn.init.zeros_(p) if name.endswith("bias") else nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(t, device=idx.device))
        h = self.blocks(x, mask=self.mask[:t, :t], is_causal=True)
        return self.head(self.ln_f(h))


def models_suite(dev):
    """The rows of crates/ember-cli/src/bench/models.rs: ResNet-50 (SGD, momentum
    0.9, lr 0.01) and GPT-2 small (AdamW lr 6e-4, weight decay 0.1 on tensors of
    two or more dims, clipping at 1.0), in float32 and under bf16 autocast; each
    row builds its model anew (seed 0) and frees it before the next."""
    gpu = dev.type == "cuda"
    q = args.quick
    compile_rows = gpu and not q and os.environ.get("BENCH_NO_COMPILE", "0") in ("", "0")
    precisions = [(None, ""), (torch.bfloat16, ", autocast bf16")]

    later = []  # the torch.compile rows: last, so that a short lease loses only them
    # BENCH_ONLY_COMPILE=1: those rows alone (a second call, after the eager ones)
    only_compiled = compile_rows and os.environ.get("BENCH_ONLY_COMPILE", "0") not in ("", "0")

    def timed(name, amount, make_step, compiled=False):
        """A row of the step make_step() returns (None to skip), then frees it."""
        if args.filter and args.filter not in name:
            return
        if only_compiled and not compiled:
            return
        if compiled:
            later.append((name, amount, make_step))
            return
        run_row(name, amount, make_step, False)

    def profile(name, step):
        """torch.profiler's table of a few steps, after the timing's warm-up."""
        acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if gpu else [])
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(args.profile_steps):
                step()
            sync(dev)
        key = "self_cuda_time_total" if gpu else "self_cpu_time_total"
        print(f"\nPyTorch profile of {name} on {dev}: {args.profile_steps} steps", file=sys.stderr)
        print(prof.key_averages().table(sort_by=key, row_limit=15), file=sys.stderr, flush=True)

    def run_row(name, amount, make_step, compiled):
        try:
            step = make_step()
            if step is None:
                return
            if compiled:
                # compilation happens in the first calls: warm up past it
                for _ in range(3):
                    step()
            row(dev, name, "samples", amount, step, peak=True)
            if args.profile is not None and not compiled:
                profile(name, step)
        except Exception as e:  # a reference row that fails says why and the run goes on
            if not compiled:
                raise
            note_row(dev, name, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        finally:
            step = None
            if compiled:
                torch._dynamo.reset()
            gc.collect()
            if gpu:
                torch.cuda.empty_cache()

    b, hw = (2, 32) if q else ((64, 224) if gpu else (2, 224))
    try:
        import torchvision
    except ImportError:
        torchvision = None
        print("the ResNet-50 rows need torchvision (pip install torchvision): left out", file=sys.stderr)
    for amp, suffix in precisions:
        if torchvision is None:
            break
        name = f"train resnet50 b{b} {hw}x{hw}{suffix}"

        def resnet_step(channels_last=False, compiled=False, amp=amp):
            torch.backends.cudnn.benchmark = channels_last
            torch.manual_seed(0)
            fmt = torch.channels_last if channels_last else torch.contiguous_format
            model = torchvision.models.resnet50(num_classes=1000).to(dev, memory_format=fmt)
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            x = torch.randn(b, 3, hw, hw).to(dev).contiguous(memory_format=fmt)
            y = torch.randint(0, 1000, (b,)).to(dev)
            run = torch.compile(model) if compiled else model

            def step():
                opt.zero_grad(set_to_none=True)
                with torch.autocast(dev.type, dtype=amp or torch.bfloat16, enabled=amp is not None):
                    loss = F.cross_entropy(run(x), y)
                loss.backward()
                opt.step()
            return step

        timed(name, b, resnet_step)
        if gpu:
            timed(f"{name}, channels_last + cudnn.benchmark", b, lambda: resnet_step(channels_last=True))
            torch.backends.cudnn.benchmark = False
        if compile_rows:
            timed(f"{name}, torch.compile", b, lambda f=resnet_step: f(compiled=True), compiled=True)

    if q:
        (v, ctx, layers, heads, width), gpt_name, gb, t = (512, 64, 2, 2, 128), "gpt 2x128 v512", 2, 64
    else:
        (v, ctx, layers, heads, width), gpt_name = (50304, 1024, 12, 12, 768), "gpt2_small"
        gb, t = (8, 1024) if gpu else (1, 128)
    for amp, suffix in precisions:
        name = f"train {gpt_name} b{gb}x{t}{suffix}"

        def gpt_step(compiled=False, amp=amp):
            torch.manual_seed(0)
            gpt = Gpt(v, ctx, layers, heads, width).to(dev)
            params = list(gpt.parameters())
            opt = torch.optim.AdamW([
                {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
            ], lr=6e-4)
            x, y = torch.randint(0, v, (gb, t)).to(dev), torch.randint(0, v, (gb, t)).to(dev)
            run = torch.compile(gpt) if compiled else gpt

            def step():
                opt.zero_grad(set_to_none=True)
                with torch.autocast(dev.type, dtype=amp or torch.bfloat16, enabled=amp is not None):
                    loss = F.cross_entropy(run(x).reshape(-1, v), y.reshape(-1))
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
            return step

        timed(name, gb * t, gpt_step)
        if gpu and amp is not None:
            # ember's row of this name sends attention to cuDNN's fused engines
            from torch.nn.attention import SDPBackend, sdpa_kernel

            def cudnn_gpt_step(f=gpt_step):
                step = f()

                def in_cudnn():
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        step()
                try:  # a PyTorch without cuDNN attention here: the row is left out
                    in_cudnn()
                except RuntimeError as e:
                    print(f"# PyTorch's cuDNN attention did not run: {e}", file=sys.stderr)
                    return None
                return in_cudnn
            timed(f"{name}, cudnn attention", gb * t, cudnn_gpt_step)
        if compile_rows:
            timed(f"{name}, torch.compile", gb * t, lambda f=gpt_step: f(compiled=True), compiled=True)
    for name, amount, make_step in later:
        run_row(name, amount, make_step, True)


def pieces_suite(dev):
    """The rows of crates/ember-cli/src/bench/pieces.rs: ResNet-50's and GPT-2
    small's layers, each forward and backward from a fixed upstream gradient (the
    loss from its scalar), in float32 and with bfloat16 operands (no autocast; batch
    norm's parameters and statistics float32, as under autocast);
    PyTorch's defaults (cuDNN's TF32 on, the matmuls' off), as ember's."""
    gpu = dev.type == "cuda"
    q = args.quick
    torch.manual_seed(0)
    if q:
        b, hw, tokens, att, loss_rows, width, hidden, vocab = 1, (8, 4), 64, (1, 2, 64, 32), 64, 96, 384, 1000
    elif gpu:
        b, hw, tokens, att, loss_rows, width, hidden, vocab = 64, (56, 14), 8192, (8, 12, 1024, 64), 8192, 768, 3072, 50304
    else:
        b, hw, tokens, att, loss_rows, width, hidden, vocab = 2, (56, 14), 1024, (1, 12, 256, 64), 512, 768, 3072, 50304
    leaf = lambda shape, dt: torch.randn(*shape).to(dt).to(dev).requires_grad_()
    upstream = lambda shape, dt: torch.randn(*shape).to(dt).to(dev)

    def piece(name, kind, amount, leaves, up, f):
        def call():
            y = f(*leaves)
            y.backward(up) if up is not None else y.backward()
            for t in leaves:
                t.grad = None
        row(dev, name, kind, amount, call)

    for tag, dt in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        nb = 2 if dt == torch.bfloat16 else 4
        # row-major, then channels-last with cudnn.benchmark (the models' channels-last rows)
        for fmt, cl_name in ((torch.contiguous_format, ""), (torch.channels_last, " channels-last")):
            timed_before = torch.backends.cudnn.benchmark
            torch.backends.cudnn.benchmark = timed_before or bool(cl_name)
            for k, c, o, s in ((3, 64, 64, hw[0]), (1, 256, 64, hw[0]), (3, 256, 256, hw[1])):
                laid = lambda t: t.detach().to(memory_format=fmt).requires_grad_()
                x, w = laid(leaf((b, c, s, s), dt)), laid(leaf((o, c, k, k), dt))
                up = upstream((b, o, s, s), dt).to(memory_format=fmt)
                piece(f"conv {k}x{k} {c}->{o} at {s}x{s} b{b}{cl_name} fwd+bwd {tag}", "flops",
                      3.0 * 2.0 * b * o * s * s * c * k * k, [x, w], up,
                      lambda x, w, p=k // 2: F.conv2d(x, w, padding=p))
            torch.backends.cudnn.benchmark = timed_before
        shape = (b, 256, hw[0], hw[0])
        elems = b * 256 * hw[0] * hw[0]
        # (batch norm's parameters and statistics in float32, as a model's under autocast)
        f32 = torch.float32
        x, w, bias, up = leaf(shape, dt), leaf((256,), f32), leaf((256,), f32), upstream(shape, dt)
        mean, var = torch.zeros(256, dtype=f32, device=dev), torch.ones(256, dtype=f32, device=dev)
        piece(f"batch norm 256ch at {hw[0]}x{hw[0]} b{b} fwd+bwd {tag}", "bytes", 8.0 * nb * elems,
              [x, w, bias], up, lambda x, w, bias: F.batch_norm(x, mean, var, w, bias, training=True))
        # again channels-last (the input and its gradient [n, h, w, c] in memory)
        cl = torch.channels_last
        x = torch.randn(*shape).to(dt).to(dev).to(memory_format=cl).requires_grad_()
        piece(f"batch norm 256ch at {hw[0]}x{hw[0]} b{b} channels-last fwd+bwd {tag}", "bytes",
              8.0 * nb * elems, [x, w, bias], up.to(memory_format=cl),
              lambda x, w, bias: F.batch_norm(x, mean, var, w, bias, training=True))
        x = leaf(shape, dt)
        piece(f"relu {b}x256x{hw[0]}x{hw[0]} fwd+bwd {tag}", "bytes", 5.0 * nb * elems, [x], up, F.relu)
        del up
        ab, ah, al, ad = att
        qkv, up = [leaf(att, dt) for _ in range(3)], upstream(att, dt)
        piece(f"attention causal {ab}x{ah}x{al}x{ad} fwd+bwd {tag}", "flops", 3.5 * 4.0 * ab * ah * al * al * ad / 2,
              qkv, up, lambda q_, k_, v_: F.scaled_dot_product_attention(q_, k_, v_, is_causal=True))
        if gpu and dt != torch.float32:
            # ember's row of this name sends the call to cuDNN's fused engines
            from torch.nn.attention import SDPBackend, sdpa_kernel

            def cudnn_attention(q_, k_, v_):
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(q_, k_, v_, is_causal=True)
            try:
                piece(f"attention causal {ab}x{ah}x{al}x{ad} fwd+bwd {tag} cudnn", "flops",
                      3.5 * 4.0 * ab * ah * al * al * ad / 2, qkv, up, cudnn_attention)
            except RuntimeError as e:
                print(f"# PyTorch's cuDNN attention did not run: {e}", file=sys.stderr)
        del qkv, up
        n, d, h = tokens, width, hidden
        x, w, bias, up = leaf((n, d), dt), leaf((d,), dt), leaf((d,), dt), upstream((n, d), dt)
        piece(f"layer norm {n}x{d} fwd+bwd {tag}", "bytes", 5.0 * nb * n * d, [x, w, bias], up,
              lambda x, w, bias: F.layer_norm(x, [d], w, bias, 1e-5))
        x, up_h = leaf((n, h), dt), upstream((n, h), dt)
        piece(f"gelu {n}x{h} fwd+bwd {tag}", "bytes", 5.0 * nb * n * h, [x], up_h, F.gelu)
        x, w, bias = leaf((n, d), dt), leaf((h, d), dt), leaf((h,), dt)
        piece(f"linear {n}x{d} -> {h} fwd+bwd {tag}", "flops", 3.0 * 2.0 * n * d * h, [x, w, bias], up_h,
              F.linear)
        del up, up_h
        logits, target = leaf((loss_rows, vocab), dt), torch.randint(0, vocab, (loss_rows,), device=dev)
        piece(f"cross-entropy {loss_rows}x{vocab} fwd+bwd {tag}", "bytes", 3.0 * nb * loss_rows * vocab,
              [logits], None, lambda x: F.cross_entropy(x, target))
        del logits


devs = [torch.device("cpu")] + [torch.device(f"cuda:{i}") for i in range(torch.cuda.device_count())] \
    if args.device == "all" else [torch.device(args.device)]
for d in devs:
    if args.suite in ("ops", "all"):
        with torch.no_grad():
            suite(d)
    if args.suite in ("train", "all"):
        train_suite(d)
    if args.suite == "models":
        models_suite(d)
    if args.suite == "pieces":
        pieces_suite(d)
if args.json:
    with open(args.json, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
