"""Golden values for ember's nn, losses and optimizers, from PyTorch.

Writes nn_cases.json next to this file:
- losses: cross_entropy (mean/sum/none, label smoothing), nll, mse, bce_with_logits,
  with their values and input gradients;
- optimizers: five steps of SGD (plain, momentum+dampening, nesterov+weight decay),
  Adam (with weight decay), AdamW, RMSprop and Adagrad on a fixed quadratic-ish
  objective, with a second parameter that has no gradient at the first two steps;
- schedulers: every schedule's learning rates over two parameter groups, and the
  momentum one-cycle schedules cycle;
- groups: AdamW and SGD over two parameter groups with their own settings;
- init: statistics of PyTorch's default initial parameters for large layers;
- modules: Linear, Conv2d, BatchNorm1d/2d (train and eval, running statistics) and
  a small CNN, with fixed parameters: outputs, input gradients, final buffers;
- in-place ops in a graph: short programs that modify tensors of a graph in place
  (version counters, saved tensors, leaves), with the gradients or PyTorch's error;
- the Iris lesson: model 4 -> 8 -> 9 -> 3 (ReLU), CrossEntropyLoss, Adam lr 0.01,
  seed 32, 80/20 split, 100 full-batch epochs: initial weights, the split, the loss
  of every epoch and the final test accuracy.
- sequence modules: MultiheadAttention (masks, weights), transformer encoder and
  decoder layers and an encoder stack, in float64: outputs and the gradients of
  every input and parameter.
- rnn: nn.RNN and nn.RNNCell (tanh, relu), with outputs, h_n and the gradients
  of the input, h0 and every parameter; PyTorch's refusals.
- transformer2: TransformerDecoder stacks and nn.Transformer (masks, causal hints,
  batch_first, norm_first, no bias), float64 in evaluation mode: outputs and the
  gradients of every input and parameter; PyTorch's messages for refused input.
- resample: F.interpolate's bicubic and area modes and antialiased bilinear and
  bicubic (float64 and float32: outputs and input gradients), uint8 images'
  bilinear and bicubic resizing (outputs), PyTorch's refusals.
- embedding_bag: F.embedding_bag's modes over offsets and 2-D inputs, with
  padding and per-sample weights: outputs and gradients; PyTorch's refusals.
- layers3: LogSigmoid, Softsign, Tanhshrink, Softshrink, Hardshrink, Threshold,
  GLU, Softmin, LogSoftmax, Unflatten and the padding modules (outputs and input
  gradients); the mask shapes of channel dropout; PyTorch's refusals.
- layers4: pixel and channel shuffle, 1-D max and average pooling, adaptive
  average and max pooling (with indices), max_pool2d's indices, max_unpool2d,
  unfold and fold (outputs, indices, input gradients); bool unfold and fold;
  PyTorch's refusals.
- optimizers2: NAdam, RAdam, Adamax, Adadelta, Rprop and ASGD (weight decay,
  decoupled decay, maximize) on the objective of `optimizers`, their
  trajectories (and ASGD's averages);
- schedulers2: MultiStepLR, ExponentialLR, ConstantLR, PolynomialLR,
  MultiplicativeLR, CosineAnnealingWarmRestarts (also fractional epochs),
  CyclicLR (its three modes, momentum cycled) and ChainedScheduler over two
  parameter groups: rates after each step, and step(epoch)'s closed forms.
- rnn_utils: pad_sequence (lengths, trailing dims, broadcasting, dtypes, both
  sides, batch-first) with each sequence's gradient, unpad_sequence;
  PyTorch's refusals.
Run from anywhere: python3 crates/ember/tests/golden/gen_nn.py [SECTION...]
(only the named sections are regenerated; the others are kept).
"""
import csv
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", "..", ".."))
torch.set_default_dtype(torch.float64)


def flat(t):
    return [float(x) for x in t.detach().reshape(-1).tolist()]


def tensor_json(t):
    return {"shape": list(t.shape), "values": flat(t)}


def loss_cases():
    torch.manual_seed(0)
    logits = torch.randn(5, 4)
    target = torch.tensor([0, 3, 1, 1, 2])
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    probs = torch.rand(3, 4)
    out = []

    def case(name, fn, inputs, extra=None):
        ins = [i.clone().requires_grad_(True) for i in inputs]
        v = fn(*ins)
        v.backward(torch.linspace(-1, 1.3, v.numel()).reshape(v.shape) if v.dim() else None)
        out.append({"name": name, "inputs": [tensor_json(i) for i in inputs], "extra": extra or {},
                    "value": tensor_json(v), "grads": [tensor_json(i.grad) for i in ins]})

    for red in ("mean", "sum", "none"):
        case(f"cross_entropy_{red}", lambda l: F.cross_entropy(l, target, reduction=red), [logits],
             {"target": target.tolist(), "reduction": red, "label_smoothing": 0.0})
    case("cross_entropy_smooth", lambda l: F.cross_entropy(l, target, label_smoothing=0.1), [logits],
         {"target": target.tolist(), "reduction": "mean", "label_smoothing": 0.1})
    case("nll", lambda l: F.nll_loss(F.log_softmax(l, -1), target), [logits],
         {"target": target.tolist(), "reduction": "mean"})
    case("mse", lambda a, b: F.mse_loss(a, b), [x, y], {"reduction": "mean"})
    case("mse_sum", lambda a, b: F.mse_loss(a, b, reduction="sum"), [x, y], {"reduction": "sum"})
    big = torch.tensor([[-100.0, -3.0, 0.0, 2.5], [50.0, 0.0, -0.5, 1.0], [0.1, -0.1, 30.0, -30.0]])
    case("bce_with_logits", lambda a, b: F.binary_cross_entropy_with_logits(a, b), [big, probs], {"reduction": "mean"})
    return out


def optimizer_cases():
    out = []
    configs = [
        ("sgd", lambda p: torch.optim.SGD(p, lr=0.1), {"lr": 0.1}),
        ("sgd_momentum", lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1),
         {"lr": 0.05, "momentum": 0.9, "dampening": 0.1}),
        ("sgd_nesterov_wd", lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.01),
         {"lr": 0.05, "momentum": 0.8, "nesterov": True, "weight_decay": 0.01}),
        ("adam", lambda p: torch.optim.Adam(p, lr=0.01), {"lr": 0.01}),
        ("adam_wd", lambda p: torch.optim.Adam(p, lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
         {"lr": 0.02, "betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 0.1}),
        ("adamw", lambda p: torch.optim.AdamW(p, lr=0.01), {"lr": 0.01}),
        ("rmsprop", lambda p: torch.optim.RMSprop(p, lr=0.01), {"lr": 0.01}),
        ("rmsprop_full", lambda p: torch.optim.RMSprop(p, lr=0.01, alpha=0.9, eps=1e-6, weight_decay=0.1,
                                                       momentum=0.5, centered=True),
         {"lr": 0.01, "alpha": 0.9, "eps": 1e-6, "weight_decay": 0.1, "momentum": 0.5, "centered": True}),
        ("adagrad", lambda p: torch.optim.Adagrad(p, lr=0.1), {"lr": 0.1}),
        ("adagrad_full", lambda p: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.05, weight_decay=0.1,
                                                       initial_accumulator_value=0.2, eps=1e-6),
         {"lr": 0.1, "lr_decay": 0.05, "weight_decay": 0.1, "initial_accumulator_value": 0.2, "eps": 1e-6}),
        # amsgrad with a fast-forgetting second moment, so that its running
        # maximum differs from the moment itself within five steps
        ("adam_amsgrad", lambda p, ams=True: torch.optim.Adam(p, lr=0.05, betas=(0.9, 0.5), amsgrad=ams),
         {"lr": 0.05, "betas": [0.9, 0.5], "amsgrad": True}),
        ("adam_maximize", lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.1, maximize=True),
         {"lr": 0.01, "weight_decay": 0.1, "maximize": True}),
        # (a decay strong enough that the gradient shrinks: going up it alone,
        # the second moment only grows and AMSGrad's maximum changes nothing)
        ("adamw_amsgrad_maximize", lambda p, ams=True: torch.optim.AdamW(p, lr=0.05, betas=(0.8, 0.5),
                                                                         weight_decay=3.0, amsgrad=ams,
                                                                         maximize=True),
         {"lr": 0.05, "betas": [0.8, 0.5], "weight_decay": 3.0, "amsgrad": True, "maximize": True}),
        ("sgd_maximize", lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01, maximize=True),
         {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01, "maximize": True}),
        ("rmsprop_maximize", lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, weight_decay=0.1,
                                                           centered=True, maximize=True),
         {"lr": 0.01, "momentum": 0.5, "weight_decay": 0.1, "centered": True, "maximize": True}),
        ("adagrad_maximize", lambda p: torch.optim.Adagrad(p, lr=0.1, weight_decay=0.1, maximize=True),
         {"lr": 0.1, "weight_decay": 0.1, "maximize": True}),
    ]
    def trajectories(make):
        w = torch.tensor([1.0, -2.0, 0.5, 3.0], requires_grad=True)
        # a second parameter without a gradient at the first two steps: its own
        # step count (bias corrections, Adagrad's decay) starts at its first step
        late = torch.tensor([0.7, -1.5], requires_grad=True)
        opt = make([w, late])
        traj, late_traj = [], []
        for step in range(5):
            opt.zero_grad()
            # a non-quadratic objective so every step's gradient differs
            loss = (w ** 4).sum() * 0.1 + (w * torch.tensor([1.0, 2.0, -1.0, 0.5])).sum()
            if step >= 2:
                loss = loss + (late ** 4).sum() * 0.2 + (late * torch.tensor([-1.0, 0.5])).sum()
            loss.backward()
            opt.step()
            traj.append(flat(w))
            late_traj.append(flat(late))
        return traj, late_traj

    for name, make, cfg in configs:
        traj, late_traj = trajectories(make)
        if cfg.get("amsgrad"):
            # the running maximum must matter within the five steps
            assert trajectories(lambda p: make(p, ams=False)) != (traj, late_traj), name
        out.append({"name": name, "config": cfg, "init": [1.0, -2.0, 0.5, 3.0], "trajectory": traj,
                    "late_init": [0.7, -1.5], "late_trajectory": late_traj})
    return out


def scheduler_cases():
    """The learning rates after construction ("initial") and after each step, for an
    optimizer of two parameter groups (lr 0.1 and 0.02): "lrs" is the first
    group's, "group_lrs" both; one-cycle cases also record the momentum (SGD's
    momentum, Adam's first beta) of the first group."""
    S = torch.optim.lr_scheduler
    out = []
    metrics = [1.0, 0.9, 0.95, 0.95, 0.95, 0.8, 0.85, 0.85, 0.85, 0.85, 0.7, 0.7]
    cases = [
        ("step", lambda o: S.StepLR(o, step_size=3, gamma=0.5), 12),
        ("cosine", lambda o: S.CosineAnnealingLR(o, T_max=10, eta_min=0.001), 12),
        ("linear_warmup", lambda o: S.LinearLR(o, start_factor=0.1, end_factor=1.0, total_iters=4), 8),
        ("linear_decay", lambda o: S.LinearLR(o, start_factor=1.0, end_factor=0.2, total_iters=5), 8),
        ("linear_none", lambda o: S.LinearLR(o, start_factor=0.5, end_factor=1.0, total_iters=0), 4),
        ("lambda", lambda o: S.LambdaLR(o, lambda e: 0.95 ** e), 8),
        ("sequential", lambda o: S.SequentialLR(o, [S.LinearLR(o, 0.25, 1.0, 3),
                                                    S.CosineAnnealingLR(o, T_max=8, eta_min=0.001)], [3]), 12),
        # ember's SequentialLr::warmup_cosine(opt, 3, 10, 0.001): a warm-up from 1% over
        # 3 steps, then a cosine to 0.001 over the other 7
        ("warmup_cosine", lambda o: S.SequentialLR(o, [S.LinearLR(o, 0.01, 1.0, 3),
                                                       S.CosineAnnealingLR(o, T_max=7, eta_min=0.001)], [3]), 12),
        ("onecycle", lambda o: S.OneCycleLR(o, max_lr=0.5, total_steps=12, cycle_momentum=False), 11),
        ("onecycle_momentum", lambda o: S.OneCycleLR(o, max_lr=0.5, total_steps=12), 11),
        ("onecycle_adam_three_phase_linear",
         lambda o: S.OneCycleLR(o, max_lr=0.3, total_steps=15, pct_start=0.25, anneal_strategy="linear",
                                three_phase=True, base_momentum=0.8, max_momentum=0.9, div_factor=10.0,
                                final_div_factor=100.0), 14),
        ("plateau", lambda o: S.ReduceLROnPlateau(o, factor=0.5, patience=2, cooldown=1), len(metrics)),
        # a threshold large enough to decide (0.9 after 1.0 is not 10% better)
        ("plateau_threshold", lambda o: S.ReduceLROnPlateau(o, factor=0.5, patience=1, threshold=0.1),
         len(metrics)),
        ("plateau_max", lambda o: S.ReduceLROnPlateau(o, mode="max", factor=0.5, patience=1, threshold=0.05),
         len(metrics)),
        # a rising metric (accuracy) that improves by less than 5% at times: the
        # max mode's comparison decides each step
        ("plateau_max_rising", lambda o: S.ReduceLROnPlateau(o, mode="max", factor=0.5, patience=1,
                                                             threshold=0.05), len(metrics)),
    ]
    import warnings
    rising = [0.5, 0.6, 0.62, 0.64, 0.7, 0.71, 0.72, 0.9, 0.91, 0.95, 0.99, 0.99]
    for name, make, steps in cases:
        case_metrics = rising if name == "plateau_max_rising" else metrics
        groups = [{"params": [torch.zeros(1, requires_grad=True)]},
                  {"params": [torch.zeros(1, requires_grad=True)], "lr": 0.02}]
        adam = "adam" in name
        opt = torch.optim.Adam(groups, lr=0.1) if adam else torch.optim.SGD(groups, lr=0.1, momentum=0.9)

        def momentum():
            g = opt.param_groups[0]
            return g["betas"][0] if adam else g["momentum"]

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sched = make(opt)
            initial = [g["lr"] for g in opt.param_groups]
            initial_momentum = momentum()
            lrs, momenta = [], []
            for k in range(steps):
                opt.step()
                sched.step(case_metrics[k]) if name.startswith("plateau") else sched.step()
                lrs.append([g["lr"] for g in opt.param_groups])
                momenta.append(momentum())
        out.append({"name": name, "initial": initial[0], "initial_groups": initial,
                    "lrs": [l[0] for l in lrs], "group_lrs": lrs,
                    "initial_momentum": initial_momentum, "momenta": momenta,
                    "metrics": case_metrics[:steps] if name.startswith("plateau") else []})
    return out


def group_cases():
    """Parameter groups: a matrix and a bias trained together with their own
    learning rate, weight decay (and momentum) for five steps."""
    out = []
    configs = [
        ("adamw", lambda w, b: torch.optim.AdamW([{"params": [w], "weight_decay": 0.1},
                                                  {"params": [b], "weight_decay": 0.0, "lr": 0.05}], lr=0.01)),
        ("sgd", lambda w, b: torch.optim.SGD([{"params": [w], "momentum": 0.9, "weight_decay": 0.01},
                                              {"params": [b], "lr": 0.2}], lr=0.05)),
    ]
    for name, make in configs:
        w = torch.tensor([[1.0, -2.0], [0.5, 3.0]], requires_grad=True)
        b = torch.tensor([0.3, -0.7], requires_grad=True)
        opt = make(w, b)
        x = torch.tensor([[1.0, 2.0], [-1.0, 0.5], [0.25, -3.0]])
        traj = []
        for _ in range(5):
            opt.zero_grad()
            loss = ((x @ w + b) ** 2).tanh().sum() + (w ** 4).sum() * 0.05
            loss.backward()
            opt.step()
            traj.append({"w": flat(w), "b": flat(b)})
        out.append({"name": name, "x": flat(x), "init_w": [1.0, -2.0, 0.5, 3.0], "init_b": [0.3, -0.7],
                    "trajectory": traj})
    return out


def init_cases():
    """Each layer is built `repeats` times (enough for >= 10000 draws of its smallest
    parameter) and the statistics are over all the draws."""
    torch.manual_seed(0)
    layers = {"linear_784_128": lambda: nn.Linear(784, 128), "conv_64_128_3": lambda: nn.Conv2d(64, 128, 3),
              "conv_8_32_5_g4": lambda: nn.Conv2d(8, 32, 5, groups=4), "bn2d_16": lambda: nn.BatchNorm2d(16)}
    out = []
    for name, make in layers.items():
        first = make().state_dict()
        smallest = min(t.numel() for t in first.values())
        repeats = 1 if name.startswith("bn") else -(-10000 // smallest)
        draws = [first] + [make().state_dict() for _ in range(repeats - 1)]
        for pname, t in first.items():
            t = torch.cat([d[pname].double().reshape(-1) for d in draws])
            out.append({"layer": name, "param": pname, "shape": list(first[pname].shape), "repeats": repeats,
                        "min": float(t.min()), "max": float(t.max()), "mean": float(t.mean()),
                        "std": float(t.std()) if t.numel() > 1 else 0.0})
    return out


def module_cases():
    torch.manual_seed(1)
    out = []

    def randomize(m):
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.randn(p.shape) * 0.5 + (1.0 if p.dim() == 1 and "BatchNorm" in type(m).__name__ else 0.0))
        return m

    def run(name, m, steps):
        m = m.float()
        state = {k: tensor_json(v) for k, v in m.state_dict().items()}
        recs = []
        for mode, shape in steps:
            m.train(mode == "train")
            x = torch.randn(*shape, dtype=torch.float32) * 2 + 0.5
            xg = x.clone().requires_grad_(True)
            y = m(xg)
            y.backward(torch.linspace(-1, 1, y.numel()).reshape(y.shape).float())
            recs.append({"mode": mode, "x": tensor_json(x), "y": tensor_json(y), "x_grad": tensor_json(xg.grad)})
        final = {k: tensor_json(v) for k, v in m.state_dict().items()}
        out.append({"name": name, "state": state, "steps": recs, "final_state": final})

    run("linear", randomize(nn.Linear(5, 3)), [("train", (4, 5)), ("eval", (2, 7, 5))])
    run("conv2d_s2_p1", randomize(nn.Conv2d(3, 4, 3, stride=2, padding=1)), [("train", (2, 3, 7, 7))])
    run("bn1d", randomize(nn.BatchNorm1d(3)), [("train", (6, 3)), ("train", (5, 3)), ("eval", (4, 3))])
    run("bn1d_3d", randomize(nn.BatchNorm1d(3)), [("train", (4, 3, 5)), ("eval", (2, 3, 5))])
    run("bn2d", randomize(nn.BatchNorm2d(4)), [("train", (3, 4, 5, 5)), ("train", (2, 4, 5, 5)), ("eval", (2, 4, 5, 5))])
    bn = randomize(nn.BatchNorm2d(2, momentum=None))
    run("bn2d_cumulative", bn, [("train", (3, 2, 4, 4)), ("train", (3, 2, 4, 4)), ("train", (3, 2, 4, 4)), ("eval", (1, 2, 4, 4))])
    run("bn2d_no_affine", nn.BatchNorm2d(3, affine=False), [("train", (2, 3, 4, 4)), ("eval", (2, 3, 4, 4))])
    cnn = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(4 * 4 * 4, 10))
    run("cnn", cnn, [("train", (3, 1, 8, 8)), ("eval", (2, 1, 8, 8))])
    return out


def iris_case():
    with open(os.path.join(ROOT, "data", "iris.csv")) as f:
        rows = list(csv.reader(f))[1:]
    X = torch.tensor([[float(v) for v in r[:4]] for r in rows], dtype=torch.float32)
    y = torch.tensor([int(r[4]) for r in rows])
    perm = torch.randperm(150, generator=torch.Generator().manual_seed(32))
    tr, te = perm[:120], perm[120:]
    torch.manual_seed(32)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 9), nn.ReLU(), nn.Linear(9, 3)).float()
    init = {k: tensor_json(v) for k, v in model.state_dict().items()}
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for _ in range(100):
        loss = F.cross_entropy(model(X[tr]), y[tr])
        losses.append(float(loss.detach()))
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        acc = float((model(X[te]).argmax(1) == y[te]).float().mean())
    return {"init": init, "perm": perm.tolist(), "losses": losses, "test_accuracy": acc}


INPLACE_PHRASES = ["has been modified by an inplace operation",
                   "a leaf Variable that requires grad is being used in an in-place operation",
                   "can't be cast to the desired output type"]


def inplace_cases():
    """Each program gets leaves x and b (float64 [3], requiring grad) and returns a
    scalar to backpropagate; tests/tensor/nn.rs runs the same programs by name."""
    def p_add(x, b):
        h = x * 2; h.add_(b); return (h * h).sum()

    def p_mul(x, b):
        h = x * 2; h.mul_(b); return h.sum()

    def p_div(x, b):
        h = x * 2; h.div_(b); return h.sum()

    def p_sub_chain(x, b):
        h = x * 2; h.add_(b); h.mul_(3); h.sub_(x); return (h * b).sum()

    def p_scalar_ops(x, b):
        h = x * b; h.mul_(2.5); h.sub_(1); h.div_(4); return (h * h).sum()

    def p_saved_output(x, b):
        y = x.exp(); y.add_(1); return y.sum()

    def p_saved_input(x, b):
        h = x * 2; z = h * h; h.add_(1); return z.sum()

    def p_unsaved_input(x, b):
        h = x * 2; z = h.sigmoid(); h.add_(b); return (z + h).sum()

    def p_mul_self(x, b):
        h = x * 2; h.mul_(h); return h.sum()

    def p_leaf(x, b):
        x.add_(1); return x.sum()

    def p_buffer(x, b):
        buf = torch.zeros(3); buf.add_(x); return (buf * b).sum()

    def p_copy(x, b):
        h = x * 2; h.copy_(b); return (h * h).sum()

    def p_copy_broadcast(x, b):
        h = x * 2; h.copy_(b[1:2].detach() * 0 + b.sum()); return (h * x).sum()

    def p_detached_alias(x, b):
        h = x * 2; d = h.detach(); z = h * h; d.add_(1); return z.sum()

    def p_no_grad_update(x, b):
        h = x * 2
        with torch.no_grad():
            h.add_(1)
        return (h * b).sum()

    def p_matmul_saved(x, b):
        w = b * 1; z = x.matmul(w); w.add_(1); return z

    def p_matmul_unsaved(x, b):
        w = b * 1; z = w.matmul(x.detach()); w.add_(1); return z + w.sum()

    def p_dtype(x, b):
        h = (x * 2).float(); h.add_(b); return (h * h).sum()

    def p_int_target(x, b):
        t = torch.tensor([1, 2, 3]); t.add_(b); return t.sum()

    def p_sum_then_modify(x, b):
        h = x * 3; s = h.sum(); h.mul_(b); return s + h.sum()

    # in-place activations: the rule keeps the result (relu, sigmoid, tanh, exp), or
    # the original values where it reads the input (sin, silu); a later in-place op
    # on a kept result, a leaf, and an integer target of a float op are errors
    def p_relu(x, b):
        h = x * b - 0.3; h.relu_(); return (h * h).sum()

    def p_add_then_relu(x, b):
        h = x * 2; h.add_(b); h.relu_(); return (h * b).sum()

    def p_sigmoid(x, b):
        h = x * b; h.sigmoid_(); return (h * b).sum()

    def p_tanh_exp(x, b):
        h = x * b; h.tanh_(); h.exp_(); return h.sum()

    def p_sin(x, b):
        h = x * b; h.sin_(); return (h * x).sum()

    def p_silu(x, b):
        h = x * 2; F.silu(h, inplace=True); return (h * b).sum()

    def p_floor(x, b):
        h = x * 3; h.floor_(); return (h * b).sum()

    def p_relu_then_modified(x, b):
        h = x * b; h.relu_(); h.add_(1); return (h * h).sum()

    def p_relu_of_saved_output(x, b):
        y = x.exp(); y.relu_(); return y.sum()

    def p_relu_leaf(x, b):
        x.relu_(); return x.sum()

    def p_mul_by_alias(x, b):
        h = x * 2; h.mul_(h.detach()); return h.sum()

    def p_div_by_alias(x, b):
        h = x * 2 + 3; h.div_(h.detach()); return (h * b).sum()

    def p_sigmoid_int_target(x, b):
        t = torch.tensor([1, 2, 3]); t.sigmoid_(); return (t * b).sum()

    out = []
    torch.manual_seed(7)
    x0, b0 = torch.randn(3), torch.rand(3) + 0.5
    for name, f in list(locals().items()):
        if not name.startswith("p_"):
            continue
        x, b = x0.clone().requires_grad_(True), b0.clone().requires_grad_(True)
        c = {"name": name[2:], "inputs": [tensor_json(x0), tensor_json(b0)]}
        try:
            f(x, b).backward()
            c["grads"] = [tensor_json(t.grad) if t.grad is not None else None for t in (x, b)]
        except RuntimeError as e:
            c["error"] = str(e).splitlines()[0]
            # the words ember's message must contain too
            c["phrase"] = next(p for p in INPLACE_PHRASES if p in c["error"])
        out.append(c)
    return out


def seq_module_cases():
    """Attention and transformer modules in float64 with random parameters: outputs,
    attention weights, and the gradients of every input and parameter for a fixed
    output gradient."""
    torch.manual_seed(20)
    out = []

    def randomize(m):
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.randn(p.shape) * 0.3)
        return m

    def mask_json(t):
        # -inf (a float mask's blocked entries) as the string "-inf": JSON has no infinity
        vals = [float(x) for x in t.reshape(-1).tolist()]
        return {"shape": list(t.shape), "values": [v if v != float("-inf") else "-inf" for v in vals],
                "bool": t.dtype == torch.bool}

    def run(name, kind, config, m, inputs, masks, call):
        m = randomize(m).double()
        m.eval()
        state = {k: tensor_json(v) for k, v in m.state_dict().items()}
        ins = {k: v.clone().double().requires_grad_(True) for k, v in inputs.items()}
        y, w = call(m, ins, masks)
        loss = (y * torch.linspace(-1, 1, y.numel(), dtype=torch.float64).reshape(y.shape)).sum()
        if w is not None:
            loss = loss + (w * torch.linspace(0.5, -0.5, w.numel(), dtype=torch.float64).reshape(w.shape)).sum()
        loss.backward()
        out.append({"name": name, "kind": kind, "config": config, "state": state,
                    "inputs": {k: tensor_json(v) for k, v in ins.items()},
                    "masks": {k: mask_json(v) for k, v in masks.items()},
                    "output": tensor_json(y), "weights": tensor_json(w) if w is not None else None,
                    "input_grads": {k: tensor_json(v.grad) for k, v in ins.items()},
                    "param_grads": {k: tensor_json(p.grad) for k, p in m.named_parameters()}})

    def mha_call(kw):
        def call(m, ins, masks):
            x = ins["query"]
            k = ins.get("key", x)
            v = ins.get("value", k)
            return m(x, k, v, key_padding_mask=masks.get("key_padding_mask"), attn_mask=masks.get("attn_mask"), **kw)
        return call

    cfg = {"embed_dim": 8, "num_heads": 2, "batch_first": False, "bias": True}
    run("mha_self", "mha", cfg, nn.MultiheadAttention(8, 2), {"query": torch.randn(4, 3, 8)}, {},
        mha_call({"need_weights": True}))
    cfg = {"embed_dim": 8, "num_heads": 2, "batch_first": True, "bias": True}
    kpm = torch.tensor([[False, False, True, False, True], [False, False, False, False, False]])
    run("mha_cross_masks", "mha", cfg, nn.MultiheadAttention(8, 2, batch_first=True),
        {"query": torch.randn(2, 3, 8), "key": torch.randn(2, 5, 8), "value": torch.randn(2, 5, 8)},
        {"key_padding_mask": kpm, "attn_mask": torch.randn(3, 5)},
        mha_call({"need_weights": True, "average_attn_weights": False}))
    # no weights asked for (the memory-saving path's entry), a key padding mask
    cfg = {"embed_dim": 8, "num_heads": 2, "batch_first": True, "bias": True, "need_weights": False}
    run("mha_no_weights_key_padding", "mha", cfg, nn.MultiheadAttention(8, 2, batch_first=True),
        {"query": torch.randn(2, 3, 8), "key": torch.randn(2, 5, 8), "value": torch.randn(2, 5, 8)},
        {"key_padding_mask": kpm}, mha_call({"need_weights": False}))
    cfg = {"embed_dim": 8, "num_heads": 4, "batch_first": False, "bias": False}
    blocked = torch.tensor([[False, True, True], [False, False, True], [False, False, False]])
    run("mha_unbatched_bool_mask", "mha", cfg, nn.MultiheadAttention(8, 4, bias=False),
        {"query": torch.randn(3, 8)}, {"attn_mask": blocked}, mha_call({"need_weights": True}))
    causal = nn.Transformer.generate_square_subsequent_mask(4)
    pad = torch.tensor([[False, False, False, True], [False, False, False, False]])
    for norm_first, act in ((False, "relu"), (True, "gelu")):
        cfg = {"d_model": 8, "nhead": 2, "dim_feedforward": 16, "norm_first": norm_first, "activation": act}
        layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation=act, batch_first=True,
                                           norm_first=norm_first)
        run(f"encoder_layer_{'pre' if norm_first else 'post'}_{act}", "encoder_layer", cfg, layer,
            {"src": torch.randn(2, 4, 8)}, {"mask": causal, "src_key_padding_mask": pad},
            lambda m, ins, masks: (m(ins["src"], src_mask=masks["mask"],
                                     src_key_padding_mask=masks["src_key_padding_mask"]), None))
    cfg = {"d_model": 8, "nhead": 2, "dim_feedforward": 16, "norm_first": False, "activation": "relu", "num_layers": 2}
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    enc = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(8), enable_nested_tensor=False)
    run("encoder_stack", "encoder", cfg, enc, {"src": torch.randn(2, 4, 8)}, {"mask": causal},
        lambda m, ins, masks: (m(ins["src"], mask=masks["mask"]), None))
    for norm_first, act in ((False, "relu"), (True, "gelu")):
        cfg = {"d_model": 8, "nhead": 2, "dim_feedforward": 16, "norm_first": norm_first, "activation": act}
        dec = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=norm_first,
                                         activation=act)
        name = "decoder_layer" if not norm_first else "decoder_layer_pre_gelu"
        run(name, "decoder_layer", cfg, dec, {"tgt": torch.randn(2, 4, 8), "memory": torch.randn(2, 5, 8)},
            {"tgt_mask": causal, "memory_key_padding_mask": kpm},
            lambda m, ins, masks: (m(ins["tgt"], ins["memory"], tgt_mask=masks["tgt_mask"],
                                     memory_key_padding_mask=masks["memory_key_padding_mask"]), None))
    # recurrent layers: the output, h_n (and c_n) flattened into one vector
    def rnn_call(lstm):
        def call(m, ins, masks):
            x = ins["x"]
            if lstm:
                y, (h, c) = m(x, (ins["h0"], ins["c0"])) if "h0" in ins else m(x)
                return torch.cat([y.reshape(-1), h.reshape(-1), c.reshape(-1)]), None
            y, h = m(x, ins["h0"]) if "h0" in ins else m(x)
            return torch.cat([y.reshape(-1), h.reshape(-1)]), None
        return call

    def cell_call(lstm):
        def call(m, ins, masks):
            if lstm:
                h, c = m(ins["x"], (ins["h0"], ins["c0"]))
                return torch.cat([h.reshape(-1), c.reshape(-1)]), None
            return m(ins["x"], ins["h0"]).reshape(-1), None
        return call

    for name, kind, kw, x_shape, state_shape in [
        ("lstm_2layer_bidirectional", "lstm", {"num_layers": 2, "bidirectional": True}, (3, 2, 5), (4, 2, 4)),
        ("lstm_no_bias_zero_state", "lstm", {"bias": False}, (3, 2, 5), None),
        ("lstm_unbatched", "lstm", {"num_layers": 2}, (4, 5), (2, 4)),
        ("gru_2layer_batch_first", "gru", {"num_layers": 2, "batch_first": True}, (2, 3, 5), (2, 2, 4)),
        ("gru_bidirectional", "gru", {"bidirectional": True}, (3, 2, 5), (2, 2, 4)),
        ("lstm_batch_first_bidirectional", "lstm", {"batch_first": True, "bidirectional": True}, (2, 3, 5),
         (2, 2, 4)),
    ]:
        lstm = kind == "lstm"
        m = (nn.LSTM if lstm else nn.GRU)(5, 4, **kw)
        ins = {"x": torch.randn(*x_shape)}
        if state_shape:
            ins["h0"] = torch.randn(*state_shape)
            if lstm:
                ins["c0"] = torch.randn(*state_shape)
        cfg = {"input_size": 5, "hidden_size": 4, "num_layers": kw.get("num_layers", 1),
               "bidirectional": kw.get("bidirectional", False), "batch_first": kw.get("batch_first", False),
               "bias": kw.get("bias", True)}
        run(name, kind, cfg, m, ins, {}, rnn_call(lstm))
    for kind in ("lstm_cell", "gru_cell"):
        lstm = kind == "lstm_cell"
        m = (nn.LSTMCell if lstm else nn.GRUCell)(5, 4)
        ins = {"x": torch.randn(2, 5), "h0": torch.randn(2, 4)}
        if lstm:
            ins["c0"] = torch.randn(2, 4)
        run(kind, kind, {"input_size": 5, "hidden_size": 4}, m, ins, {}, cell_call(lstm))
    return out


def clip_cases():
    """clip_grad_norm_ (norm types 2, 1, inf, 3; a max_norm above the norm) and
    clip_grad_value_ on three gradients: the total norm and the clipped gradients."""
    torch.manual_seed(5)
    grads = [torch.randn(3, 4), torch.randn(5), torch.randn(2, 2) * 3]
    out = []
    for name, kind, arg, norm_type in [("norm2", "norm", 1.0, 2.0), ("norm1", "norm", 2.0, 1.0),
                                       ("norm_inf", "norm", 0.5, float("inf")), ("norm3", "norm", 1.5, 3.0),
                                       ("norm_not_clipped", "norm", 100.0, 2.0), ("value", "value", 0.7, None)]:
        ps = [torch.zeros_like(g, requires_grad=True) for g in grads]
        for p, g in zip(ps, grads):
            p.grad = g.clone()
        if kind == "norm":
            total = float(torch.nn.utils.clip_grad_norm_(ps, arg, norm_type=norm_type))
        else:
            torch.nn.utils.clip_grad_value_(ps, arg)
            total = None
        out.append({"name": name, "kind": kind, "arg": arg, "norm_type": "inf" if norm_type == float("inf") else norm_type,
                    "grads": [tensor_json(g) for g in grads], "total": total,
                    "clipped": [tensor_json(p.grad) for p in ps]})
    # gradients of three dtypes, bfloat16 first: the norms stack in the dtype
    # they promote to (float64), and each gradient is scaled in its own dtype
    # (bfloat16 through float32); this file's default dtype is float64
    mixed = [(torch.randn(2, 2) * 3).bfloat16(), torch.randn(3, 4, dtype=torch.float32),
             torch.randn(5, dtype=torch.float64)]
    for name, arg, norm_type in [("mixed_norm2", 1.0, 2.0), ("mixed_norm1", 2.0, 1.0),
                                 ("mixed_norm_inf", 0.5, float("inf"))]:
        ps = [torch.zeros_like(g, requires_grad=True) for g in mixed]
        for p, g in zip(ps, mixed):
            p.grad = g.clone()
        total = torch.nn.utils.clip_grad_norm_(ps, arg, norm_type=norm_type)
        dt = lambda t: str(t.dtype).replace("torch.", "")
        out.append({"name": name, "kind": "norm", "arg": arg,
                    "norm_type": "inf" if norm_type == float("inf") else norm_type,
                    "grads": [dict(tensor_json(g), dtype=dt(g)) for g in mixed], "total": float(total),
                    "total_dtype": dt(total), "clipped": [dict(tensor_json(p.grad), dtype=dt(p.grad)) for p in ps]})
    return out


def memory_format_cases():
    """Programs over channels-last tensors, in float32: the values and strides of
    what each returns, and the gradient (values and strides) of each leaf after
    backward of its scalar. tests/tensor/format.rs runs the same programs by name.
    Leaves x, x2 [2, 3, 5, 4], w [4, 3, 3, 3], w3 [3, 3, 3, 3], b [3], g4 and b4
    [4], a [4, 6] are row-major and require grad; "cl" programs also make
    channels-last leaves of their own (their gradients are returned as outputs)."""
    cl = torch.channels_last
    f32 = torch.float32

    def c(t):
        return t.contiguous(memory_format=cl)

    def leaf(t):
        return c(t).detach().requires_grad_(True)

    def p_to_channels_last(L):
        y = c(L["x"]); return [y], (y * L["x2"]).sum(), []

    def p_already_channels_last(L):
        y = c(L["x"]); z = c(y); return [z], (z * L["x2"]).sum(), []

    def p_unary(L):
        xc = c(L["x"]); y, z = xc.relu(), (xc * 0.5).exp(); return [y, z], (y * z).sum(), []

    def p_add_both_channels_last(L):
        y = c(L["x"]) + c(L["x2"]); return [y], (y * y).sum(), []

    def p_add_mixed(L):
        y = c(L["x"]) + L["x2"]; z = L["x2"] * c(L["x"]); return [y, z], (y * z).sum(), []

    def p_channel_bias(L):
        y = c(L["x"]) * L["b"].view(1, 3, 1, 1); z = L["b"].view(1, 3, 1, 1) + c(L["x2"])
        return [y, z], (y * z).sum(), []

    def p_scalar(L):
        y = c(L["x"]) * 2.5 + 1; return [y], (y * y).sum(), []

    def p_transposed(L):
        at = L["a"].t(); y = at.exp(); z = at + at; u = at * L["a"][:, 0]
        return [y, z, u], (y * z + u).sum(), []

    def p_conv_input_channels_last(L):
        y = F.conv2d(c(L["x"]), L["w"], L["g4"], padding=1); return [y], (y * y).sum(), []

    def p_conv_weight_channels_last(L):
        y = F.conv2d(L["x"], c(L["w"]), stride=2); return [y], (y * y).sum(), []

    def p_conv_leaves_channels_last(L):
        xl, wl = leaf(L["x"]), leaf(L["w"]); y = F.conv2d(xl, wl, padding=1)
        (y * y).sum().backward()
        return [y, xl.grad, wl.grad], None, []

    def p_batch_norm_train(L):
        rm, rv = torch.zeros(3, dtype=f32), torch.ones(3, dtype=f32)
        y = F.batch_norm(c(L["x"]), rm, rv, L["b"] + 1, L["b"], training=True, momentum=0.1)
        return [y, rm, rv], (y * L["x2"]).sum(), []

    def p_batch_norm_eval(L):
        rm, rv = L["b"].detach() * 0.1, L["b"].detach().abs() + 0.5
        y = F.batch_norm(c(L["x"]), rm, rv, None, None, training=False)
        return [y], (y * L["x2"]).sum(), []

    def p_max_pool(L):
        y = F.max_pool2d(c(L["x"]), 2, stride=2, padding=1); return [y], (y * y).sum(), []

    def p_avg_pool(L):
        y = F.avg_pool2d(c(L["x"]), 3, stride=1, padding=1, count_include_pad=False)
        return [y], (y * y).sum(), []

    def p_adaptive_avg_pool(L):
        y = F.adaptive_avg_pool2d(c(L["x"]), 1); z = F.adaptive_avg_pool2d(c(L["x"])[:, :, :4], 2)
        return [y, z], (y.sum() + (z * z).sum()), []

    def p_residual_block(L):
        xl, wl = leaf(L["x"]), leaf(L["w3"])
        h = F.conv2d(xl, wl, padding=1)
        h = F.batch_norm(h, None, None, L["b"] + 1, L["b"], training=True)
        h = h + xl
        h = F.relu(h, inplace=True)
        (h * L["x2"]).sum().backward()
        return [h, xl.grad, wl.grad], None, []

    def p_zeros_like(L):
        return [torch.zeros_like(c(L["x"])), torch.full_like(c(L["x"]), 2.0)], None, []

    # copies of layouts that are not dense keep their order (infer_dense_strides)
    def p_preserve_strided(L):
        xs = c(L["x"])[:, :, ::2]
        at = L["a"].t()[:, ::2]
        y = xs.to(torch.float64)
        return [torch.zeros_like(xs), y, torch.ones_like(at), at.exp()], (y * y).sum(), []

    def p_adaptive_uneven(L):
        y = F.adaptive_avg_pool2d(c(L["x"]), (2, 3)); return [y], (y * y).sum(), []

    # an op on a result whose size-1 dims have channels-last strides: row-major out
    def p_after_pooled(L):
        y = F.adaptive_avg_pool2d(c(L["x"]), 1); z = y.relu(); u = y * 2.0
        return [y, z, u], (z * u).sum(), []

    # cat keeps channels-last where every input has it; constant, reflection and
    # replication pads keep the input's format, circular padding does not
    def p_cat_and_pad(L):
        xc = c(L["x"])
        ys = [torch.cat([xc, c(L["x2"])], 1), torch.cat([xc, L["x2"]], 1), torch.cat([xc, xc], 0),
              F.pad(xc, (1, 2, 1, 1)), F.pad(xc, (1, 1, 1, 1), mode="reflect"),
              F.pad(xc, (1, 1, 2, 0), mode="replicate"), F.pad(xc, (1, 1, 0, 0), mode="circular"),
              F.pad(xc, (-1, 1, 0, 0))]
        return ys, sum((y * y).sum() for y in ys), []

    # model.to(memory_format=...) gives a 1 x 1 kernel channels-last's exact strides,
    # and its convolution of a row-major input is channels-last
    def p_module_1x1(L):
        conv = torch.nn.Conv2d(3, 4, 1, bias=False, dtype=f32)
        with torch.no_grad():
            conv.weight.copy_(L["w"][:, :, :1, :1])
        conv = conv.to(memory_format=cl)
        y = conv(L["x"]); (y * y).sum().backward()
        return [conv.weight, y, conv.weight.grad], None, []

    out = []
    torch.manual_seed(11)
    base = {"x": torch.randn(2, 3, 5, 4, dtype=f32), "x2": torch.randn(2, 3, 5, 4, dtype=f32),
            "w": torch.randn(4, 3, 3, 3, dtype=f32) * 0.3, "w3": torch.randn(3, 3, 3, 3, dtype=f32) * 0.3,
            "b": torch.randn(3, dtype=f32), "g4": torch.rand(4, dtype=f32) + 0.5,
            "b4": torch.randn(4, dtype=f32), "a": torch.randn(4, 6, dtype=f32)}
    names = list(base)

    def enc(t):
        t = t.detach()
        return {"shape": list(t.shape), "strides": list(t.stride()), "values": flat(t)}

    for name, f in list(locals().items()):
        if not name.startswith("p_"):
            continue
        L = {k: v.clone().requires_grad_(True) for k, v in base.items()}
        outs, loss, _ = f(L)
        if loss is not None:
            loss.backward()
        out.append({"name": name[2:], "outputs": [enc(o) for o in outs],
                    "grads": [None if L[k].grad is None else enc(L[k].grad) for k in names]})
    return {"leaves": {k: tensor_json(v) for k, v in base.items()}, "order": names, "programs": out}


def layers2_cases():
    """Upsample (F.interpolate's modes), ConvTranspose2d, Conv1d, PReLU and
    InstanceNorm1d/2d, each a module with random parameters, in float64 (and
    float32 where noted): per step (train or eval) the input, output, input
    gradient and the accumulated parameter gradients for the fixed output
    gradient linspace(-1, 1); the state before and after. "errors" holds a
    phrase of PyTorch's message for refused arguments, which ember's message
    contains too (tests/tensor/nn/layers2.rs builds the same calls by name)."""
    torch.manual_seed(5)
    cases, errors = [], []

    def randomize(m):
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.randn(p.shape) * 0.5 + (0.25 if isinstance(m, nn.PReLU) else 0.0))
        return m

    def run(name, kind, config, m, steps, dtype=torch.float64):
        m = randomize(m).to(dtype)
        state = {k: tensor_json(v) for k, v in m.state_dict().items()}
        recs = []
        for train, x in steps:
            m.train(train)
            x = x.to(dtype)
            xg = x.clone().requires_grad_(True)
            y = m(xg, **config.get("call", {}))
            y.backward(torch.linspace(-1, 1, y.numel(), dtype=dtype).reshape(y.shape))
            recs.append({"train": train, "x": tensor_json(x), "y": tensor_json(y), "x_grad": tensor_json(xg.grad),
                         "param_grads": {k: tensor_json(p.grad) for k, p in m.named_parameters()}})
        cases.append({"name": name, "kind": kind, "config": config,
                      "dtype": "float32" if dtype == torch.float32 else "float64", "state": state,
                      "steps": recs, "final_state": {k: tensor_json(v) for k, v in m.state_dict().items()}})

    def up(name, x, dtype=torch.float64, **kw):
        run(name, "upsample", kw, nn.Upsample(**kw), [(True, x)], dtype)

    x4 = torch.randn(2, 3, 5, 7)
    up("nearest_scale2", x4, scale_factor=2.0)
    up("nearest_size", x4, size=(7, 10))
    up("nearest_scale_1_7", x4, scale_factor=1.7)
    up("nearest_scale_1_7_recompute", x4, scale_factor=1.7, recompute_scale_factor=True)
    up("nearest_scales_down_up", x4, scale_factor=(0.6, 1.5))
    up("nearest_2_1", torch.randn(1, 2, 5, 3), scale_factor=2.1)
    up("nearest_3d_size", torch.randn(2, 3, 6), size=11)
    up("nearest_5d", torch.randn(1, 2, 2, 3, 2), scale_factor=(2.0, 1.5, 1.7))
    up("nearest_exact_size", x4, size=(7, 10), mode="nearest-exact")
    up("nearest_exact_scale", x4, scale_factor=1.7, mode="nearest-exact")
    up("nearest_exact_down", x4, size=(3, 4), mode="nearest-exact")
    # (PyTorch's CPU kernels for 3-D and 5-D inputs take no shortcut where the
    # output is twice the input, those for 4-D do; 3-D's backward does, which
    # its forward does not, so no such 3-D or 5-D case here)
    up("nearest_exact_3d", torch.randn(2, 3, 6), size=11, mode="nearest-exact")
    up("nearest_exact_5d", torch.randn(1, 2, 3, 2, 5), scale_factor=(1.7, 2.0, 0.8), mode="nearest-exact")
    up("bilinear_scale2", x4, scale_factor=2.0, mode="bilinear")
    up("bilinear_scale2_align", x4, scale_factor=2.0, mode="bilinear", align_corners=True)
    up("bilinear_size_align", x4, size=(8, 11), mode="bilinear", align_corners=True)
    up("bilinear_scale_1_3", x4, scale_factor=1.3, mode="bilinear")
    up("bilinear_scale_1_3_recompute", x4, scale_factor=1.3, mode="bilinear", recompute_scale_factor=True)
    up("bilinear_down", x4, size=(3, 4), mode="bilinear")
    up("bilinear_keep_one_dim", x4, scale_factor=(1.1, 1.5), mode="bilinear")
    up("bilinear_to_one", x4, size=(1, 9), mode="bilinear", align_corners=True)
    up("linear", torch.randn(2, 3, 6), scale_factor=2.5, mode="linear")
    up("linear_align", torch.randn(2, 3, 6), size=4, mode="linear", align_corners=True)
    up("trilinear", torch.randn(1, 2, 3, 4, 2), scale_factor=(1.5, 2.0, 1.7), mode="trilinear")
    up("bilinear_scale_1_7_f32", x4, torch.float32, scale_factor=1.7, mode="bilinear")
    up("bilinear_align_f32", x4, torch.float32, size=(9, 8), mode="bilinear", align_corners=True)
    up("nearest_scale_1_3_f32", x4, torch.float32, scale_factor=1.3)
    up("nearest_exact_f32", x4, torch.float32, size=(11, 6), mode="nearest-exact")

    def ct(name, cin, cout, k, steps, dtype=torch.float64, call=None, **kw):
        cfg = dict(kw, in_channels=cin, out_channels=cout, kernel_size=list(k) if isinstance(k, tuple) else [k, k])
        if call:
            cfg["call"] = call
        run(name, "conv_transpose2d", cfg, nn.ConvTranspose2d(cin, cout, k, **kw), steps, dtype)

    ct("s2_p1_op1", 3, 4, 3, [(True, torch.randn(2, 3, 4, 5))], stride=2, padding=1, output_padding=1)
    ct("groups_rect_dilation", 4, 6, (3, 2), [(True, torch.randn(2, 4, 3, 4))], stride=(2, 1), padding=(1, 0),
       dilation=(1, 2), groups=2, bias=False)
    ct("op_past_stride", 2, 3, 3, [(True, torch.randn(1, 2, 4, 4))], stride=1, dilation=2, output_padding=1)
    ct("s3_p2_op2_unbatched", 3, 2, 4, [(True, torch.randn(3, 3, 2))], stride=3, padding=2, output_padding=2)
    ct("output_size", 3, 4, 3, [(True, torch.randn(2, 3, 4, 4))], stride=2, padding=1,
       call={"output_size": [8, 7]})
    ct("s2_p1_op1_f32", 3, 4, 3, [(True, torch.randn(2, 3, 4, 5))], torch.float32, stride=2, padding=1,
       output_padding=1)

    def c1(name, cin, cout, k, steps, dtype=torch.float64, **kw):
        cfg = dict(kw, in_channels=cin, out_channels=cout, kernel_size=k)
        run(name, "conv1d", cfg, nn.Conv1d(cin, cout, k, **kw), steps, dtype)

    c1("s2_p1", 3, 4, 3, [(True, torch.randn(2, 3, 9))], stride=2, padding=1)
    c1("groups_dilation", 3, 6, 2, [(True, torch.randn(2, 3, 7))], groups=3, dilation=2, bias=False)
    c1("same_even_kernel", 2, 3, 4, [(True, torch.randn(2, 2, 6))], padding="same", dilation=1)
    c1("unbatched", 2, 3, 3, [(True, torch.randn(2, 8))])
    c1("s2_p1_f32", 3, 4, 3, [(True, torch.randn(2, 3, 9))], torch.float32, stride=2, padding=1)

    def pr(name, n, x, dtype=torch.float64):
        run(name, "prelu", {"num_parameters": n}, nn.PReLU(n), [(True, x)], dtype)

    zeros_in = torch.randn(2, 3, 4)
    zeros_in[0, :, :2] = 0.0
    pr("one", 1, zeros_in)
    pr("per_channel", 3, zeros_in)
    pr("per_channel_4d", 3, torch.randn(2, 3, 2, 2))
    pr("per_channel_f32", 3, zeros_in, torch.float32)

    def inorm(name, d, steps, dtype=torch.float64, **kw):
        make = nn.InstanceNorm1d if d == 1 else nn.InstanceNorm2d
        cfg = dict(kw, dims=d, num_features=steps[0][1].shape[-d - 1])
        run(name, "instance_norm", cfg, make(cfg["num_features"], **kw), steps, dtype)

    inorm("2d_default", 2, [(True, torch.randn(2, 3, 4, 5) * 2 + 1)])
    inorm("2d_affine_track", 2, [(True, torch.randn(2, 3, 4, 5) * 2 + 1), (True, torch.randn(3, 3, 4, 5) - 1),
                                 (False, torch.randn(2, 3, 4, 5))], affine=True, track_running_stats=True)
    inorm("1d_affine", 1, [(True, torch.randn(3, 2, 6))], affine=True)
    inorm("1d_unbatched", 1, [(True, torch.randn(2, 6))], affine=True)
    inorm("1d_track_momentum", 1, [(True, torch.randn(3, 2, 6) * 3), (False, torch.randn(3, 2, 6))],
          track_running_stats=True, momentum=0.3, eps=1e-3)
    inorm("2d_affine_track_f32", 2, [(True, torch.randn(2, 3, 4, 5) * 2 + 1), (False, torch.randn(2, 3, 4, 5))],
          torch.float32, affine=True, track_running_stats=True)

    def err(name, fn, phrase):
        try:
            fn()
        except (RuntimeError, ValueError, NotImplementedError) as e:
            assert phrase in str(e), (name, str(e))
            errors.append({"name": name, "phrase": phrase, "kind": type(e).__name__})
            return
        raise AssertionError(f"{name}: no error")

    x = torch.randn(1, 2, 4, 4)
    err("interp_both", lambda: F.interpolate(x, size=3, scale_factor=2.0), "only one of size or scale_factor")
    err("interp_neither", lambda: F.interpolate(x), "either size or scale_factor should be defined")
    err("interp_align_nearest", lambda: F.interpolate(x, size=3, align_corners=True),
        "align_corners option can only be set with the interpolating modes")
    err("interp_bilinear_3d", lambda: F.interpolate(torch.randn(1, 2, 4), size=3, mode="bilinear"),
        "Got 3D input, but bilinear mode needs 4D input")
    err("interp_rank_2", lambda: F.interpolate(torch.randn(2, 4), size=3), "Only 3D, 4D and 5D input Tensors")
    err("interp_size_dims", lambda: F.interpolate(x, size=(2, 3, 4)),
        "Input and output must have the same number of spatial dimensions")
    err("interp_recompute_size", lambda: F.interpolate(x, size=3, recompute_scale_factor=True),
        "recompute_scale_factor is not meaningful with an explicit size")
    err("interp_zero_output", lambda: F.interpolate(x, scale_factor=0.2),
        "Input and output sizes should be greater than 0")
    w = torch.randn(2, 3, 3, 3)
    err("ct_output_padding", lambda: F.conv_transpose2d(x, w, stride=2, output_padding=2),
        "output padding must be smaller than either stride or dilation")
    err("ct_channels", lambda: F.conv_transpose2d(torch.randn(1, 3, 4, 4), w), "expected input[1, 3, 4, 4] to have 2 channels")
    err("ct_too_small", lambda: F.conv_transpose2d(torch.randn(1, 2, 1, 1), w, padding=3), "Output size is too small")
    err("conv1d_channels", lambda: F.conv1d(torch.randn(1, 3, 8), torch.randn(4, 2, 3)),
        "expected input[1, 3, 8] to have 2 channels, but got 3 channels instead")
    err("conv1d_kernel", lambda: F.conv1d(torch.randn(1, 2, 2), torch.randn(4, 2, 3)),
        "Kernel size can't be greater than actual input size")
    err("conv1d_rank", lambda: F.conv1d(torch.randn(1, 2, 2, 2), torch.randn(4, 2, 3)),
        "Expected 2D (unbatched) or 3D (batched) input to conv1d")
    err("prelu_channels", lambda: F.prelu(torch.randn(2, 4, 3), torch.randn(3)),
        "Mismatch of parameter numbers and input channel size")
    err("instance_norm_one_position", lambda: F.instance_norm(torch.randn(2, 3, 1)),
        "Expected more than 1 spatial element when training")
    err("instance_norm2d_rank", lambda: nn.InstanceNorm2d(3)(torch.randn(2, 3, 4, 4, 4)), "expected 3D or 4D input")
    err("instance_norm_affine_channels", lambda: nn.InstanceNorm1d(3, affine=True)(torch.randn(2, 4, 5)),
        "expected input's size at dim=1 to match num_features")
    return {"cases": cases, "errors": errors}


def rnn_cases():
    """nn.RNN and nn.RNNCell (tanh and relu) with PyTorch's initial parameters, in
    float64 (and float32 where noted): the output, h_n, and the gradients of the
    input, h0 and every parameter for the fixed gradients linspace(-1, 1) of the
    output and linspace(0.5, -0.5) of h_n (a cell's output is its h_n). "errors"
    holds a phrase of PyTorch's message for each refused argument, which ember's
    message contains too (tests/tensor/nn/rnn.rs builds the same calls by name)."""
    torch.manual_seed(7)
    cases, errors = [], []

    def run(name, kind, config, m, x, h0, train=False, dtype=torch.float64):
        m = m.to(dtype)
        m.train(train)
        state = {k: tensor_json(v) for k, v in m.state_dict().items()}
        xg = x.to(dtype).requires_grad_(True)
        hg = h0.to(dtype).requires_grad_(True) if h0 is not None else None
        if kind == "rnn":
            y, hn = m(xg, hg) if hg is not None else m(xg)
        else:
            y = m(xg, hg) if hg is not None else m(xg)
            hn = y
        loss = (y * torch.linspace(-1, 1, y.numel(), dtype=dtype).reshape(y.shape)).sum()
        if kind == "rnn":
            loss = loss + (hn * torch.linspace(0.5, -0.5, hn.numel(), dtype=dtype).reshape(hn.shape)).sum()
        loss.backward()
        cases.append({"name": name, "kind": kind, "config": config, "train": train,
                      "dtype": "float32" if dtype == torch.float32 else "float64", "state": state,
                      "x": tensor_json(x), "h0": tensor_json(h0) if h0 is not None else None,
                      "output": tensor_json(y), "h_n": tensor_json(hn), "x_grad": tensor_json(xg.grad),
                      "h0_grad": tensor_json(hg.grad) if hg is not None else None,
                      "param_grads": {k: tensor_json(p.grad) for k, p in m.named_parameters()}})

    def layer(name, x_shape, h0_shape, dtype=torch.float64, train=False, **kw):
        cfg = {"input_size": 5, "hidden_size": 4, "num_layers": 1, "nonlinearity": "tanh", "bias": True,
               "batch_first": False, "dropout": 0.0, "bidirectional": False}
        cfg.update(kw)
        m = nn.RNN(5, 4, **kw)
        h0 = torch.randn(*h0_shape) if h0_shape else None
        run(name, "rnn", cfg, m, torch.randn(*x_shape), h0, train, dtype)

    layer("tanh", (3, 2, 5), (1, 2, 4))
    layer("relu_zero_state", (3, 2, 5), None, nonlinearity="relu")
    layer("tanh_2layer_bidirectional", (3, 2, 5), (4, 2, 4), num_layers=2, bidirectional=True)
    layer("relu_2layer_batch_first", (2, 3, 5), (2, 2, 4), num_layers=2, batch_first=True, nonlinearity="relu")
    layer("tanh_no_bias_zero_state", (4, 2, 5), None, bias=False)
    layer("relu_bidirectional_batch_first_no_bias", (2, 3, 5), (2, 2, 4), bidirectional=True, batch_first=True,
          bias=False, nonlinearity="relu")
    layer("tanh_2layer_unbatched", (4, 5), (2, 4), num_layers=2)
    layer("relu_bidirectional_unbatched_zero_state", (3, 5), None, bidirectional=True, nonlinearity="relu")
    # dropout between the layers is off in evaluation
    layer("tanh_2layer_dropout_eval", (3, 2, 5), (2, 2, 4), num_layers=2, dropout=0.4)
    layer("relu_3layer_bidirectional_batch_first", (2, 3, 5), (6, 2, 4), num_layers=3, bidirectional=True,
          batch_first=True, nonlinearity="relu")
    layer("tanh_2layer_bidirectional_f32", (3, 2, 5), (4, 2, 4), torch.float32, num_layers=2, bidirectional=True)

    def cell(name, x_shape, h_shape, dtype=torch.float64, **kw):
        cfg = {"input_size": 5, "hidden_size": 4, "nonlinearity": "tanh", "bias": True}
        cfg.update(kw)
        h0 = torch.randn(*h_shape) if h_shape else None
        run(name, "rnn_cell", cfg, nn.RNNCell(5, 4, **kw), torch.randn(*x_shape), h0, dtype=dtype)

    cell("cell_tanh", (3, 5), (3, 4))
    cell("cell_relu_zero_state", (3, 5), None, nonlinearity="relu")
    cell("cell_relu_no_bias", (3, 5), (3, 4), nonlinearity="relu", bias=False)
    cell("cell_tanh_unbatched", (5,), (4,))
    cell("cell_relu_unbatched_zero_state", (5,), None, nonlinearity="relu")
    cell("cell_tanh_f32", (3, 5), (3, 4), torch.float32)

    def err(name, fn, phrase):
        try:
            fn()
        except (RuntimeError, ValueError) as e:
            assert phrase in str(e), (name, str(e))
            errors.append({"name": name, "phrase": phrase, "kind": type(e).__name__})
            return
        raise AssertionError(f"{name}: no error")

    m, c = nn.RNN(3, 4), nn.RNNCell(3, 4)
    err("nonlinearity", lambda: nn.RNN(3, 4, nonlinearity="gelu"),
        "Unknown nonlinearity 'gelu'. Select from 'tanh' or 'relu'.")
    for name, p in (("dropout_above_one", 1.5), ("dropout_negative", -0.1)):
        err(name, lambda: nn.RNN(3, 4, dropout=p), "dropout should be a number in range [0, 1]")
    err("input_size_zero", lambda: nn.RNN(0, 4), "input_size must be greater than zero")
    err("hidden_size_zero", lambda: nn.RNN(3, 0), "hidden_size must be greater than zero")
    err("num_layers_zero", lambda: nn.RNN(3, 4, num_layers=0), "num_layers must be greater than zero")
    err("input_rank", lambda: m(torch.randn(2, 3, 4, 3)), "RNN: Expected input to be 2D or 3D, got 4D tensor instead")
    err("input_size", lambda: m(torch.randn(5, 2, 4)), "input.size(-1) must be equal to input_size. Expected 3, got 4")
    err("h0_layers", lambda: m(torch.randn(5, 2, 3), torch.randn(2, 2, 4)), "Expected hidden size (1, 2, 4), got [2, 2, 4]")
    err("h0_batch", lambda: m(torch.randn(5, 2, 3), torch.randn(1, 3, 4)), "Expected hidden size (1, 2, 4), got [1, 3, 4]")
    err("h0_rank_batched", lambda: m(torch.randn(5, 2, 3), torch.randn(2, 4)),
        "For batched 3-D input, hx should also be 3-D but got 2-D tensor")
    err("h0_rank_unbatched", lambda: m(torch.randn(5, 3), torch.randn(1, 1, 4)),
        "For unbatched 2-D input, hx should also be 2-D but got 3-D tensor")
    err("h0_unbatched_size", lambda: m(torch.randn(5, 3), torch.randn(2, 4)), "Expected hidden size (1, 1, 4), got [2, 1, 4]")
    err("empty_sequence", lambda: m(torch.randn(0, 2, 3)), "Expected sequence length to be larger than 0 in RNN")
    err("input_dtype", lambda: nn.RNN(3, 4).float()(torch.randn(5, 2, 3).double()), "does not match weight dtype")
    err("cell_input_rank", lambda: c(torch.randn(2, 2, 3)), "RNNCell: Expected input to be 1D or 2D, got 3D instead")
    err("cell_input_size", lambda: c(torch.randn(2, 5)), "input has inconsistent input_size: got 5 expected 3")
    err("cell_hx_batch", lambda: c(torch.randn(2, 3), torch.randn(3, 4)), "Input batch size 2 doesn't match hidden0 batch size 3")
    err("cell_hx_size", lambda: c(torch.randn(2, 3), torch.randn(2, 5)), "hidden0 has inconsistent hidden_size: got 5, expected 4")
    err("cell_hx_rank", lambda: c(torch.randn(2, 3), torch.randn(1, 2, 4)), "RNNCell: Expected hidden to be 1D or 2D, got 3D instead")
    err("cell_hx_unbatched_rank", lambda: c(torch.randn(3), torch.randn(2, 4)),
        "Expected 2D hidden0 (batch x hidden_size), but got 3D tensor")
    err("cell_hx_unbatched_size", lambda: c(torch.randn(3), torch.randn(5)), "hidden0 has inconsistent hidden_size: got 5, expected 4")
    return {"cases": cases, "errors": errors}


def transformer2_cases():
    """TransformerDecoder stacks and the full nn.Transformer in float64 with
    random parameters, in evaluation mode: the state (and the state-dict names in
    PyTorch's order), the inputs and masks, the output, and the gradients of every
    input and parameter for the fixed output gradient linspace(-1, 1). "errors"
    holds a phrase of PyTorch's message for refused input, which ember's message
    contains too (tests/tensor/nn/transformer2.rs makes the same calls by name)."""
    torch.manual_seed(41)
    cases, errors = [], []

    def mask_json(t):
        # -inf (a float mask's blocked entries) as the string "-inf": JSON has no infinity
        vals = [float(x) for x in t.reshape(-1).tolist()]
        return {"shape": list(t.shape), "values": [v if v != float("-inf") else "-inf" for v in vals],
                "bool": t.dtype == torch.bool}

    def run(name, kind, config, m, inputs, masks, call, param_grads=True):
        # the parameters from a formula of their place (the state dict's j-th
        # entry, element i), which the test computes too: the file need not
        # hold them
        m = m.double()
        with torch.no_grad():
            for j, p in enumerate(m.state_dict().values()):
                i = torch.arange(p.numel(), dtype=torch.float64)
                p.copy_((0.3 * torch.sin(i * i * 0.013 + i * 0.71 + j * 1.1)).reshape(p.shape))
        m.eval()
        ins = {k: v.clone().requires_grad_(True) for k, v in inputs.items()}
        y = call(m, ins, masks)
        y.backward(torch.linspace(-1, 1, y.numel()).reshape(y.shape))
        cases.append({"name": name, "kind": kind, "config": config,
                      "keys": [[k, list(v.shape)] for k, v in m.state_dict().items()],
                      "inputs": {k: tensor_json(v) for k, v in inputs.items()},
                      "masks": {k: mask_json(v) for k, v in masks.items()},
                      "output": tensor_json(y),
                      "input_grads": {k: tensor_json(v.grad) for k, v in ins.items()},
                      "param_grads": ({k: tensor_json(p.grad) for k, p in m.named_parameters()}
                                      if param_grads else None)})

    def options(cfg):
        return dict(dim_feedforward=cfg["dim_feedforward"], dropout=cfg.get("dropout", 0.0),
                    activation=cfg.get("activation", "relu"), layer_norm_eps=cfg.get("layer_norm_eps", 1e-5),
                    batch_first=cfg["batch_first"], norm_first=cfg.get("norm_first", False),
                    bias=cfg.get("bias", True))

    def seq(bf, n, length):
        return torch.randn(n, length, 8) if bf else torch.randn(length, n, 8)

    def dec_call(hint):
        def call(m, ins, masks):
            return m(ins["tgt"], ins["memory"], tgt_is_causal=hint, **masks)
        return call

    causal = nn.Transformer.generate_square_subsequent_mask(4)
    causal_bool = torch.triu(torch.ones(4, 4, dtype=torch.bool), 1)
    tgt_pad = torch.tensor([[False, False, False, True], [False, False, False, False]])
    mem_pad = torch.tensor([[False, False, True, False, True], [False, False, False, False, False]])
    for name, cfg, masks in [
        ("decoder_norm_causal_padding", {"batch_first": True, "norm": True, "tgt_is_causal": True},
         {"tgt_mask": causal, "tgt_key_padding_mask": tgt_pad, "memory_key_padding_mask": mem_pad}),
        ("decoder_no_norm_seq_first", {"batch_first": False, "norm": False},
         {"tgt_mask": causal_bool, "memory_mask": torch.randn(4, 5)}),
        ("decoder_norm_first_gelu", {"batch_first": True, "norm": True, "norm_first": True, "activation": "gelu"},
         {"tgt_mask": causal, "memory_key_padding_mask": mem_pad}),
        ("decoder_no_bias_eps", {"batch_first": False, "norm": True, "bias": False, "layer_norm_eps": 1e-3}, {}),
    ]:
        cfg = dict(cfg, d_model=8, nhead=2, dim_feedforward=16, num_layers=2)
        layer = nn.TransformerDecoderLayer(8, 2, **options(cfg))
        norm = nn.LayerNorm(8, eps=cfg.get("layer_norm_eps", 1e-5), bias=cfg.get("bias", True)) if cfg["norm"] else None
        m = nn.TransformerDecoder(layer, 2, norm=norm)
        bf = cfg["batch_first"]
        run(name, "decoder", cfg, m, {"tgt": seq(bf, 2, 4), "memory": seq(bf, 2, 5)}, masks,
            dec_call(cfg.get("tgt_is_causal", False)))

    def tr_call(m, ins, masks):
        return m(ins["src"], ins["tgt"], **masks)

    src_pad = torch.tensor([[False, False, False, False, True], [False, True, False, False, False]])
    # (the last two without parameter gradients, to keep the file small)
    for name, cfg, masks, unbatched in [
        ("transformer_seq_first_all_masks", {"batch_first": False},
         {"src_mask": torch.randn(5, 5), "tgt_mask": causal, "memory_mask": torch.randn(4, 5) > 1.0,
          "src_key_padding_mask": src_pad, "tgt_key_padding_mask": tgt_pad, "memory_key_padding_mask": src_pad},
         False),
        ("transformer_batch_first_norm_first_gelu", {"batch_first": True, "norm_first": True, "activation": "gelu"},
         {"tgt_mask": causal}, False),
        ("transformer_no_bias_eps", {"batch_first": True, "bias": False, "layer_norm_eps": 1e-3},
         {"tgt_mask": causal_bool, "src_key_padding_mask": src_pad}, False),
        # dropout set, but the model is in evaluation mode: no dropout anywhere
        ("transformer_eval_drops_nothing", {"batch_first": False, "dropout": 0.5}, {"tgt_mask": causal}, False),
        ("transformer_unbatched", {"batch_first": False}, {"tgt_mask": causal}, True),
    ]:
        cfg = dict(cfg, d_model=8, nhead=2, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=16)
        m = nn.Transformer(8, 2, 2, 2, **options(cfg))
        bf = cfg["batch_first"]
        ins = ({"src": torch.randn(5, 8), "tgt": torch.randn(4, 8)} if unbatched
               else {"src": seq(bf, 2, 5), "tgt": seq(bf, 2, 4)})
        run(name, "transformer", cfg, m, ins, masks, tr_call, param_grads=not name.startswith(("transformer_eval",
                                                                                          "transformer_unb")))

    def err(name, fn, phrase):
        try:
            fn()
        except (RuntimeError, ValueError, AssertionError) as e:
            assert phrase in str(e), (name, str(e))
            errors.append({"name": name, "phrase": phrase, "kind": type(e).__name__})
            return
        raise AssertionError(f"{name}: no error")

    t = nn.Transformer(8, 2, 1, 1, 16, dropout=0.0)
    tb = nn.Transformer(8, 2, 1, 1, 16, dropout=0.0, batch_first=True)
    dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0), 2)
    r = torch.randn
    batch = "the batch number of src and tgt must be equal"
    feature = "the feature number of src and tgt must be equal to d_model"
    causal_hint = "Need attn_mask if specifying the is_causal hint"
    err("batch", lambda: t(r(5, 2, 8), r(4, 3, 8)), batch)
    err("batch_first_batch", lambda: tb(r(2, 5, 8), r(3, 4, 8)), batch)
    err("batched_src_unbatched_tgt", lambda: t(r(5, 2, 8), r(4, 8)), batch)
    err("feature_src", lambda: t(r(5, 2, 6), r(4, 2, 8)), feature)
    err("feature_tgt", lambda: t(r(5, 2, 8), r(4, 2, 6)), feature)
    err("feature_rank_4", lambda: t(r(5, 2, 8, 1), r(4, 2, 8)), feature)
    err("nhead", lambda: nn.Transformer(8, 3, 1, 1, 16), "embed_dim must be divisible by num_heads")
    err("src_causal_without_mask", lambda: t(r(5, 2, 8), r(4, 2, 8), src_is_causal=True), causal_hint)
    err("tgt_causal_without_mask", lambda: t(r(5, 2, 8), r(4, 2, 8), tgt_is_causal=True), causal_hint)
    err("decoder_causal_without_mask", lambda: dec(r(4, 2, 8), r(5, 2, 8), tgt_is_causal=True), causal_hint)
    err("tgt_mask_shape", lambda: t(r(5, 2, 8), r(4, 2, 8), tgt_mask=torch.zeros(3, 3)), "but should be (4, 4)")
    err("memory_mask_shape", lambda: t(r(5, 2, 8), r(4, 2, 8), memory_mask=torch.zeros(4, 4)),
        "but should be (4, 5)")
    return {"cases": cases, "errors": errors}


def resample_cases():
    """F.interpolate's bicubic and area modes and its antialiased bilinear and
    bicubic resizing, in the form of `layers2` (kind "upsample", the call's
    keywords as the config), read by tests/tensor/nn/layers2.rs."""
    torch.manual_seed(6)
    cases, errors = [], []

    class Interpolate(nn.Module):
        def __init__(self, **kw):
            super().__init__()
            self.kw = kw

        def forward(self, x):
            return F.interpolate(x, **self.kw)

    def up(name, x, dtype=torch.float64, **kw):
        x = x.to(dtype)
        xg = x.clone().requires_grad_(True)
        y = Interpolate(**kw)(xg)
        y.backward(torch.linspace(-1, 1, y.numel(), dtype=dtype).reshape(y.shape))
        cases.append({"name": name, "kind": "upsample", "config": kw,
                      "dtype": "float32" if dtype == torch.float32 else "float64", "state": {},
                      "steps": [{"train": True, "x": tensor_json(x), "y": tensor_json(y),
                                 "x_grad": tensor_json(xg.grad), "param_grads": {}}],
                      "final_state": {}})

    x4 = torch.randn(2, 3, 5, 7)
    up("bicubic_size", x4, size=(7, 10), mode="bicubic")
    up("bicubic_align", x4, size=(9, 4), mode="bicubic", align_corners=True)
    up("bicubic_scale_1_7", x4, scale_factor=1.7, mode="bicubic")
    up("bicubic_shrink", x4, scale_factor=0.6, mode="bicubic")
    up("bicubic_f32", x4, size=(11, 6), mode="bicubic", dtype=torch.float32)
    up("area_4d", x4, size=(3, 4), mode="area")
    up("area_4d_grow", x4, size=(8, 7), mode="area")
    up("area_3d", torch.randn(2, 3, 7), size=3, mode="area")
    up("area_3d_grow", torch.randn(2, 3, 7), size=10, mode="area")
    up("area_5d", torch.randn(1, 2, 4, 5, 6), size=(2, 3, 4), mode="area")
    up("area_scale_half", x4, scale_factor=0.5, mode="area", dtype=torch.float32)
    x8 = torch.randn(1, 2, 17, 23)
    up("aa_bilinear_shrink", x8, size=(5, 7), mode="bilinear", antialias=True)
    up("aa_bilinear_mixed", x8, size=(30, 9), mode="bilinear", antialias=True)
    up("aa_bilinear_align", x8, size=(6, 8), mode="bilinear", antialias=True, align_corners=True)
    up("aa_bilinear_scale", x8, scale_factor=0.3, mode="bilinear", antialias=True)
    up("aa_bicubic_shrink", x8, size=(5, 7), mode="bicubic", antialias=True)
    up("aa_bicubic_mixed", x8, size=(8, 40), mode="bicubic", antialias=True)
    up("aa_bilinear_f32", x8, size=(4, 6), mode="bilinear", antialias=True, dtype=torch.float32)
    up("aa_bicubic_f32", x8, size=(7, 5), mode="bicubic", antialias=True, dtype=torch.float32)

    # uint8 images (PyTorch's CPU kernels: fixed-point weights, rounded to uint8
    # after each dim); 3 channels take its vectorised path where the CPU has one
    # (each image stored once, in "images"; a case names its image)
    uint8, images = [], {}

    def up8(name, image, **kw):
        y = F.interpolate(images[image], **kw)
        uint8.append({"name": name, "image": image, "config": kw, "y": tensor_json(y)})

    images["rgb"] = torch.randint(0, 256, (2, 3, 13, 17), dtype=torch.uint8)
    images["five"] = torch.randint(0, 256, (1, 5, 9, 11), dtype=torch.uint8)
    images["row"] = torch.randint(0, 256, (1, 1, 1, 9), dtype=torch.uint8)
    for mode in ("bilinear", "bicubic"):
        for aa in (False, True):
            tag = mode + ("_aa" if aa else "")
            up8(tag + "_shrink", "rgb", size=(5, 7), mode=mode, antialias=aa)
            up8(tag + "_grow", "rgb", size=(16, 21), mode=mode, antialias=aa)
            up8(tag + "_mixed_5ch", "five", size=(4, 19), mode=mode, antialias=aa)
            up8(tag + "_align", "rgb", size=(6, 25), mode=mode, antialias=aa, align_corners=True)
            up8(tag + "_scale", "five", scale_factor=0.7, mode=mode, antialias=aa)
    up8("bilinear_one_dim", "rgb", size=(13, 8), mode="bilinear")
    up8("bicubic_one_row", "row", size=(3, 4), mode="bicubic")

    def err(name, fn, phrase):
        try:
            fn()
        except (RuntimeError, ValueError, NotImplementedError) as e:
            assert phrase in str(e), (name, str(e))
            errors.append({"name": name, "phrase": phrase})
        else:
            raise AssertionError(name + " was accepted")

    err("bicubic_3d", lambda: F.interpolate(torch.randn(1, 2, 5), size=3, mode="bicubic"),
        "Only 3D, 4D and 5D input Tensors supported (got 3D)")
    err("area_align", lambda: F.interpolate(x4, size=3, mode="area", align_corners=False),
        "align_corners option can only be set with the interpolating modes")
    err("antialias_nearest", lambda: F.interpolate(x4, size=3, antialias=True),
        "Anti-alias option is restricted to bilinear")
    err("antialias_linear_3d", lambda: F.interpolate(torch.randn(1, 2, 5), size=3, mode="linear", antialias=True),
        "Anti-alias option is restricted to bilinear")
    err("area_int", lambda: F.interpolate(torch.zeros(1, 2, 5, 4, dtype=torch.int64), size=3, mode="area"),
        "\"adaptive_avg_pool2d\" not implemented for 'Long'")
    return {"cases": cases, "errors": errors, "uint8": uint8,
            "images": {k: tensor_json(v) for k, v in images.items()},
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def embedding_bag_cases():
    """F.embedding_bag in its three modes: 1-D inputs cut by offsets (empty bags,
    include_last_offset with entries after the end), 2-D inputs, padding_idx,
    per_sample_weights (sum), float64 and float32: the output and the gradients
    of the weight and per-sample weights for the output gradient
    linspace(-1, 1); PyTorch's refusals (tests/tensor/nn/bags.rs)."""
    torch.manual_seed(7)
    cases, errors = [], []

    def bag(name, input, offsets=None, dtype=torch.float64, psw=False, **kw):
        w = (torch.randn(10, 3) * 2).to(dtype).requires_grad_(True)
        p = (torch.rand(input.shape) + 0.5).to(dtype).requires_grad_(True) if psw else None
        y = F.embedding_bag(input, w, offsets, per_sample_weights=p, **kw)
        y.backward(torch.linspace(-1, 1, y.numel(), dtype=dtype).reshape(y.shape))
        cases.append({"name": name, "config": kw, "dtype": str(dtype).replace("torch.", ""),
                      "input": tensor_json(input), "offsets": None if offsets is None else tensor_json(offsets),
                      "weight": tensor_json(w), "psw": None if p is None else tensor_json(p),
                      "y": tensor_json(y), "weight_grad": tensor_json(w.grad),
                      "psw_grad": None if p is None else tensor_json(p.grad)})

    i = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0, 7])
    o = torch.tensor([0, 3, 3, 7])
    for mode in ("sum", "mean", "max"):
        bag(mode + "_offsets", i, o, mode=mode)
        bag(mode + "_2d", i[:8].reshape(2, 4), mode=mode)
        bag(mode + "_padding", i, o, mode=mode, padding_idx=4)
        bag(mode + "_last_offset", i, torch.tensor([0, 2, 2, 10]), mode=mode, include_last_offset=True)
        bag(mode + "_f32", i, o, dtype=torch.float32, mode=mode)
        bag(mode + "_trailing_empty", i, torch.tensor([0, 6, 10, 10]), mode=mode)
    bag("sum_weighted", i, o, psw=True, mode="sum")
    bag("sum_weighted_padding", i, o, psw=True, mode="sum", padding_idx=-1)
    bag("sum_weighted_2d", i.reshape(2, 5), psw=True, mode="sum")
    bag("max_ties", torch.tensor([3, 3, 5, 5, 5]), torch.tensor([0, 2]), mode="max")
    bag("mean_only_padding", torch.tensor([4, 4, 1]), torch.tensor([0, 2]), mode="mean", padding_idx=4)
    bag("max_only_padding", torch.tensor([4, 4, 1]), torch.tensor([0, 2]), mode="max", padding_idx=4)

    def err(name, fn, phrase):
        try:
            fn()
        except (RuntimeError, ValueError, NotImplementedError) as e:
            assert phrase in str(e), (name, str(e))
            errors.append({"name": name, "phrase": phrase})
        else:
            raise AssertionError(name + " was accepted")

    w = torch.randn(10, 3)
    err("no_offsets", lambda: F.embedding_bag(i, w), "offsets has to be a 1D Tensor but got None")
    err("offsets_2d", lambda: F.embedding_bag(i.reshape(2, 5), w, o), "if input is 2D, then offsets has to be None")
    err("offsets_rank", lambda: F.embedding_bag(i, w, o.reshape(2, 2)), "offsets has to be a 1D Tensor")
    err("first_offset", lambda: F.embedding_bag(i, w, torch.tensor([1, 3])), "offsets[0] has to be 0")
    err("last_offset", lambda: F.embedding_bag(i, w, torch.tensor([0, 11])),
        "offsets[-1] can not be greater than input's length 10")
    err("psw_mean", lambda: F.embedding_bag(i, w, o, per_sample_weights=torch.ones(10)),
        "per_sample_weights is only supported for mode='sum' (got mode='mean')")
    err("psw_shape", lambda: F.embedding_bag(i, w, o, mode="sum", per_sample_weights=torch.ones(9)),
        "then it must have the same shape as the input")
    err("weight_rank", lambda: F.embedding_bag(i, w.reshape(5, 2, 3), o), "weight has to be a 2D Tensor")
    err("input_rank", lambda: F.embedding_bag(i.reshape(1, 2, 5), w), "input has to be 1D or 2D Tensor")
    err("padding_range", lambda: F.embedding_bag(i, w, o, padding_idx=12),
        "padding_idx must be within the number of embeddings, -10 through 9, but got 12")
    err("float_indices", lambda: F.embedding_bag(i.float(), w, o), "to have one of the following scalar types: Long")
    return {"cases": cases, "errors": errors}


def layers4_cases():
    """Pixel and channel shuffle, 1-D max and average pooling, adaptive average
    and max pooling (1-D and 2-D, with their indices), max_pool2d's indices,
    max_unpool2d, unfold and fold, in float64 (and float32 where noted): per
    case the call's config, the input, output (and indices), and the input
    gradient for the fixed output gradient linspace(-1, 1). Some inputs are
    small integers, so that windows hold ties (PyTorch keeps the first
    maximum). "errors" holds a phrase of PyTorch's message for refused
    arguments, which ember's contains (tests/tensor/nn/layers4.rs builds the
    same calls by name)."""
    torch.manual_seed(7)
    cases, errors = [], []

    def run(name, kind, config, fn, x, dtype=torch.float64, extra=None):
        x = x.to(dtype)
        xg = x.clone().requires_grad_(True)
        out = fn(xg)
        y, idx = out if isinstance(out, tuple) else (out, None)
        y.backward(torch.linspace(-1, 1, y.numel(), dtype=dtype).reshape(y.shape))
        case = {"name": name, "kind": kind, "config": config,
                "dtype": "float32" if dtype == torch.float32 else "float64",
                "x": tensor_json(x), "y": tensor_json(y), "x_grad": tensor_json(xg.grad)}
        if idx is not None:
            case["indices"] = {"shape": list(idx.shape), "values": [int(v) for v in idx.reshape(-1).tolist()]}
        case.update(extra or {})
        cases.append(case)

    ties = lambda *s: torch.randint(-3, 4, s).double()
    # shuffles
    for name, x, r in [("ps_4d", torch.randn(2, 8, 3, 2), 2), ("ps_3d", torch.randn(9, 2, 3), 3),
                       ("ps_5d", torch.randn(2, 2, 4, 2, 3), 2)]:
        run(name, "pixel_shuffle", {"factor": r}, lambda t, r=r: F.pixel_shuffle(t, r), x)
    for name, x, r in [("pu_4d", torch.randn(2, 2, 4, 6), 2), ("pu_3d", torch.randn(1, 6, 3), 3),
                       ("pu_5d", torch.randn(2, 1, 3, 4, 2), 2)]:
        run(name, "pixel_unshuffle", {"factor": r}, lambda t, r=r: F.pixel_unshuffle(t, r), x)
    for name, x, g in [("cs_4d", torch.randn(2, 6, 2, 2), 3), ("cs_3d", torch.randn(2, 8, 3), 2),
                       ("cs_5d", torch.randn(1, 4, 2, 3, 2), 4)]:
        run(name, "channel_shuffle", {"groups": g}, lambda t, g=g: nn.ChannelShuffle(g)(t), x)
    run("ps_f32", "pixel_shuffle", {"factor": 2}, lambda t: nn.PixelShuffle(2)(t), torch.randn(2, 8, 3, 2),
        torch.float32)

    # 1-D pools
    def mp1(name, x, dtype=torch.float64, indices=False, **kw):
        cfg = dict(kw, return_indices=indices)
        run(name, "max_pool1d", cfg, lambda t: nn.MaxPool1d(**kw, return_indices=indices)(t), x, dtype)

    mp1("k2", torch.randn(2, 3, 9), kernel_size=2)
    mp1("k3_s2_p1", torch.randn(2, 3, 10), kernel_size=3, stride=2, padding=1)
    mp1("k3_d2_ceil", torch.randn(2, 2, 11), kernel_size=3, stride=2, dilation=2, ceil_mode=True)
    mp1("k2_s1_ties_indices", ties(2, 3, 8), indices=True, kernel_size=2, stride=1)
    mp1("k4_s3_p2_ceil_unbatched", torch.randn(3, 10), indices=True, kernel_size=4, stride=3, padding=2,
        ceil_mode=True)
    mp1("k3_f32", torch.randn(2, 3, 9), torch.float32, kernel_size=3, stride=2)

    def ap1(name, x, dtype=torch.float64, **kw):
        run(name, "avg_pool1d", kw, lambda t: nn.AvgPool1d(**kw)(t), x, dtype)

    ap1("k2", torch.randn(2, 3, 9), kernel_size=2)
    ap1("k3_s2_p1", torch.randn(2, 3, 10), kernel_size=3, stride=2, padding=1)
    ap1("k3_s2_p1_exclude_pad", torch.randn(2, 3, 10), kernel_size=3, stride=2, padding=1, count_include_pad=False)
    ap1("k4_s3_p2_ceil", torch.randn(2, 2, 10), kernel_size=4, stride=3, padding=2, ceil_mode=True)
    ap1("k4_s3_p2_ceil_exclude_unbatched", torch.randn(2, 10), kernel_size=4, stride=3, padding=2, ceil_mode=True,
        count_include_pad=False)
    ap1("k3_f32", torch.randn(2, 3, 9), torch.float32, kernel_size=3)

    # adaptive pools
    for name, x, o in [("to_3", torch.randn(2, 3, 10), 3), ("to_4_of_7", torch.randn(2, 7), 4),
                       ("grow", torch.randn(1, 2, 3), 5), ("to_1", torch.randn(2, 3, 6), 1)]:
        run(name, "adaptive_avg_pool1d", {"output": o}, lambda t, o=o: nn.AdaptiveAvgPool1d(o)(t), x)
        run(name, "adaptive_max_pool1d", {"output": o},
            lambda t, o=o: nn.AdaptiveMaxPool1d(o, return_indices=True)(t), x)
    run("ties", "adaptive_max_pool1d", {"output": 4}, lambda t: F.adaptive_max_pool1d(t, 4, True), ties(2, 3, 11))
    for name, x, o in [("to_3x2", torch.randn(2, 3, 7, 5), (3, 2)), ("to_4x4_of_6x5", torch.randn(3, 6, 5), (4, 4)),
                       ("grow", torch.randn(1, 2, 3, 2), (5, 3)), ("to_1x1", torch.randn(2, 3, 4, 5), (1, 1)),
                       ("divides", torch.randn(2, 2, 6, 4), (3, 2))]:
        run(name, "adaptive_avg_pool2d", {"output": list(o)}, lambda t, o=o: F.adaptive_avg_pool2d(t, o), x)
        run(name, "adaptive_max_pool2d", {"output": list(o)},
            lambda t, o=o: nn.AdaptiveMaxPool2d(o, return_indices=True)(t), x)
    run("ties", "adaptive_max_pool2d", {"output": [3, 4]}, lambda t: F.adaptive_max_pool2d(t, (3, 4), True),
        ties(2, 2, 7, 9))
    run("ties_f32", "adaptive_max_pool2d", {"output": [2, 3]}, lambda t: F.adaptive_max_pool2d(t, (2, 3), True),
        ties(2, 2, 5, 7), torch.float32)
    run("f32", "adaptive_avg_pool1d", {"output": 4}, lambda t: F.adaptive_avg_pool1d(t, 4), torch.randn(2, 3, 9),
        torch.float32)

    # max_pool2d's indices, and max_unpool2d of them
    def mp2(name, x, dtype=torch.float64, **kw):
        run(name, "max_pool2d_indices", kw, lambda t: F.max_pool2d(t, **kw, return_indices=True), x, dtype)

    mp2("k2", torch.randn(2, 3, 6, 5), kernel_size=2)
    mp2("k3_s2_p1_ceil", torch.randn(1, 2, 7, 8), kernel_size=3, stride=2, padding=1, ceil_mode=True)
    mp2("k2_s1_ties", ties(2, 2, 4, 5), kernel_size=2, stride=1)
    mp2("k2_d2_unbatched", torch.randn(2, 7, 6), kernel_size=2, dilation=2)
    mp2("k2_f32", torch.randn(2, 3, 6, 5), torch.float32, kernel_size=2)

    def unp(name, src, dtype=torch.float64, output_size=None, **kw):
        pool_kw = {k: v for k, v in kw.items()}
        _, idx = F.max_pool2d(src, **pool_kw, return_indices=True)
        x = torch.randn(idx.shape)
        cfg = dict(kw, output_size=output_size)
        run(name, "max_unpool2d", cfg, lambda t: F.max_unpool2d(t, idx, output_size=output_size, **kw), x, dtype,
            {"unpool_indices": {"shape": list(idx.shape), "values": [int(v) for v in idx.reshape(-1).tolist()]}})

    unp("k2", torch.randn(2, 3, 4, 6), kernel_size=2)
    unp("k2_output_size4", torch.randn(2, 3, 5, 5), kernel_size=2, output_size=[2, 3, 5, 5])
    unp("k3_s2_p1", torch.randn(1, 2, 7, 5), kernel_size=3, stride=2, padding=1)
    unp("k2_s1_overlapping", ties(2, 2, 4, 5), kernel_size=2, stride=1)
    unp("unbatched_output_size", torch.randn(3, 4, 4), kernel_size=2, output_size=[5, 5])
    unp("k2_f32", torch.randn(2, 3, 4, 6), torch.float32, kernel_size=2)

    # unfold and fold
    def unf(name, x, dtype=torch.float64, **kw):
        run(name, "unfold", kw, lambda t: nn.Unfold(**kw)(t), x, dtype)

    unf("k2", torch.randn(2, 3, 4, 5), kernel_size=2)
    unf("k3_p1_s2", torch.randn(2, 2, 5, 6), kernel_size=3, padding=1, stride=2)
    unf("rect_dilation", torch.randn(1, 2, 7, 6), kernel_size=[2, 3], dilation=[2, 1], padding=[1, 0],
        stride=[1, 2])
    unf("unbatched", torch.randn(3, 4, 4), kernel_size=2, stride=2)
    unf("k2_f32", torch.randn(2, 3, 4, 5), torch.float32, kernel_size=2, padding=1)

    def fld(name, output_size, x, dtype=torch.float64, **kw):
        run(name, "fold", dict(kw, output_size=output_size), lambda t: nn.Fold(output_size, **kw)(t), x, dtype)

    fld("k2", [4, 5], torch.randn(2, 12, 12), kernel_size=2)
    fld("k3_p1_s2", [5, 6], torch.randn(2, 18, 9), kernel_size=3, padding=1, stride=2)
    fld("rect_dilation", [7, 6], torch.randn(1, 12, 14), kernel_size=[2, 3], dilation=[2, 1], padding=[1, 0],
        stride=[1, 2])
    fld("unbatched", [4, 4], torch.randn(12, 4), kernel_size=2, stride=2)
    fld("k2_f32", [4, 5], torch.randn(2, 12, 30), torch.float32, kernel_size=2, padding=1)

    def err(name, fn, phrase):
        try:
            fn()
        except (RuntimeError, ValueError, NotImplementedError) as e:
            assert phrase in str(e), (name, str(e))
            errors.append({"name": name, "phrase": phrase})
        else:
            raise AssertionError(name + " was accepted")

    x4 = torch.randn(1, 6, 3, 3)
    err("ps_rank", lambda: F.pixel_shuffle(torch.randn(4, 4), 2),
        "pixel_shuffle expects input to have at least 3 dimensions, but got input with 2 dimension(s)")
    err("ps_channels", lambda: F.pixel_shuffle(x4, 2),
        "pixel_shuffle expects its input's 'channel' dimension to be divisible by the square of upscale_factor, "
        "but input.size(-3)=6 is not divisible by 4")
    err("ps_zero", lambda: F.pixel_shuffle(x4, 0), "pixel_shuffle expects a positive upscale_factor, but got 0")
    err("pu_height", lambda: F.pixel_unshuffle(torch.randn(1, 1, 3, 4), 2),
        "pixel_unshuffle expects height to be divisible by downscale_factor, but input.size(-2)=3 is not divisible by 2")
    err("pu_width", lambda: F.pixel_unshuffle(torch.randn(1, 1, 4, 3), 2),
        "pixel_unshuffle expects width to be divisible by downscale_factor, but input.size(-1)=3 is not divisible by 2")
    err("pu_zero", lambda: F.pixel_unshuffle(x4, 0), "pixel_unshuffle expects a positive downscale_factor, but got 0")
    err("cs_rank", lambda: F.channel_shuffle(torch.randn(4, 4), 2),
        "channel_shuffle expects input with > 2 dims, but got input with sizes [4, 4]")
    err("cs_groups", lambda: F.channel_shuffle(x4, 4),
        "Number of channels must be divisible by groups. Got 6 channels and 4 groups.")
    err("cs_zero", lambda: F.channel_shuffle(x4, 0), "Number of groups to divide channels in must be positive")
    x3 = torch.randn(1, 2, 8)
    err("mp1_rank", lambda: F.max_pool1d(torch.randn(1, 2, 3, 4), 2),
        "max_pool1d: Expected 2D or 3D (batch mode) tensor with optional 0 dim batch size for input, "
        "but got:[1, 2, 3, 4]")
    err("mp1_empty", lambda: F.max_pool1d(torch.randn(1, 0, 5), 2), "but got:[1, 0, 5]")
    err("mp1_padding", lambda: F.max_pool1d(x3, 3, padding=2),
        "max_pool1d() padding should be at most half of kernel size, but got padding=2 and kernel_size=3")
    err("mp1_kernel", lambda: F.max_pool1d(x3, 0), "max_pool1d() kernel_size must be greater than zero, but got 0")
    err("mp1_stride", lambda: F.max_pool1d(x3, 2, stride=0), "max_pool1d() stride must be greater than zero")
    err("mp1_dilation", lambda: F.max_pool1d(x3, 2, dilation=0), "max_pool1d() dilation must be greater than zero")
    err("mp1_small", lambda: F.max_pool1d(torch.randn(1, 2, 2), 3), "max_pool1d() Invalid computed output size: 0")
    err("mp1_int", lambda: F.max_pool1d(torch.zeros(1, 2, 5, dtype=torch.int64), 2),
        "\"max_pool1d_impl\" not implemented for 'Long'")
    err("ap1_rank", lambda: F.avg_pool1d(torch.randn(1, 2, 3, 4), 2),
        "Expected 2 to 3 dimensions, but got 4-dimensional tensor for argument #1 'self' (while checking arguments "
        "for avg_pool1d)")
    err("ap1_padding", lambda: F.avg_pool1d(x3, 3, padding=2), "pad should be at most half of effective kernel size")
    err("ap1_stride", lambda: F.avg_pool1d(x3, 2, stride=0), "stride should not be zero")
    err("ap1_small", lambda: F.avg_pool1d(torch.randn(1, 2, 2), 3),
        "Given input size: (2x1x2). Calculated output size: (2x1x0). Output size is too small")
    err("ap1_empty", lambda: F.avg_pool1d(torch.randn(1, 0, 5), 2),
        "Expected 3D or 4D (batch mode) tensor with optional 0 dim batch size for input, but got:[1, 0, 1, 5]")
    err("aap1_rank", lambda: F.adaptive_avg_pool1d(torch.randn(4), 2),
        "Expected 2 to 3 dimensions, but got 1-dimensional tensor for argument #1 'self' (while checking arguments "
        "for adaptive_avg_pool1d)")
    err("aap1_empty", lambda: F.adaptive_avg_pool1d(torch.randn(1, 2, 0), 2),
        "adaptive_avg_pool2d(): Expected input to have non-zero size for non-batch dimensions, but input has sizes "
        "[1, 2, 1, 0] with dimension 3 being empty")
    err("aap1_int", lambda: F.adaptive_avg_pool1d(torch.zeros(1, 2, 4, dtype=torch.int64), 2),
        "\"adaptive_avg_pool2d\" not implemented for 'Long'")
    err("aap2_rank", lambda: F.adaptive_avg_pool2d(torch.randn(2, 4), 2),
        "adaptive_avg_pool2d(): Expected 3D or 4D tensor, but got [2, 4]")
    err("aap2_empty", lambda: F.adaptive_avg_pool2d(torch.randn(1, 2, 0, 4), 2),
        "but input has sizes [1, 2, 0, 4] with dimension 2 being empty")
    err("amp1_rank", lambda: F.adaptive_max_pool1d(torch.randn(1, 2, 3, 4), 2),
        "Expected 2 to 3 dimensions, but got 4-dimensional tensor for argument #1 'self' (while checking arguments "
        "for adaptive_max_pool1d)")
    err("amp1_empty", lambda: F.adaptive_max_pool1d(torch.randn(1, 0, 4), 2),
        "adaptive_max_pool1d(): Expected input to have non-zero size for non-batch dimensions, but input has sizes "
        "[1, 0, 4] with dimension 1 being empty")
    err("amp1_int", lambda: F.adaptive_max_pool1d(torch.zeros(1, 2, 4, dtype=torch.int64), 2),
        "\"adaptive_max_pool2d\" not implemented for 'Long'")
    err("amp2_rank", lambda: F.adaptive_max_pool2d(torch.randn(1, 2, 3, 4, 4), 2),
        "adaptive_max_pool2d(): Expected 3D or 4D tensor, but got: [1, 2, 3, 4, 4]")
    err("amp2_empty", lambda: F.adaptive_max_pool2d(torch.randn(1, 2, 0, 4), 2),
        "adaptive_max_pool2d(): Expected input to have non-zero size for non-batch dimensions, but input has sizes "
        "[1, 2, 0, 4] with dimension 2 being empty")
    err("amp2_u8", lambda: F.adaptive_max_pool2d(torch.zeros(1, 2, 4, 4, dtype=torch.uint8), 2),
        "\"adaptive_max_pool2d\" not implemented for 'Byte'")
    v, i = F.max_pool2d(torch.randn(1, 2, 4, 4), 2, return_indices=True)
    err("unpool_output_size", lambda: F.max_unpool2d(v, i, 2, output_size=(7, 5)),
        "invalid output_size \"(7, 5)\" (dim 0 must be between 2 and 6)")
    err("unpool_output_size_len", lambda: F.max_unpool2d(v, i, 2, output_size=(1, 5, 5)),
        "output_size should be a sequence containing 2 or 4 elements, but it has a length of '3'")
    err("unpool_negative", lambda: F.max_unpool2d(v, i, 2, padding=5),
        "max_unpooling: output_size must contain non-negative spatial dimensions, but got output_size[0]=-6")
    err("unpool_index_dtype", lambda: F.max_unpool2d(v, i.double(), 2),
        "elements in indices should be type int64 but got: Double")
    err("unpool_rank", lambda: F.max_unpool2d(v[0, 0], i[0, 0], 2),
        "Input to max_unpooling2d should be a 3d or 4d Tensor, but got a tensor with 2 dimensions.")
    err("unpool_index_shape", lambda: F.max_unpool2d(v, i[:, :1], 2),
        "Expected shape of indices to be same as that of the input tensor ([1, 2, 2, 2]) but got indices tensor "
        "with shape: [1, 1, 2, 2]")
    err("unpool_empty", lambda: F.max_unpool2d(torch.zeros(1, 0, 2, 2), torch.zeros(1, 0, 2, 2, dtype=torch.long), 2),
        "Expected input to have non-zero size for non-batch dimensions, but input has sizes [1, 0, 2, 2] with "
        "dimension 1 being empty")
    err("unpool_int", lambda: F.max_unpool2d(v.long(), i, 2), "\"max_unpool2d\" not implemented for 'Long'")
    err("unpool_index_range", lambda: F.max_unpool2d(v, i * 0 + 100, 2),
        "Found an invalid max index: 100 (output volumes are of size 4x4)")
    x4 = torch.randn(2, 3, 5, 5)
    err("unfold_rank", lambda: F.unfold(torch.randn(1, 3, 5, 5, 5), 2),
        "Expected 3D or 4D (batch mode) tensor with possibly 0 batch size and other non-zero dimensions for input, "
        "but got: [1, 3, 5, 5, 5]")
    err("unfold_empty", lambda: F.unfold(torch.randn(2, 0, 5, 5), 2), "but got: [2, 0, 5, 5]")
    err("unfold_kernel", lambda: F.unfold(x4, 0),
        "kernel size should be greater than zero, but got kernel_height: 0 kernel_width: 0")
    err("unfold_stride", lambda: F.unfold(x4, 2, stride=0),
        "stride should be greater than zero, but got stride_height: 0 stride_width: 0")
    err("unfold_dilation", lambda: F.unfold(x4, 2, dilation=0),
        "dilation should be greater than zero, but got dilation_height: 0 dilation_width: 0")
    err("unfold_too_big", lambda: F.unfold(x4, 3, dilation=3),
        "Given input with spatial size (5, 5), kernel_size=(3, 3), dilation=(3, 3), padding=(0, 0), calculated "
        "shape of the array of sliding blocks as (-1, -1), but its components must be at least one.")
    err("unfold_int", lambda: F.unfold(torch.zeros(2, 3, 5, 5, dtype=torch.int64), 2),
        "\"im2col_out_cpu\" not implemented for 'Long'")
    c = torch.randn(2, 12, 16)
    err("fold_rank", lambda: F.fold(torch.randn(1, 12, 16, 1), (5, 5), 2),
        "Expected 2D or 3D (batch mode) tensor for input with possibly 0 batch size and non-zero dimensions for "
        "input, but got: [1, 12, 16, 1]")
    err("fold_empty", lambda: F.fold(torch.randn(2, 12, 0), (5, 5), 2), "but got: [2, 12, 0]")
    err("fold_channels", lambda: F.fold(torch.randn(2, 13, 16), (5, 5), 2),
        "Expected size of input's dimension 1 to be divisible by the product of kernel_size, but got "
        "input.size(1)=13 and kernel_size=(2, 2).")
    err("fold_blocks", lambda: F.fold(torch.randn(2, 12, 15), (5, 5), 2),
        "Given output_size=(5, 5), kernel_size=(2, 2), dilation=(1, 1), padding=(0, 0), stride=(1, 1), expected "
        "size of input's dimension 2 to match the calculated number of sliding blocks 4 * 4 = 16, but got "
        "input.size(2)=15.")
    err("fold_kernel", lambda: F.fold(c, (5, 5), 0), "kernel size should be greater than zero")
    err("fold_int", lambda: F.fold(torch.zeros(2, 12, 16, dtype=torch.int64), (5, 5), 2),
        "\"col2im_out_cpu\" not implemented for 'Long'")

    # bool unfold/fold (PyTorch's CPU kernels take them; fold's sums are ORs)
    b = torch.rand(2, 2, 4, 5) > 0.6
    bools = {"x": tensor_json(b), "unfold": tensor_json(F.unfold(b, 2, padding=1)),
             "fold": tensor_json(F.fold(F.unfold(b, 2), (4, 5), 2))}
    return {"cases": cases, "errors": errors, "bool": bools}


def layers3_cases():
    """The pointwise activations LogSigmoid, Softsign, Tanhshrink, Softshrink,
    Hardshrink, Threshold, GLU, Softmin and LogSoftmax, Unflatten, and the
    padding modules (Zero/Constant/Reflection/Replication/CircularPad1d-3d):
    per case the module (its name and keyword arguments), the input, output
    and input gradient for the output gradient linspace(-1, 1), in float64,
    float32 and (no gradient) integer dtypes. "dropout" holds, per channel
    dropout call, the mask shape PyTorch draws (the dims along which its output
    varies over many draws); "errors" a phrase of PyTorch's message for refused
    calls (tests/tensor/nn/layers3.rs builds the same calls by name)."""
    torch.manual_seed(7)
    cases, errors, dropout = [], [], []

    def run(name, module, args, x, dtype=torch.float64):
        m = getattr(nn, module)(**args)
        x = x.to(dtype)
        rec = {"name": name, "module": module, "args": args, "dtype": str(dtype).replace("torch.", ""),
               "x": tensor_json(x)}
        if dtype.is_floating_point:
            xg = x.clone().requires_grad_(True)
            y = m(xg)
            y.backward(torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape))
            rec["x_grad"] = tensor_json(xg.grad)
        else:
            # (the dtype of an integer input's float result is PyTorch's default)
            torch.set_default_dtype(torch.float32)
            try:
                y = m(x)
            finally:
                torch.set_default_dtype(torch.float64)
        rec["y"] = tensor_json(y)
        rec["y_dtype"] = str(y.dtype).replace("torch.", "")
        cases.append(rec)

    wide = torch.tensor([-800.0, -30.0, -20.01, -3.0, -1.0, 0.0, 0.5, 1.0, 20.01, 30.0, 800.0])
    ties = torch.tensor([[-1.2, -0.5, 0.0, 0.5, 1.2, 0.1], [-0.1, 0.3, -2.0, 2.0, 0.7, -0.7]])
    ties = torch.cat([ties, torch.randn(2, 6) * 1.5])
    run("logsigmoid_wide", "LogSigmoid", {}, wide)
    run("logsigmoid_wide_f32", "LogSigmoid", {}, wide, torch.float32)
    run("logsigmoid_randn", "LogSigmoid", {}, torch.randn(3, 5) * 4)
    run("softsign", "Softsign", {}, torch.cat([wide, torch.randn(5) * 3]))
    run("softsign_f32", "Softsign", {}, torch.randn(3, 4) * 3, torch.float32)
    run("softsign_int", "Softsign", {}, torch.tensor([[-3, 0, 1, 7]]), torch.int64)
    run("tanhshrink", "Tanhshrink", {}, torch.cat([wide[2:-2], torch.randn(6) * 2]))
    run("tanhshrink_f32", "Tanhshrink", {}, torch.randn(2, 5) * 2, torch.float32)
    run("softshrink_default", "Softshrink", {}, ties)
    run("softshrink_1_2", "Softshrink", {"lambd": 1.2}, ties)
    run("softshrink_0", "Softshrink", {"lambd": 0.0}, ties)
    run("softshrink_0_1_f32", "Softshrink", {"lambd": 0.1}, ties, torch.float32)
    run("hardshrink_default", "Hardshrink", {}, ties)
    run("hardshrink_1_2", "Hardshrink", {"lambd": 1.2}, ties)
    run("hardshrink_negative", "Hardshrink", {"lambd": -1.0}, ties)
    run("hardshrink_0_1_f32", "Hardshrink", {"lambd": 0.1}, ties, torch.float32)
    run("threshold", "Threshold", {"threshold": 0.5, "value": -2.0}, ties)
    run("threshold_0_1_f32", "Threshold", {"threshold": 0.1, "value": 20.0}, ties, torch.float32)
    run("threshold_int", "Threshold", {"threshold": -1.5, "value": 7.9},
        torch.tensor([[-3, -2, -1, 0, 1, 2]]), torch.int64)
    run("glu_last", "GLU", {}, torch.randn(3, 8))
    run("glu_dim1", "GLU", {"dim": 1}, torch.randn(2, 4, 3))
    run("glu_f32", "GLU", {"dim": 0}, torch.randn(6, 3), torch.float32)
    run("softmin_1", "Softmin", {"dim": 1}, torch.randn(3, 5) * 2)
    run("softmin_0_f32", "Softmin", {"dim": 0}, torch.randn(4, 3) * 2, torch.float32)
    run("log_softmax_last", "LogSoftmax", {"dim": -1}, torch.randn(2, 3, 4) * 3)
    run("log_softmax_0", "LogSoftmax", {"dim": 0}, torch.randn(4, 3) * 3)
    run("unflatten", "Unflatten", {"dim": 1, "unflattened_size": [2, 3]}, torch.randn(2, 6, 2))
    run("unflatten_inferred", "Unflatten", {"dim": -1, "unflattened_size": [2, -1, 2]}, torch.randn(3, 12))
    run("unflatten_first", "Unflatten", {"dim": 0, "unflattened_size": [1, 4]}, torch.randn(4))

    x1, x1u = torch.randn(2, 3, 5), torch.randn(3, 5)
    x2, x2u = torch.randn(2, 2, 4, 5), torch.randn(2, 4, 5)
    x3, x3u = torch.randn(1, 2, 3, 4, 3), torch.randn(2, 3, 4, 3)
    for mode in ("Zero", "Constant", "Reflection", "Replication", "Circular"):
        extra = {"value": 1.5} if mode == "Constant" else {}
        m1, m2, m3 = (mode + "Pad%dd" % d for d in (1, 2, 3))
        low = mode.lower()
        run(low + "1d_int", m1, dict(extra, padding=2), x1)
        run(low + "1d_sides_unbatched", m1, dict(extra, padding=[3, 1]), x1u)
        run(low + "2d_int", m2, dict(extra, padding=1), x2)
        run(low + "2d_sides_unbatched", m2, dict(extra, padding=[2, 0, 1, 3]), x2u)
        run(low + "3d_sides", m3, dict(extra, padding=[1, 2, 0, 1, 2, 1]), x3)
        run(low + "3d_int_unbatched", m3, dict(extra, padding=1), x3u)
        run(low + "2d_f32", m2, dict(extra, padding=[1, 2, 2, 1]), x2, torch.float32)
        # a negative amount crops (reflection and replication: on one side)
        run(low + "2d_crop", m2, dict(extra, padding=[-1, 2, 1, -2]), x2)
    run("zeropad1d_1d", "ZeroPad1d", {"padding": 2}, torch.randn(4))
    run("zeropad2d_5d", "ZeroPad2d", {"padding": [1, 0, 0, 1]}, torch.randn(1, 2, 1, 3, 2))
    run("constantpad1d_int", "ConstantPad1d", {"padding": 2, "value": 3.7}, torch.arange(6).reshape(2, 3),
        torch.int64)
    run("reflectionpad1d_int", "ReflectionPad1d", {"padding": [2, 1]}, torch.arange(6).reshape(2, 3),
        torch.int64)
    run("circularpad2d_int", "CircularPad2d", {"padding": 1}, torch.arange(12).reshape(1, 3, 4),
        torch.int64)

    # channel dropout: the mask's shape (1 where PyTorch shares one draw)
    def drop(name, fn, shape, **kw):
        varies = [False] * len(shape)
        for _ in range(20):
            y = fn(torch.ones(shape), 0.5, **kw)
            for d in range(len(shape)):
                if shape[d] > 1 and not bool((y == y.narrow(d, 0, 1)).all()):
                    varies[d] = True
        dropout.append({"name": name, "fn": fn.__name__, "shape": list(shape),
                        "mask_shape": [n if v else 1 for n, v in zip(shape, varies)]})

    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        drop("1d_batched", F.dropout1d, (4, 6, 5))
        drop("1d_unbatched", F.dropout1d, (8, 5))
        drop("2d_batched", F.dropout2d, (4, 6, 3, 2))
        drop("2d_3d_as_batched_1d", F.dropout2d, (4, 6, 5))
        drop("2d_2d_elementwise", F.dropout2d, (6, 5))
        drop("2d_5d", F.dropout2d, (3, 4, 2, 2, 2))
        drop("3d_batched", F.dropout3d, (3, 5, 2, 2, 2))
        drop("3d_unbatched", F.dropout3d, (8, 2, 3, 2))
        drop("3d_3d_unbatched", F.dropout3d, (8, 3, 2))
        drop("3d_1d_elementwise", F.dropout3d, (12,))

    def err(name, fn, phrase):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fn()
        except (RuntimeError, ValueError, NotImplementedError, IndexError) as e:
            assert phrase in str(e), (name, str(e))
            errors.append({"name": name, "phrase": phrase})
        else:
            raise AssertionError(name + " was accepted")

    ints = torch.zeros(2, 4, dtype=torch.int64)
    err("logsigmoid_int", lambda: F.logsigmoid(ints), "\"log_sigmoid_cpu\" not implemented for 'Long'")
    err("softshrink_int", lambda: F.softshrink(ints), "\"softshrink_check\" not implemented for 'Long'")
    err("softshrink_negative", lambda: F.softshrink(torch.zeros(2, dtype=torch.float32), -0.5),
        "lambda must be in range [0, 3.40282e+38] for input dtype Float, but found -0.5")
    err("softshrink_negative_f64", lambda: nn.Softshrink(-1.0)(torch.zeros(2)),
        "lambda must be in range [0, 1.79769e+308] for input dtype Double, but found -1")
    err("hardshrink_int", lambda: F.hardshrink(ints), "\"hardshrink_cpu\" not implemented for 'Long'")
    err("threshold_bool", lambda: F.threshold(torch.zeros(2, dtype=torch.bool), 0.0, 1.0),
        "\"threshold_cpu\" not implemented for 'Bool'")
    err("glu_odd", lambda: F.glu(torch.zeros(2, 3), 1), "Halving dimension must be even, but dimension 1 is size 3")
    err("glu_scalar", lambda: F.glu(torch.zeros(()), 0), "glu does not support scalars because halving size must be even")
    err("glu_int", lambda: F.glu(ints), "\"glu_cpu\" not implemented for 'Long'")
    err("glu_dim", lambda: nn.GLU(2)(torch.zeros(2, 4)), "out of range (expected to be in range of [-2, 1], but got 2)")
    err("softmin_dim", lambda: nn.Softmin(2)(torch.zeros(2, 4)), "out of range (expected to be in range of [-2, 1], but got 2)")
    err("log_softmax_dim", lambda: nn.LogSoftmax(-3)(torch.zeros(2, 4)), "out of range (expected to be in range of [-2, 1], but got -3)")
    err("unflatten_sizes", lambda: nn.Unflatten(1, (2, 3))(torch.zeros(2, 7)),
        "unflatten: Provided sizes [2, 3] don't multiply up to the size of dim 1 (7) in the input tensor")
    err("unflatten_inferred_sizes", lambda: nn.Unflatten(1, (-1, 4))(torch.zeros(2, 6)),
        "unflatten: Provided sizes [-1, 4] don't multiply up to the size of dim 1 (6) in the input tensor")
    err("unflatten_empty", lambda: nn.Unflatten(1, ())(torch.zeros(2, 6)), "unflatten: sizes must be non-empty")
    err("unflatten_two_inferred", lambda: nn.Unflatten(1, (-1, -1))(torch.zeros(2, 6)), "only one dimension can be inferred")
    err("unflatten_negative", lambda: nn.Unflatten(1, (-2, 3))(torch.zeros(2, 6)),
        "invalid shape dimension -2 at index 0 of shape [-2, 3]")
    err("unflatten_ambiguous", lambda: nn.Unflatten(1, (0, -1))(torch.zeros(2, 0)),
        "cannot reshape tensor of 0 elements into shape [0, -1] because the unspecified dimension size -1 can be any value and is ambiguous")
    err("unflatten_dim", lambda: nn.Unflatten(2, (2, 3))(torch.zeros(2, 6)),
        "out of range (expected to be in range of [-2, 1], but got 2)")
    err("unflatten_scalar", lambda: nn.Unflatten(0, (1,))(torch.zeros(())), "Dimension specified as 0 but tensor has no dimensions")
    err("dropout2d_p", lambda: nn.Dropout2d(1.5), "dropout probability has to be between 0 and 1, but got 1.5")
    err("dropout1d_p", lambda: F.dropout1d(torch.zeros(2, 3), -0.25, training=False),
        "dropout probability has to be between 0 and 1, but got -0.25")
    err("dropout1d_rank", lambda: nn.Dropout1d().eval()(torch.zeros(1, 2, 3, 4)),
        "dropout1d: Expected 2D or 3D input, but received a 4D input")
    err("dropout2d_scalar", lambda: F.dropout2d(torch.zeros(()), 0.5), "Feature dropout requires at least 2 dimensions in the input")
    err("dropout3d_int", lambda: F.dropout3d(torch.zeros(2, 3, 2, 2, dtype=torch.int64), 0.5),
        "can't be cast to the desired output type Long")
    err("reflection_pad2d_rank", lambda: nn.ReflectionPad2d(1)(torch.zeros(3, 4)),
        "Padding size 4 is not supported for 2D input tensor")
    err("replication_pad3d_rank", lambda: nn.ReplicationPad3d(1)(torch.zeros(1, 1, 1, 2, 3, 4)),
        "Padding size 6 is not supported for 6D input tensor")
    err("reflection_pad1d_too_big", lambda: nn.ReflectionPad1d(4)(torch.zeros(2, 3, 4)),
        "Padding size should be less than the corresponding input dimension")
    err("reflection_pad1d_bool", lambda: nn.ReflectionPad1d(1)(torch.zeros(2, 3, dtype=torch.bool)),
        "\"reflection_pad1d\" not implemented for 'Bool'")
    err("circular_pad1d_rank", lambda: nn.CircularPad1d(1)(torch.zeros(1, 2, 3, 4)), "expected 2D or 3D input (got 4D input)")
    err("circular_pad3d_rank", lambda: nn.CircularPad3d(1)(torch.zeros(2, 3, 4)), "expected 4D or 5D input (got 3D input)")
    err("circular_pad1d_wrap", lambda: nn.CircularPad1d(5)(torch.zeros(2, 3, 4)), "Padding value causes wrapping around more than once")
    return {"cases": cases, "errors": errors, "dropout": dropout}


def optimizer2_cases():
    """NAdam, RAdam, Adamax, Adadelta, Rprop and ASGD on the objective of `optimizer_cases`
    (a second parameter without a gradient at the first two steps). RAdam's
    cases take nine steps: its rectified step starts once the moving
    average's length passes 5, at a parameter's sixth step."""
    out = []
    O = torch.optim
    configs = [
        ("nadam", lambda p: O.NAdam(p, lr=0.01), {"lr": 0.01}, 5),
        ("nadam_full", lambda p: O.NAdam(p, lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1,
                                         momentum_decay=0.01),
         {"lr": 0.02, "betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 0.1, "momentum_decay": 0.01}, 5),
        ("nadam_decoupled_maximize", lambda p: O.NAdam(p, lr=0.02, weight_decay=0.1, decoupled_weight_decay=True,
                                                       maximize=True),
         {"lr": 0.02, "weight_decay": 0.1, "decoupled_weight_decay": True, "maximize": True}, 5),
        ("radam", lambda p: O.RAdam(p, lr=0.01), {"lr": 0.01}, 9),
        ("radam_wd", lambda p: O.RAdam(p, lr=0.02, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1),
         {"lr": 0.02, "betas": [0.8, 0.9], "eps": 1e-6, "weight_decay": 0.1}, 9),
        ("radam_decoupled_maximize", lambda p: O.RAdam(p, lr=0.02, weight_decay=0.1, decoupled_weight_decay=True,
                                                       maximize=True),
         {"lr": 0.02, "weight_decay": 0.1, "decoupled_weight_decay": True, "maximize": True}, 9),
        ("adamax", lambda p: O.Adamax(p, lr=0.02), {"lr": 0.02}, 5),
        # a fast-forgetting norm, so that |g| + eps and the decayed norm both win
        ("adamax_full", lambda p: O.Adamax(p, lr=0.05, betas=(0.8, 0.5), eps=1e-4, weight_decay=0.1),
         {"lr": 0.05, "betas": [0.8, 0.5], "eps": 1e-4, "weight_decay": 0.1}, 5),
        ("adamax_maximize", lambda p: O.Adamax(p, lr=0.02, weight_decay=0.1, maximize=True),
         {"lr": 0.02, "weight_decay": 0.1, "maximize": True}, 5),
        ("adadelta", lambda p: O.Adadelta(p), {"lr": 1.0}, 5),
        ("adadelta_full", lambda p: O.Adadelta(p, lr=0.5, rho=0.8, eps=1e-4, weight_decay=0.1),
         {"lr": 0.5, "rho": 0.8, "eps": 1e-4, "weight_decay": 0.1}, 5),
        ("adadelta_maximize", lambda p: O.Adadelta(p, lr=1.0, weight_decay=0.1, maximize=True),
         {"lr": 1.0, "weight_decay": 0.1, "maximize": True}, 5),
        ("rprop", lambda p: O.Rprop(p, lr=0.05), {"lr": 0.05}, 6),
        # a tight cap on the step size and a fast shrink, with maximize
        ("rprop_full_maximize", lambda p: O.Rprop(p, lr=0.3, etas=(0.3, 1.5), step_sizes=(0.01, 0.4), maximize=True),
         {"lr": 0.3, "etas": [0.3, 1.5], "step_sizes": [0.01, 0.4], "maximize": True}, 6),
        # t0 small enough that the running average starts within the steps
        ("asgd", lambda p: O.ASGD(p, lr=0.05, lambd=0.01, alpha=0.5, t0=2.0, weight_decay=0.1),
         {"lr": 0.05, "lambd": 0.01, "alpha": 0.5, "t0": 2.0, "weight_decay": 0.1}, 6),
        ("asgd_default_maximize", lambda p: O.ASGD(p, lr=0.05, maximize=True), {"lr": 0.05, "maximize": True}, 5),
    ]
    for name, make, cfg, steps in configs:
        w = torch.tensor([1.0, -2.0, 0.5, 3.0], requires_grad=True)
        late = torch.tensor([0.7, -1.5], requires_grad=True)
        opt = make([w, late])
        traj, late_traj = [], []
        for step in range(steps):
            opt.zero_grad()
            loss = (w ** 4).sum() * 0.1 + (w * torch.tensor([1.0, 2.0, -1.0, 0.5])).sum()
            if step >= 2:
                loss = loss + (late ** 4).sum() * 0.2 + (late * torch.tensor([-1.0, 0.5])).sum()
            loss.backward()
            opt.step()
            traj.append(flat(w))
            late_traj.append(flat(late))
        case = {"name": name, "config": cfg, "init": [1.0, -2.0, 0.5, 3.0], "trajectory": traj,
                "late_init": [0.7, -1.5], "late_trajectory": late_traj}
        if name.startswith("asgd"):
            # the averaged parameters at the end
            case["ax"] = [flat(opt.state[p]["ax"]) for p in (w, late)]
        out.append(case)
    return out


def scheduler2_cases():
    """More schedules over an optimizer of two parameter groups (lr 0.1 and
    0.02; SGD with momentum 0.9, or Adam where the name says so): the rates
    after construction and after each step ("group_lrs"), the first group's
    momentum (cycled by CyclicLR), and where PyTorch has a closed form (or sets
    its rates outright) the rates of `step(epoch)` at epochs 0, 1, ... on a
    fresh schedule ("closed"). "epochs": the fractional epochs a warm-restart
    case is stepped with instead."""
    S = torch.optim.lr_scheduler
    cases = [
        ("multistep", lambda o: S.MultiStepLR(o, milestones=[2, 5, 5, 9], gamma=0.5), 12, True),
        ("multistep_zero", lambda o: S.MultiStepLR(o, milestones=[3, 0], gamma=0.1), 6, True),
        ("exponential", lambda o: S.ExponentialLR(o, gamma=0.8), 8, True),
        ("constant", lambda o: S.ConstantLR(o, factor=0.25, total_iters=4), 8, True),
        ("constant_default", lambda o: S.ConstantLR(o), 8, True),
        ("polynomial", lambda o: S.PolynomialLR(o, total_iters=6, power=2.0), 9, True),
        ("polynomial_default", lambda o: S.PolynomialLR(o), 8, True),
        ("multiplicative", lambda o: S.MultiplicativeLR(o, lambda e: 0.9 if e % 2 else 0.7), 8, False),
        ("warm_restarts", lambda o: S.CosineAnnealingWarmRestarts(o, T_0=3, T_mult=2, eta_min=0.001), 24, True),
        ("warm_restarts_mult1", lambda o: S.CosineAnnealingWarmRestarts(o, T_0=4), 10, True),
        ("warm_restarts_fractional", lambda o: S.CosineAnnealingWarmRestarts(o, T_0=3, T_mult=2, eta_min=0.001),
         8, False),
        ("cyclic_triangular", lambda o: S.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=3), 14, True),
        ("cyclic_triangular2", lambda o: S.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=2, step_size_down=4,
                                                    mode="triangular2"), 20, True),
        ("cyclic_exp_range_adam", lambda o: S.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=3, mode="exp_range",
                                                       gamma=0.9, base_momentum=0.85, max_momentum=0.95), 14, True),
        ("cyclic_no_momentum", lambda o: S.CyclicLR(o, base_lr=0.02, max_lr=0.2, step_size_up=2,
                                                    cycle_momentum=False), 8, True),
        ("chained", lambda o: S.ChainedScheduler([S.ConstantLR(o, factor=0.5, total_iters=3),
                                                  S.ExponentialLR(o, gamma=0.9)]), 8, False),
        ("chained_linear_multistep", lambda o: S.ChainedScheduler([S.LinearLR(o, 0.2, 1.0, 3),
                                                                   S.MultiStepLR(o, [4, 6], 0.5)]), 10, False),
        ("sequential_constant_exponential", lambda o: S.SequentialLR(o, [S.ConstantLR(o, 0.5, 2),
                                                                         S.ExponentialLR(o, 0.9)], [3]), 8, False),
    ]
    fractional = [0.5, 1.0, 2.25, 3.0, 3.5, 7.75, 10.0, 2.0]
    import warnings

    def fresh(name):
        groups = [{"params": [torch.zeros(1, requires_grad=True)]},
                  {"params": [torch.zeros(1, requires_grad=True)], "lr": 0.02}]
        adam = "adam" in name
        opt = torch.optim.Adam(groups, lr=0.1) if adam else torch.optim.SGD(groups, lr=0.1, momentum=0.9)

        def momentum():
            g = opt.param_groups[0]
            return g["betas"][0] if adam else g["momentum"]
        return opt, momentum

    out = []
    for name, make, steps, has_closed in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            opt, momentum = fresh(name)
            sched = make(opt)
            initial = [g["lr"] for g in opt.param_groups]
            initial_momentum = momentum()
            lrs, momenta, last = [], [], []
            epochs = fractional if name.endswith("fractional") else []
            for k in range(steps):
                opt.step()
                sched.step(epochs[k]) if epochs else sched.step()
                lrs.append([g["lr"] for g in opt.param_groups])
                momenta.append(momentum())
                last.append(list(sched.get_last_lr()))
                assert last[-1] == lrs[-1], name
            closed = []
            if has_closed:
                for k in range(steps):
                    o2, _ = fresh(name)
                    s2 = make(o2)
                    s2.step(k)
                    closed.append([g["lr"] for g in o2.param_groups])
        out.append({"name": name, "initial_groups": initial, "group_lrs": lrs,
                    "initial_momentum": initial_momentum, "momenta": momenta,
                    "closed": closed, "epochs": epochs,
                    "last_epoch": sched.last_epoch if hasattr(sched, "last_epoch") else steps})
    return out


def losses2_cases():
    """The losses added with loss_more.rs (margin ranking, hinge embedding, soft
    margin, multi-label soft margin, cosine embedding, triplet, Poisson and
    Gaussian NLL, multi-class and multi-label margin) and F.normalize, in
    float64 (a few in float32), and the loss modules with options other than
    their defaults (class weights, ignore_index, label_smoothing, pos_weight,
    beta, delta, batchmean, ...). Per case: the function ("fn": a functional
    name, or a module's class name), its options ("args"), its tensors by
    argument name (int64 class indices marked "int"; "grad" where the tensor
    requires a gradient), the value, and each gradient PyTorch computes for the
    output gradient 1 (a reduced loss) or linspace(-1, 1.3) (per element);
    null where PyTorch gives that tensor none. "half": float16 and bfloat16
    inputs (values exact in the dtype), with PyTorch CPU's results where its
    CPU kernel takes them, else the float64 results of the same values
    ("reference": "float64"). "errors": a phrase of PyTorch's message for
    refused calls (tests/tensor/nn/losses2.rs builds the same calls by name)."""
    torch.manual_seed(11)
    cases, halves, errors = [], [], []

    def num(x):
        # a non-finite number as a string ("nan", "inf", "-inf"): JSON has none
        x = float(x)
        return x if math.isfinite(x) else str(x)

    def tensor_json(t):
        return {"shape": list(t.shape), "values": [num(v) for v in t.detach().reshape(-1).tolist()]}

    def json_args(args):
        return {k: (num(v) if isinstance(v, float) else v) for k, v in args.items()}

    def call(fn, args, ts):
        a = dict(args)
        red = a.pop("reduction", "mean")
        if fn == "margin_ranking":
            return F.margin_ranking_loss(ts["input1"], ts["input2"], ts["target"], margin=a.get("margin", 0.0),
                                         reduction=red)
        if fn == "hinge_embedding":
            return F.hinge_embedding_loss(ts["input"], ts["target"], margin=a.get("margin", 1.0), reduction=red)
        if fn == "soft_margin":
            return F.soft_margin_loss(ts["input"], ts["target"], reduction=red)
        if fn == "multilabel_soft_margin":
            return F.multilabel_soft_margin_loss(ts["input"], ts["target"], weight=ts.get("weight"), reduction=red)
        if fn == "cosine_embedding":
            return F.cosine_embedding_loss(ts["input1"], ts["input2"], ts["target"], margin=a.get("margin", 0.0),
                                           reduction=red)
        if fn == "triplet_margin":
            return F.triplet_margin_loss(ts["anchor"], ts["positive"], ts["negative"], margin=a.get("margin", 1.0),
                                         p=a.get("p", 2.0), eps=a.get("eps", 1e-6), swap=a.get("swap", False),
                                         reduction=red)
        if fn == "poisson_nll":
            return F.poisson_nll_loss(ts["input"], ts["target"], log_input=a.get("log_input", True),
                                      full=a.get("full", False), eps=a.get("eps", 1e-8), reduction=red)
        if fn == "gaussian_nll":
            var = ts["var"] if "var" in ts else a["var_scalar"]
            return F.gaussian_nll_loss(ts["input"], ts["target"], var, full=a.get("full", False),
                                       eps=a.get("eps", 1e-6), reduction=red)
        if fn == "multi_margin":
            return F.multi_margin_loss(ts["input"], ts["target"], p=a.get("p", 1), margin=a.get("margin", 1.0),
                                       weight=ts.get("weight"), reduction=red)
        if fn == "multilabel_margin":
            return F.multilabel_margin_loss(ts["input"], ts["target"], reduction=red)
        if fn == "normalize":
            return F.normalize(ts["input"], p=a.get("p", 2.0), dim=tuple(a["dim"]), eps=a.get("eps", 1e-12))
        # the modules
        w = {k: ts[k] for k in ("weight", "pos_weight") if k in ts}
        if fn == "CrossEntropyLoss":
            m = nn.CrossEntropyLoss(ignore_index=a.get("ignore_index", -100), reduction=red,
                                    label_smoothing=a.get("label_smoothing", 0.0), **w)
        elif fn == "NLLLoss":
            m = nn.NLLLoss(ignore_index=a.get("ignore_index", -100), reduction=red, **w)
        elif fn == "BCELoss":
            m = nn.BCELoss(reduction=red, **w)
        elif fn == "BCEWithLogitsLoss":
            m = nn.BCEWithLogitsLoss(reduction=red, **w)
        elif fn == "KLDivLoss":
            m = nn.KLDivLoss(reduction="batchmean" if a.get("batchmean") else red, log_target=a.get("log_target", False))
        elif fn == "SmoothL1Loss":
            m = nn.SmoothL1Loss(reduction=red, beta=a.get("beta", 1.0))
        elif fn == "HuberLoss":
            m = nn.HuberLoss(reduction=red, delta=a.get("delta", 1.0))
        elif fn == "L1Loss":
            m = nn.L1Loss(reduction=red)
        elif fn == "MSELoss":
            m = nn.MSELoss(reduction=red)
        elif fn == "MultiMarginLoss":
            m = nn.MultiMarginLoss(p=a.get("p", 1), margin=a.get("margin", 1.0), reduction=red, **w)
        elif fn == "MultiLabelSoftMarginLoss":
            m = nn.MultiLabelSoftMarginLoss(reduction=red, **w)
        elif fn == "TripletMarginLoss":
            m = nn.TripletMarginLoss(margin=a.get("margin", 1.0), p=a.get("p", 2.0), eps=a.get("eps", 1e-6),
                                     swap=a.get("swap", False), reduction=red)
            return m(ts["anchor"], ts["positive"], ts["negative"])
        else:
            raise AssertionError(fn)
        return m(ts["input"], ts["target"])

    # tensors that never get a gradient in PyTorch's losses (refused if they require one)
    NO_GRAD = {("soft_margin", "target"), ("multi_margin", "weight"), ("MultiMarginLoss", "weight"),
               ("CrossEntropyLoss", "weight"), ("NLLLoss", "weight"), ("BCELoss", "weight"),
               ("BCEWithLogitsLoss", "weight"), ("BCEWithLogitsLoss", "pos_weight")}

    def run(name, fn, tensors, dtype=torch.float64, **args):
        """tensors: argument name -> tensor (int64 ones are class indices)."""
        ts, info = {}, {}
        for k, t in tensors.items():
            is_int = not t.is_floating_point()
            t = t if is_int else t.to(dtype)
            grad = not is_int and (fn, k) not in NO_GRAD
            ts[k] = t.clone().requires_grad_(grad)
            info[k] = {"t": tensor_json(t), "int": is_int, "grad": grad}
        v = call(fn, args, ts)
        v.backward(torch.linspace(-1, 1.3, v.numel(), dtype=v.dtype).reshape(v.shape) if v.dim() else None)
        grads = {k: (tensor_json(ts[k].grad) if ts[k].grad is not None else None)
                 for k in ts if info[k]["grad"]}
        cases.append({"name": name, "fn": fn, "args": json_args(args),
                      "dtype": "float32" if dtype == torch.float32 else "float64",
                      "tensors": info, "value": tensor_json(v), "value_dtype": str(v.dtype).replace("torch.", ""),
                      "grads": grads})

    sign = lambda *s: torch.randint(0, 2, s).double() * 2 - 1
    rn = torch.randn
    # margin ranking: margins, broadcasting, an integer target, ties at the hinge
    for red in ("mean", "sum", "none"):
        run(f"mrl_{red}", "margin_ranking", {"input1": rn(6), "input2": rn(6), "target": sign(6)}, reduction=red)
    run("mrl_margin_2d", "margin_ranking", {"input1": rn(3, 4), "input2": rn(3, 4), "target": sign(3, 4)}, margin=0.5,
        reduction="none")
    run("mrl_broadcast", "margin_ranking", {"input1": rn(3, 4), "input2": rn(1, 4), "target": sign(3, 1)}, margin=0.2,
        reduction="none")
    run("mrl_int_target", "margin_ranking", {"input1": rn(5), "input2": rn(5),
                                             "target": torch.tensor([1, -1, 1, 1, -1])}, margin=0.3)
    run("mrl_ties", "margin_ranking", {"input1": torch.tensor([1., 2., 3.]), "input2": torch.tensor([1., 2.5, 1.]),
                                       "target": torch.tensor([1., 1., -1.])}, reduction="sum")
    run("mrl_0d", "margin_ranking", {"input1": rn(()), "input2": rn(()), "target": torch.tensor(-1.)}, margin=0.4,
        reduction="none")
    run("mrl_f32", "margin_ranking", {"input1": rn(8), "input2": rn(8), "target": sign(8)}, torch.float32, margin=0.1)
    # hinge embedding
    for red in ("mean", "sum", "none"):
        run(f"hinge_{red}", "hinge_embedding", {"input": rn(3, 4).abs() * 1.5, "target": sign(3, 4)}, reduction=red)
    run("hinge_margin_broadcast", "hinge_embedding", {"input": rn(3, 4), "target": sign(4)}, margin=0.5,
        reduction="none")
    run("hinge_other_targets", "hinge_embedding", {"input": torch.tensor([0.5, 1.0, 2.0, 0.3, -0.7]),
                                                   "target": torch.tensor([-1., -1., -1., 0., 2.])}, reduction="none")
    run("hinge_target_bigger", "hinge_embedding", {"input": rn(4), "target": sign(2, 4)}, margin=2.0, reduction="sum")
    # soft margin
    for red in ("mean", "sum", "none"):
        run(f"soft_{red}", "soft_margin", {"input": rn(3, 5) * 2, "target": sign(3, 5)}, reduction=red)
    run("soft_broadcast_target", "soft_margin", {"input": rn(3, 4), "target": sign(4)}, reduction="none")
    run("soft_int_target", "soft_margin", {"input": rn(6), "target": torch.tensor([1, -1, 1, -1, -1, 1])})
    run("soft_f32", "soft_margin", {"input": rn(7), "target": sign(7)}, torch.float32)
    # multi-label soft margin
    for red in ("mean", "sum", "none"):
        run(f"mlsm_{red}", "multilabel_soft_margin", {"input": rn(4, 5), "target": torch.rand(4, 5).round()},
            reduction=red)
    run("mlsm_weight", "multilabel_soft_margin", {"input": rn(4, 5), "target": torch.rand(4, 5),
                                                  "weight": torch.rand(5) + 0.5}, reduction="none")
    run("mlsm_1d", "multilabel_soft_margin", {"input": rn(6), "target": torch.rand(6).round()})
    run("mlsm_3d", "multilabel_soft_margin", {"input": rn(2, 3, 4), "target": torch.rand(2, 3, 4).round(),
                                              "weight": torch.rand(3, 1) + 0.5}, reduction="none")
    run("mlsm_target_broadcast", "multilabel_soft_margin", {"input": rn(3, 4), "target": torch.rand(4)},
        reduction="sum")
    # cosine embedding
    for red in ("mean", "sum", "none"):
        run(f"cos_{red}", "cosine_embedding", {"input1": rn(5, 3), "input2": rn(5, 3), "target": sign(5)},
            reduction=red)
    run("cos_margin", "cosine_embedding", {"input1": rn(6, 4), "input2": rn(6, 4),
                                           "target": torch.tensor([1., -1., -1., 0., -1., 2.])}, margin=-0.2,
        reduction="none")
    run("cos_0d_target", "cosine_embedding", {"input1": rn(4), "input2": rn(4), "target": torch.tensor(-1.)},
        margin=-0.5)
    run("cos_broadcast", "cosine_embedding", {"input1": rn(4, 3), "input2": rn(1, 3), "target": sign(1)},
        reduction="none")
    run("cos_int_target", "cosine_embedding", {"input1": rn(4, 3), "input2": rn(4, 3),
                                               "target": torch.tensor([1, -1, -1, 1])}, margin=0.1, reduction="sum")
    run("cos_zero_vector", "cosine_embedding", {"input1": torch.zeros(2, 3), "input2": rn(2, 3),
                                                "target": torch.tensor([1., -1.])}, reduction="none")
    # triplet
    for red in ("mean", "sum", "none"):
        run(f"trip_{red}", "triplet_margin", {"anchor": rn(5, 3), "positive": rn(5, 3), "negative": rn(5, 3)},
            reduction=red)
    run("trip_swap", "triplet_margin", {"anchor": rn(6, 4), "positive": rn(6, 4), "negative": rn(6, 4)}, swap=True,
        margin=2.0, reduction="none")
    for p in (1.0, 3.0, float("inf")):
        run(f"trip_p{p}", "triplet_margin", {"anchor": rn(4, 3), "positive": rn(4, 3), "negative": rn(4, 3)}, p=p,
            eps=1e-3, margin=1.5, reduction="none")
    run("trip_3d_broadcast", "triplet_margin", {"anchor": rn(2, 3, 4), "positive": rn(1, 3, 4),
                                                "negative": rn(2, 1, 4)}, margin=0.5, reduction="none")
    run("trip_1d", "triplet_margin", {"anchor": rn(5), "positive": rn(5), "negative": rn(5)}, margin=3.0)
    # Poisson NLL
    counts = lambda *s: torch.randint(0, 6, s).double()
    for red in ("mean", "sum", "none"):
        run(f"pois_{red}", "poisson_nll", {"input": rn(3, 4), "target": counts(3, 4)}, reduction=red)
    run("pois_full", "poisson_nll", {"input": rn(6), "target": torch.tensor([0., 1., 2., 5., 1.5, 3.])}, full=True,
        reduction="none")
    run("pois_rate", "poisson_nll", {"input": torch.rand(5) * 3, "target": counts(5)}, log_input=False)
    run("pois_rate_full_eps", "poisson_nll", {"input": torch.rand(2, 4) * 3 + 0.1, "target": torch.rand(2, 4) * 5},
        log_input=False, full=True, eps=0.01, reduction="none")
    run("pois_broadcast", "poisson_nll", {"input": rn(3, 4), "target": counts(4)}, reduction="sum")
    run("pois_int_target", "poisson_nll", {"input": rn(4), "target": torch.tensor([0, 1, 4, 2])})
    # Gaussian NLL: each var shape PyTorch takes
    for red in ("mean", "sum", "none"):
        run(f"gauss_{red}", "gaussian_nll", {"input": rn(4, 3), "target": rn(4, 3), "var": torch.rand(4, 3) + 0.1},
            reduction=red)
    run("gauss_full", "gaussian_nll", {"input": rn(4, 3), "target": rn(4, 3), "var": torch.rand(4, 3) + 0.1},
        full=True, reduction="none")
    run("gauss_var_short", "gaussian_nll", {"input": rn(4, 3), "target": rn(4, 3), "var": torch.rand(4) + 0.1},
        reduction="none")
    run("gauss_var_one", "gaussian_nll", {"input": rn(2, 3, 4), "target": rn(2, 3, 4), "var": torch.rand(2, 1, 4) + 0.1},
        reduction="none")
    run("gauss_var_clamped", "gaussian_nll", {"input": rn(5), "target": rn(5),
                                              "var": torch.tensor([0., 1e-9, 0.5, 2.0, 1e-3])}, eps=1e-4,
        reduction="none")
    run("gauss_var_scalar", "gaussian_nll", {"input": rn(3, 2), "target": rn(3, 2)}, var_scalar=0.7, full=True)
    run("gauss_var_0d_1d", "gaussian_nll", {"input": rn(5), "target": rn(5), "var": torch.tensor(0.3)})
    run("gauss_target_broadcast", "gaussian_nll", {"input": rn(4, 3), "target": rn(1, 3),
                                                   "var": torch.rand(4, 1) + 0.2}, reduction="none")
    run("gauss_f32", "gaussian_nll", {"input": rn(6), "target": rn(6), "var": torch.rand(6) + 0.1}, torch.float32)
    # multi-class margin
    tg = torch.tensor([0, 3, 1, 2, 3])
    for red in ("mean", "sum", "none"):
        run(f"mm_{red}", "multi_margin", {"input": rn(5, 4), "target": tg}, reduction=red)
    run("mm_p2_margin_weight", "multi_margin", {"input": rn(5, 4), "target": tg, "weight": torch.rand(4) + 0.5}, p=2,
        margin=0.7, reduction="none")
    run("mm_weight_mean", "multi_margin", {"input": rn(5, 4), "target": tg, "weight": torch.rand(4) + 0.5})
    run("mm_1d", "multi_margin", {"input": rn(4), "target": torch.tensor(2)}, margin=2.0, reduction="none")
    run("mm_1d_target1", "multi_margin", {"input": rn(4), "target": torch.tensor([1])}, margin=2.0, reduction="none")
    run("mm_ties", "multi_margin", {"input": torch.tensor([[0.5, 1.5, 0.5], [0.0, 1.0, 3.0]]),
                                    "target": torch.tensor([1, 2])}, reduction="none")
    run("mm_0d", "multi_margin", {"input": rn(()), "target": torch.tensor(0)}, reduction="none")
    run("mm_f32", "multi_margin", {"input": rn(6, 5), "target": torch.tensor([0, 1, 2, 3, 4, 0])}, torch.float32, p=2)
    # multi-label margin
    mt = torch.tensor([[0, 2, -1, 1], [3, -1, 0, 0], [1, 1, -1, 2], [0, 1, 2, 3], [-1, 0, 1, 2]])
    for red in ("mean", "sum", "none"):
        run(f"mml_{red}", "multilabel_margin", {"input": rn(5, 4), "target": mt}, reduction=red)
    run("mml_1d", "multilabel_margin", {"input": rn(4), "target": torch.tensor([3, 0, -1, 1])}, reduction="none")
    run("mml_ties", "multilabel_margin", {"input": torch.tensor([[0.5, 1.5, 0.5]]), "target": torch.tensor([[1, -1, 0]])},
        reduction="none")
    run("mml_0d", "multilabel_margin", {"input": rn(()), "target": torch.tensor(0)})
    run("mml_f32", "multilabel_margin", {"input": rn(3, 6), "target": torch.tensor([[5, 0, -1, 0, 0, 0],
                                                                                   [1, 2, 3, -1, 0, 0],
                                                                                   [0, 1, 2, 3, 4, 5]])},
        torch.float32)
    # F.normalize
    run("normalize", "normalize", {"input": rn(3, 4)}, dim=[1])
    run("normalize_p1_dim0", "normalize", {"input": rn(3, 4)}, p=1.0, dim=[0])
    run("normalize_inf", "normalize", {"input": rn(2, 3, 4)}, p=float("inf"), dim=[-1])
    run("normalize_dims", "normalize", {"input": rn(2, 3, 4)}, p=3.0, dim=[0, 2])
    run("normalize_small", "normalize", {"input": torch.tensor([[3., 4.], [0., 0.], [1e-3, 0.]])}, eps=0.01, dim=[1])
    run("normalize_f32", "normalize", {"input": rn(4, 5)}, torch.float32, dim=[1])

    # the modules, with options other than their defaults
    logits, cls = rn(6, 4), torch.tensor([0, 3, 1, -1, 2, 3])
    cw = torch.tensor([0.5, 2.0, 1.0, 1.5])
    run("ce_weight_ignore_smooth", "CrossEntropyLoss", {"input": logits, "target": cls, "weight": cw},
        ignore_index=-1, label_smoothing=0.2)
    run("ce_weight_sum", "CrossEntropyLoss", {"input": logits, "target": cls.clamp_min(0), "weight": cw},
        reduction="sum")
    run("ce_ignore_none_2d", "CrossEntropyLoss", {"input": rn(2, 3, 5), "target": torch.tensor([[0, 2, 7, 1, 7],
                                                                                                [2, 7, 1, 0, 0]])},
        ignore_index=7, label_smoothing=0.1, reduction="none")
    run("ce_probs_weight_smooth", "CrossEntropyLoss", {"input": logits, "target": torch.softmax(rn(6, 4), 1),
                                                       "weight": cw}, label_smoothing=0.3)
    run("nll_weight_ignore", "NLLLoss", {"input": torch.log_softmax(rn(6, 4), 1), "target": cls, "weight": cw},
        ignore_index=-1)
    run("nll_2d_none", "NLLLoss", {"input": torch.log_softmax(rn(2, 4, 3), 1),
                                   "target": torch.tensor([[0, 3, 2], [1, 1, 0]]), "weight": cw}, reduction="none")
    x, y = rn(3, 4), torch.rand(3, 4)
    run("bcel_pos_weight", "BCEWithLogitsLoss", {"input": x, "target": y, "pos_weight": torch.tensor([1., 2., 0.5, 3.])})
    run("bcel_weight_pos_weight_none", "BCEWithLogitsLoss", {"input": x, "target": y, "weight": torch.rand(3, 1) + 0.5,
                                                             "pos_weight": torch.tensor([1., 2., 0.5, 3.])},
        reduction="none")
    run("bce_weight", "BCELoss", {"input": torch.rand(3, 4) * 0.9 + 0.05, "target": y, "weight": torch.rand(4) + 0.5},
        reduction="sum")
    logp = torch.log_softmax(rn(3, 5), 1)
    run("kl_batchmean", "KLDivLoss", {"input": logp, "target": torch.softmax(rn(3, 5), 1)}, batchmean=True)
    run("kl_log_target_sum", "KLDivLoss", {"input": logp, "target": torch.log_softmax(rn(3, 5), 1)}, log_target=True,
        reduction="sum")
    run("smooth_l1_beta", "SmoothL1Loss", {"input": rn(3, 4), "target": rn(3, 4)}, beta=0.5, reduction="sum")
    run("huber_delta", "HuberLoss", {"input": rn(3, 4) * 2, "target": rn(3, 4)}, delta=2.0, reduction="none")
    run("l1_sum", "L1Loss", {"input": rn(5), "target": rn(5)}, reduction="sum")
    run("mse_none", "MSELoss", {"input": rn(2, 3), "target": rn(2, 3)}, reduction="none")
    run("multi_margin_module", "MultiMarginLoss", {"input": rn(4, 3), "target": torch.tensor([2, 0, 1, 1]),
                                                   "weight": torch.tensor([1., 0.5, 2.])}, p=2, margin=0.5,
        reduction="sum")
    run("mlsm_module", "MultiLabelSoftMarginLoss", {"input": rn(3, 4), "target": torch.rand(3, 4).round(),
                                                    "weight": torch.rand(4) + 0.5}, reduction="none")
    run("triplet_module", "TripletMarginLoss", {"anchor": rn(4, 3), "positive": rn(4, 3), "negative": rn(4, 3)},
        margin=0.5, p=1.0, swap=True)

    # float16 and bfloat16
    def half(name, fn, tensors, **args):
        for dt in (torch.float16, torch.bfloat16):
            ts, info = {}, {}
            for k, t in tensors.items():
                is_int = not t.is_floating_point()
                t = t if is_int else t.to(dt)
                grad = not is_int and (fn, k) not in NO_GRAD
                ts[k] = t.clone().requires_grad_(grad)
                info[k] = {"t": tensor_json(t), "int": is_int, "grad": grad}
            try:
                v = call(fn, args, ts)
                reference = str(dt).replace("torch.", "")
            except NotImplementedError:
                # PyTorch's CPU kernel refuses the dtype: the same values in float64
                ts = {k: (t.detach().double().requires_grad_(t.requires_grad) if t.is_floating_point() else t)
                      for k, t in ts.items()}
                v = call(fn, args, ts)
                reference = "float64"
            v.backward(torch.linspace(-1, 1.3, v.numel(), dtype=v.dtype).reshape(v.shape) if v.dim() else None)
            grads = {k: (tensor_json(ts[k].grad) if ts[k].grad is not None else None)
                     for k in ts if info[k]["grad"]}
            halves.append({"name": f"{name}_{str(dt).replace('torch.', '')}", "fn": fn, "args": json_args(args),
                           "dtype": str(dt).replace("torch.", ""), "reference": reference, "tensors": info,
                           "value": tensor_json(v), "grads": grads})

    half("mrl", "margin_ranking", {"input1": rn(8), "input2": rn(8), "target": sign(8)}, margin=0.25)
    half("hinge", "hinge_embedding", {"input": rn(3, 4), "target": sign(3, 4)}, reduction="none")
    half("soft", "soft_margin", {"input": rn(3, 4), "target": sign(3, 4)})
    half("mlsm", "multilabel_soft_margin", {"input": rn(3, 4), "target": torch.rand(3, 4).round()}, reduction="none")
    half("cos", "cosine_embedding", {"input1": rn(4, 3), "input2": rn(4, 3), "target": sign(4)}, reduction="none")
    half("trip", "triplet_margin", {"anchor": rn(4, 3), "positive": rn(4, 3), "negative": rn(4, 3)}, swap=True)
    half("pois", "poisson_nll", {"input": rn(6), "target": counts(6)}, full=True, reduction="none")
    half("gauss", "gaussian_nll", {"input": rn(4, 3), "target": rn(4, 3), "var": torch.rand(4, 3) + 0.1})
    half("mm", "multi_margin", {"input": rn(4, 3), "target": torch.tensor([0, 2, 1, 2])}, reduction="none")
    half("mml", "multilabel_margin", {"input": rn(2, 3), "target": torch.tensor([[0, 2, -1], [1, -1, 0]])})
    half("normalize", "normalize", {"input": rn(3, 4)}, dim=[1])

    def err(name, fn, phrase):
        try:
            fn()
        except (RuntimeError, ValueError, NotImplementedError, IndexError) as e:
            assert phrase in str(e), (name, str(e))
            errors.append({"name": name, "phrase": phrase, "kind": type(e).__name__})
            return
        raise AssertionError(f"{name}: no error")

    z = torch.zeros
    v4, v3 = rn(4), rn(3)
    err("mrl_dims", lambda: F.margin_ranking_loss(v4, v4, v4[None]),
        "margin_ranking_loss : All input tensors should have same dimension but got sizes: input1: torch.Size([4]), "
        "input2: torch.Size([4]), target: torch.Size([1, 4]) ")
    err("mrl_broadcast", lambda: F.margin_ranking_loss(v4, v3, v4),
        "size of tensor a (4) must match the size of tensor b (3) at non-singleton dimension 0")
    err("mrl_bool_target", lambda: F.margin_ranking_loss(v4, v4, v4 > 0),
        "Negation, the `-` operator, on a bool tensor is not supported.")
    err("hinge_broadcast", lambda: F.hinge_embedding_loss(v4, v3), "must match the size of tensor b")
    err("hinge_int_mean", lambda: F.hinge_embedding_loss(z(4, dtype=torch.long), v4), "could not infer output dtype")
    err("soft_target_grad", lambda: F.soft_margin_loss(v4, v4.clone().requires_grad_()),
        "The function 'soft_margin_loss' is not differentiable with respect to argument 'target'. This input cannot "
        "have requires_grad True.")
    err("soft_int_input", lambda: F.soft_margin_loss(z(4, dtype=torch.long), v4),
        "result type Double can't be cast to the desired output type Long")
    err("soft_target_bigger", lambda: F.soft_margin_loss(v4, z(3, 4)),
        "output with shape [4] doesn't match the broadcast shape [3, 4]")
    err("soft_broadcast", lambda: F.soft_margin_loss(v4, v3),
        "size of tensor a (4) must match the size of tensor b (3) at non-singleton dimension 0")
    err("mlsm_0d", lambda: F.multilabel_soft_margin_loss(v4[0], v4[0]),
        "Dimension specified as -1 but tensor has no dimensions")
    err("mlsm_int", lambda: F.multilabel_soft_margin_loss(z(3, 4, dtype=torch.long), z(3, 4)),
        "\"log_sigmoid_cpu\" not implemented for 'Long'")
    err("mlsm_broadcast", lambda: F.multilabel_soft_margin_loss(z(3, 4), z(3, 3)),
        "size of tensor a (3) must match the size of tensor b (4) at non-singleton dimension 1")
    m43 = rn(4, 3)
    err("cos_target_2d", lambda: F.cosine_embedding_loss(m43, m43, z(4, 1)),
        "0D or 1D target tensor expected, multi-target not supported")
    err("cos_1d_target", lambda: F.cosine_embedding_loss(m43, v3, z(4)),
        "1D target tensor expects 2D input tensors, but found inputs with sizes [4, 3] and [3].")
    err("cos_0d_target", lambda: F.cosine_embedding_loss(m43, m43, torch.tensor(1.)),
        "0D target tensor expects 1D input tensors, but found inputs with sizes [4, 3] and [4, 3].")
    err("cos_size", lambda: F.cosine_embedding_loss(m43, z(4, 2), z(4)),
        "size of tensor a (3) must match the size of tensor b (2) at non-singleton dimension 1")
    err("cos_target_size", lambda: F.cosine_embedding_loss(m43, m43, z(5)), "must match the size of tensor")
    err("trip_margin", lambda: F.triplet_margin_loss(m43, m43, m43, margin=0.0), "margin must be greater than 0, got 0.0")
    err("trip_margin_negative", lambda: F.triplet_margin_loss(m43, m43, m43, margin=-1.5),
        "margin must be greater than 0, got -1.5")
    err("trip_dims", lambda: F.triplet_margin_loss(m43, v3, m43),
        "The anchor, positive, and negative tensors are expected to have the same number of dimensions, but got: "
        "anchor 2D, positive 1D, and negative 2D inputs")
    err("trip_size", lambda: F.triplet_margin_loss(m43, z(4, 2), m43),
        "size of tensor a (3) must match the size of tensor b (2) at non-singleton dimension 1")
    err("pois_size", lambda: F.poisson_nll_loss(v4, v3),
        "size of tensor a (3) must match the size of tensor b (4) at non-singleton dimension 0")
    err("gauss_negative", lambda: F.gaussian_nll_loss(v4, v4, torch.tensor([1., -1., 1., 1.])),
        "var has negative entry/entries")
    err("gauss_negative_number", lambda: F.gaussian_nll_loss(v4, v4, -0.5), "var has negative entry/entries")
    err("gauss_var_bigger", lambda: F.gaussian_nll_loss(v4, v4, torch.ones(2, 4)), "var is of incorrect size")
    err("gauss_var_two_ones", lambda: F.gaussian_nll_loss(z(4, 3, 2), z(4, 3, 2), torch.ones(4, 1, 1)),
        "var is of incorrect size")
    err("gauss_var_empty", lambda: F.gaussian_nll_loss(m43, m43, torch.ones(4, 0)), "var is of incorrect size")
    err("gauss_int_var", lambda: F.gaussian_nll_loss(m43, m43, torch.ones(4, 3, dtype=torch.long)),
        "can't be cast to the desired output type long int")
    tg4 = torch.tensor([0, 2, 1, 2])
    err("mm_p", lambda: F.multi_margin_loss(m43, tg4, p=3), "only p == 1 and p == 2 supported")
    err("mm_weight_dim", lambda: F.multi_margin_loss(m43, tg4, weight=torch.ones(1, 3)),
        "weight must be one-dimensional")
    err("mm_weight_size", lambda: F.multi_margin_loss(m43, tg4, weight=torch.ones(4)),
        "inconsistent weight size, expected 3 but got [4]")
    err("mm_weight_dtype", lambda: F.multi_margin_loss(m43, tg4, weight=torch.ones(3, dtype=torch.float32)),
        "expected scalar type Double but found Float")
    err("mm_target_dtype", lambda: F.multi_margin_loss(m43, tg4.double()), "expected scalar type Long but found Double")
    err("mm_target_size", lambda: F.multi_margin_loss(m43, tg4[:3]),
        "multi_margin_loss: target tensor should be 1-D with size equal to the number of input samples (batch size). "
        "Expected target size [4], but got [3]. Input has shape [4, 3].")
    err("mm_target_2d", lambda: F.multi_margin_loss(m43, tg4[None]),
        "Expected target size [4], but got [1, 4]. Input has shape [4, 3].")
    err("mm_target_1d_input", lambda: F.multi_margin_loss(v3, tg4[:2]),
        "Expected target size [1], but got [2]. Input has shape [3].")
    err("mm_3d", lambda: F.multi_margin_loss(z(2, 4, 3), tg4),
        "Expected non-empty vector or matrix with optional 0-dim batch size, but got: [2, 4, 3]")
    err("mm_no_classes", lambda: F.multi_margin_loss(z(4, 0), tg4),
        "Expected non-empty vector or matrix with optional 0-dim batch size, but got: [4, 0]")
    err("mm_int", lambda: F.multi_margin_loss(z(4, 3, dtype=torch.long), tg4),
        "\"multi_margin_loss_cpu_kernel\" not implemented for 'Long'")
    err("mm_range", lambda: F.multi_margin_loss(m43, tg4 + 1), "target out of range")
    err("mm_range_negative", lambda: F.multi_margin_loss(m43, tg4 - 1), "target out of range")
    err("mm_weight_grad", lambda: F.multi_margin_loss(m43, tg4, weight=torch.ones(3, requires_grad=True)),
        "The function 'multi_margin_loss' is not differentiable with respect to argument 'weight'. This input cannot "
        "have requires_grad True.")
    mt4 = torch.tensor([[0, 2, -1], [1, -1, 0], [2, 1, 0], [-1, 0, 0]])
    err("mml_target_size", lambda: F.multilabel_margin_loss(m43, mt4[:3]),
        "inconsistent target size: [3, 3] for input of size: [4, 3]")
    err("mml_1d_size", lambda: F.multilabel_margin_loss(v3, mt4[0, :2]),
        "inconsistent target size: [2] for input of size: [3]")
    err("mml_1d_target_2d", lambda: F.multilabel_margin_loss(v3, mt4[:1]),
        "inconsistent target size: [1, 3] for input of size: [3]")
    err("mml_3d", lambda: F.multilabel_margin_loss(z(2, 4, 3), mt4),
        "Expected non-empty vector or matrix with optional 0-dim batch size, but got: [2, 4, 3]")
    err("mml_int", lambda: F.multilabel_margin_loss(z(4, 3, dtype=torch.long), mt4),
        "\"multilabel_margin_loss_forward_out_frame\" not implemented for 'Long'")
    err("mml_target_dtype", lambda: F.multilabel_margin_loss(m43, mt4.double().clamp_min(0)),
        "expected scalar type Long but found Double")
    err("mml_range", lambda: F.multilabel_margin_loss(m43, mt4 + 1), "argument #2 'target' is out of range")
    err("mml_range_negative", lambda: F.multilabel_margin_loss(m43, mt4 - 1), "argument #2 'target' is out of range")
    err("normalize_int", lambda: F.normalize(z(3, 4, dtype=torch.long)),
        "linalg.vector_norm: Expected a floating point or complex tensor as input. Got Long")
    err("normalize_dim", lambda: F.normalize(v3), "expected to be in range of [-1, 0], but got 1")
    return {"cases": cases, "half": halves, "errors": errors}


def rnn_utils_cases():
    """torch.nn.utils.rnn.pad_sequence: sequences of different lengths (with
    trailing dims, broadcast trailing dims, mixed dtypes cast to the first's,
    an empty sequence), batch-first or not, left or right padding, a padding
    value (cast for integers): the batch and each sequence's gradient for the
    output gradient linspace(-1, 1); unpad_sequence of the batch; PyTorch's
    refusals (tests/tensor/nn/rnn_utils.rs)."""
    from torch.nn.utils.rnn import pad_sequence, unpad_sequence
    cases, errors = [], []

    def seq(n, *rest, dtype=torch.float64, k=1.0):
        numel = n * math.prod(rest)
        return (torch.arange(numel, dtype=torch.float64) * 0.37 * k).sin().mul(4).round().to(dtype).reshape(n, *rest)

    def pad(name, seqs, **kw):
        seqs = [s.clone().requires_grad_(s.is_floating_point()) for s in seqs]
        y = pad_sequence(seqs, **kw)
        grads = [None] * len(seqs)
        if y.is_floating_point():
            y.backward(torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape))
            grads = [None if s.grad is None else tensor_json(s.grad) for s in seqs]
        name_of = lambda t: str(t.dtype).replace("torch.", "")
        case = {"name": name, "config": kw, "seqs": [tensor_json(s.detach()) for s in seqs],
                "dtypes": [name_of(s) for s in seqs], "y": tensor_json(y.detach()),
                "y_dtype": name_of(y), "grads": grads}
        if seqs[0].dim() >= 1 and all(s.shape[1:] == seqs[0].shape[1:] for s in seqs) \
                and kw.get("padding_side", "right") == "right":
            lengths = [s.shape[0] for s in seqs]
            back = unpad_sequence(y.detach(), torch.tensor(lengths), batch_first=kw.get("batch_first", False))
            case["lengths"] = lengths
            case["unpadded"] = [tensor_json(b) for b in back]
        cases.append(case)

    pad("plain", [seq(3), seq(1, k=2), seq(2, k=3)])
    pad("batch_first", [seq(3, 2), seq(1, 2, k=2), seq(4, 2, k=3)], batch_first=True)
    pad("left", [seq(3, 2), seq(1, 2, k=2)], padding_side="left")
    pad("left_batch_first_value", [seq(2, 2, 3), seq(4, 2, 3, k=2)], batch_first=True,
        padding_side="left", padding_value=-7.5)
    pad("empty_sequence", [seq(0, 2), seq(2, 2, k=2)], padding_value=1.0)
    pad("one", [seq(3, 2)], batch_first=True)
    pad("same_lengths", [seq(2, 3), seq(2, 3, k=2)])
    pad("broadcast_trailing", [seq(2, 3), seq(3, 1, k=2)], padding_value=9.0)
    pad("mixed_dtypes", [seq(2, 2, dtype=torch.float32), seq(3, 2, k=2)])
    pad("int", [seq(2, dtype=torch.int64), seq(3, dtype=torch.int64, k=2)], padding_value=2.7)
    pad("int_first_float_second", [seq(2, dtype=torch.int64), seq(3, k=2).add(0.6)], batch_first=True)

    def err(name, fn, phrase):
        try:
            fn()
        except (RuntimeError, ValueError) as e:
            assert phrase in str(e), (name, str(e))
            errors.append({"name": name, "phrase": phrase})
        else:
            raise AssertionError(name + " was accepted")

    err("empty_list", lambda: pad_sequence([]), "received an empty list of sequences")
    err("trailing_mismatch", lambda: pad_sequence([seq(3, 2), seq(2, 3)]),
        "The size of tensor a (2) must match the size of tensor b (3) at non-singleton dimension 1")
    err("trailing_mismatch_2", lambda: pad_sequence([seq(3, 4, 2), seq(2, 4, 5)], batch_first=True),
        "The size of tensor a (2) must match the size of tensor b (5) at non-singleton dimension 2")
    return {"cases": cases, "errors": errors}


SECTIONS = {"losses": loss_cases, "optimizers": optimizer_cases, "schedulers": scheduler_cases,
            "optimizers2": optimizer2_cases, "schedulers2": scheduler2_cases,
            "groups": group_cases,
            "iris": iris_case, "init": init_cases, "modules": module_cases, "inplace": inplace_cases,
            "seq_modules": seq_module_cases, "clip": clip_cases, "memory_format": memory_format_cases,
            "layers2": layers2_cases, "rnn": rnn_cases, "transformer2": transformer2_cases,
            "resample": resample_cases, "embedding_bag": embedding_bag_cases,
            "layers4": layers4_cases,
            "layers3": layers3_cases, "losses2": losses2_cases,
            "rnn_utils": rnn_utils_cases}


def main():
    """All sections, or only those named on the command line (the others are kept
    from the existing file: regenerating float32 sections on another CPU changes
    their last digits, which is noise in a review)."""
    path = os.path.join(HERE, "nn_cases.json")
    only = sys.argv[1:]
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        sys.exit(f"unknown sections {unknown}; known: {list(SECTIONS)}")
    if only:
        with open(path) as f:
            data = json.load(f)
    else:
        data = {}
    data["torch"] = torch.__version__
    for name, make in SECTIONS.items():
        if not only or name in only:
            data[name] = make()
    with open(path, "w") as f:
        json.dump(data, f, indent=0)
    print("iris: final loss %.4f, test accuracy %.3f" % (data["iris"]["losses"][-1], data["iris"]["test_accuracy"]))


if __name__ == "__main__":
    main()
