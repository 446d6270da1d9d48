"""Golden values for ember's mixed precision (ember::amp), from PyTorch's CPU autocast.

Writes amp_cases.json next to this file:
- dtypes: the dtype of each op's output inside torch.autocast("cpu", torch.bfloat16),
  for inputs of given dtypes (the lower-precision list, the float32 list, ops on
  neither list, promotion between a bfloat16 and a float32 operand, float64 left
  alone);
- models: a small MLP and a small CNN with fixed float32 parameters, run forward
  under CPU bf16 autocast with a cross-entropy loss and backward: the output
  (bfloat16), the loss (float32) and every parameter's gradient (float32);
- scaler, scaler_custom: a GradScaler (PyTorch's default factors, and growth 3 /
  backoff 0.25 / interval 3) over a scripted run of SGD steps in which some steps'
  gradients hold an infinity or a NaN, and (scaler_custom) some steps only unscale
  and skip the step before update(): the scale after each update(), whether each
  step was taken, the parameters at the end, and the state_dict;
- scaler_two_optimizers: one scaler over SGD and Adam, each skipping its own bad
  step.
Run from anywhere: python3 crates/ember/tests/golden/gen_amp.py
"""
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
BF = torch.bfloat16


def flat(t):
    return [float(x) for x in t.detach().float().reshape(-1).tolist()]


def tj(t):
    return {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""), "values": flat(t)}


def dtype_cases():
    torch.manual_seed(0)
    f32 = lambda *s: torch.randn(*s)
    cases = []

    def case(name, fn, *inputs):
        with torch.autocast("cpu", dtype=BF):
            out = fn(*inputs)
        cases.append({"name": name, "inputs": [str(i.dtype).replace("torch.", "") for i in inputs],
                      "out": str(out.dtype).replace("torch.", "")})

    a, b = f32(3, 4), f32(4, 5)
    case("matmul", torch.matmul, a, b)
    case("matmul_f64", torch.matmul, a.double(), b.double())
    case("bmm", torch.bmm, f32(2, 3, 4), f32(2, 4, 5))
    case("linear", F.linear, a, f32(5, 4), f32(5))
    case("conv2d", F.conv2d, f32(1, 2, 5, 5), f32(3, 2, 3, 3), f32(3))
    case("sdpa", F.scaled_dot_product_attention, f32(1, 2, 3, 4), f32(1, 2, 3, 4), f32(1, 2, 3, 4))
    case("softmax_f32", lambda x: x.softmax(-1), a)
    case("softmax_bf16", lambda x: x.softmax(-1), a.to(BF))
    case("log_softmax_bf16", lambda x: x.log_softmax(-1), a.to(BF))
    case("layer_norm_bf16", lambda x, w, c: F.layer_norm(x, (4,), w, c), a.to(BF), f32(4), f32(4))
    case("rms_norm_bf16", lambda x, w: F.rms_norm(x, (4,), w), a.to(BF), f32(4))
    case("cross_entropy_bf16", lambda x, t: F.cross_entropy(x, t), a.to(BF), torch.tensor([0, 3, 1]))
    case("mse_loss_bf16", F.mse_loss, a.to(BF), a)
    case("bce_with_logits_bf16", F.binary_cross_entropy_with_logits, a.to(BF), a.sigmoid())
    case("nll_loss_bf16", lambda x, t: F.nll_loss(x, t), a.to(BF), torch.tensor([0, 3, 1]))
    case("add_bf16_f32", torch.add, a.to(BF), a)
    case("relu_bf16", torch.relu, a.to(BF))
    case("relu_f32", torch.relu, a)
    case("sum_bf16", torch.sum, a.to(BF))
    case("exp_bf16", torch.exp, a.to(BF))
    case("max_pool2d_bf16", lambda x: F.max_pool2d(x, 2), f32(1, 2, 4, 4).to(BF))
    # the scans, products, norms and powers (CUDA's float32 list; on the CPU only
    # prod is on it)
    case("pow_bf16", lambda x: x.pow(2.0), a.to(BF))
    case("pow_tensor_bf16", torch.pow, a.abs().to(BF), a.to(BF))
    case("cumsum_bf16", lambda x: x.cumsum(1), a.to(BF))
    case("cumprod_bf16", lambda x: x.cumprod(1), a.to(BF))
    case("prod_bf16", lambda x: x.prod(1), a.to(BF))
    case("logsumexp_bf16", lambda x: x.logsumexp(1), a.to(BF))
    case("vector_norm_bf16", lambda x: torch.linalg.vector_norm(x), a.to(BF))
    # reflection and replication padding are on the CPU's float32 list (not
    # CUDA's); constant and circular padding keep the input's dtype
    case("pad_reflect_bf16", lambda x: F.pad(x, (1, 1), mode="reflect"), f32(1, 2, 4).to(BF))
    case("pad_replicate_bf16", lambda x: F.pad(x, (1, 1, 1, 1), mode="replicate"), f32(1, 2, 4, 4).to(BF))
    case("pad_constant_bf16", lambda x: F.pad(x, (1, 1)), f32(1, 2, 4).to(BF))
    case("pad_circular_bf16", lambda x: F.pad(x, (1, 1), mode="circular"), f32(1, 2, 4).to(BF))
    # (reflection_pad3d is not on the list)
    case("pad_reflect3d_bf16", lambda x: F.pad(x, (1, 1, 1, 1, 1, 1), mode="reflect"),
         f32(1, 2, 4, 4, 4).to(BF))
    # reciprocal and rsqrt are on CUDA's float32 list; a number divided by a
    # tensor is reciprocal(t) * number
    case("reciprocal_bf16", torch.reciprocal, a.to(BF))
    case("rsqrt_bf16", torch.rsqrt, a.abs().to(BF))
    case("rdiv_bf16", lambda x: 2.0 / x, a.to(BF))
    # the pointwise losses are on both float32 lists; binary_cross_entropy is on
    # the CPU's and refused by CUDA's autocast
    case("l1_loss_bf16", F.l1_loss, a.to(BF), a.to(BF))
    case("smooth_l1_loss_bf16", F.smooth_l1_loss, a.to(BF), a.to(BF))
    case("huber_loss_bf16", F.huber_loss, a.to(BF), a.to(BF))
    case("kl_div_bf16", lambda x, t: F.kl_div(x, t, reduction="batchmean"), a.to(BF), a.softmax(1).to(BF))
    case("binary_cross_entropy_bf16", F.binary_cross_entropy, a.sigmoid().to(BF), a.sigmoid().to(BF))
    # log10 and cosine_similarity are on CUDA's float32 list only; addcmul and
    # addcdiv on its promote list (the widest input's dtype, as without autocast)
    case("log10_bf16", torch.log10, a.abs().to(BF))
    case("cosine_similarity_bf16", F.cosine_similarity, a.to(BF), a.to(BF))
    case("addcmul_bf16_f32", torch.addcmul, a.to(BF), a, a.to(BF))
    case("addcdiv_bf16", torch.addcdiv, a.to(BF), a.to(BF), a.abs().to(BF))
    # group_norm is on CUDA's float32 list (not the CPU's); instance_norm is on
    # neither (a batch norm with float32 parameters beside the input)
    x3 = f32(2, 4, 3).to(BF)
    case("group_norm_bf16", lambda x, w, c: F.group_norm(x, 2, w, c), x3, f32(4), f32(4))
    case("instance_norm_bf16", lambda x, w, c: F.instance_norm(x, weight=w, bias=c), x3, f32(4), f32(4))
    case("instance_norm_running_bf16",
         lambda x, m, v: F.instance_norm(x, running_mean=m, running_var=v), x3, f32(4), f32(4).abs())
    # every upsampling is on CUDA's float32 list (not the CPU's); area is an
    # adaptive average pool, whose 3-d form only is on the CPU's
    case("interpolate_nearest_bf16", lambda x: F.interpolate(x, size=(3, 5)), f32(1, 2, 4, 4).to(BF))
    case("interpolate_bilinear_bf16", lambda x: F.interpolate(x, size=(3, 5), mode="bilinear"),
         f32(1, 2, 4, 4).to(BF))
    case("interpolate_area_bf16", lambda x: F.interpolate(x, size=(3, 5), mode="area"), f32(1, 2, 4, 4).to(BF))
    case("interpolate_area3d_bf16", lambda x: F.interpolate(x, size=(3, 2, 3), mode="area"),
         f32(1, 2, 4, 4, 4).to(BF))
    return cases


def model_cases():
    out = []

    def run(name, model, x, target):
        model.zero_grad()
        with torch.autocast("cpu", dtype=BF):
            y = model(x)
            loss = F.cross_entropy(y, target)
        loss.backward()
        out.append({
            "name": name,
            "params": [[n, tj(p)] for n, p in model.named_parameters()],
            "x": tj(x), "target": [int(t) for t in target],
            "out": tj(y), "loss": tj(loss),
            "grads": [[n, tj(p.grad)] for n, p in model.named_parameters()],
        })

    torch.manual_seed(1)
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    run("mlp", mlp, torch.randn(6, 4), torch.tensor([0, 2, 1, 1, 0, 2]))
    torch.manual_seed(2)
    cnn = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 3 * 3, 3))
    run("cnn", cnn, torch.randn(5, 1, 8, 8), torch.tensor([0, 2, 1, 1, 0]))
    # a transformer encoder layer (post-norm, no dropout) and a classifier over
    # its flattened output: attention and the feed-forward products in bfloat16, the
    # residual sums and layer norms in float32
    torch.manual_seed(3)
    tf = nn.Sequential(nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True),
                       nn.Flatten(), nn.Linear(4 * 8, 3))
    run("transformer", tf, torch.randn(5, 4, 8), torch.tensor([0, 2, 1, 1, 0]))
    return out


def scaler_case(options, grads, unscale_only=()):
    # w starts at [1, -2]; each step's loss is sum(w * c) for a scripted c (so the
    # gradient is c, scaled); some steps put an infinity or a NaN in it. At the steps
    # in unscale_only the gradients are unscaled and the step is skipped before
    # update() (the scale still follows what unscale_ found).
    w = torch.tensor([1.0, -2.0], requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", **options)
    scales, stepped = [], []
    for i, c in enumerate(grads):
        opt.zero_grad()
        loss = (w * torch.tensor(c)).sum()
        scaler.scale(loss).backward()
        before = w.detach().clone()
        if i in unscale_only:
            scaler.unscale_(opt)
        else:
            scaler.step(opt)
        stepped.append(not torch.equal(before, w.detach()))
        scaler.update()
        scales.append(scaler.get_scale())
    sd = scaler.state_dict()
    # infinities and NaNs as text (JSON has no number for them)
    return {"options": options, "unscale_only": list(unscale_only),
            "grads": [[str(x) for x in c] for c in grads], "scales": scales, "stepped": stepped,
            "w": flat(w), "state": {k: float(v) for k, v in sd.items()}}


INF, NAN = float("inf"), float("nan")


def scaler_cases():
    default = scaler_case(
        {"init_scale": 8.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2},
        [[0.5, 1.0], [1.0, INF], [0.25, -0.5], [1.0, 1.0], [NAN, 0.0], [0.5, 0.5], [0.5, 0.5], [-1.0, 2.0]])
    # other factors and interval; steps 3 and 5 unscale and skip the step, one with
    # an infinity (the scale backs off) and one with finite gradients (a good step)
    custom = scaler_case(
        {"init_scale": 16.0, "growth_factor": 3.0, "backoff_factor": 0.25, "growth_interval": 3},
        [[0.5, 1.0], [1.0, 2.0], [0.25, -0.5], [-INF, 1.0], [1.0, 1.0], [0.5, 0.5], [0.5, -0.5],
         [1.0, NAN], [-1.0, 2.0], [0.25, 0.25]],
        unscale_only=(3, 5))
    return default, custom


def scaler_two_optimizers_case():
    # one scaler, two optimizers (w1 with SGD, w2 with Adam); an infinity in w1's
    # gradient at step 2 and a NaN in w2's at step 4: each optimizer skips only its
    # own bad step, and the scale backs off after either
    w1 = torch.tensor([1.0, -2.0], requires_grad=True)
    w2 = torch.tensor([0.5, 3.0], requires_grad=True)
    o1 = torch.optim.SGD([w1], lr=0.1)
    o2 = torch.optim.Adam([w2], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0, growth_interval=2)
    grads = [([0.5, 1.0], [1.0, -1.0]), ([float("inf"), 1.0], [0.5, 0.5]), ([0.25, 0.5], [1.0, 2.0]),
             ([1.0, 1.0], [float("nan"), 1.0]), ([0.5, -0.5], [0.25, 0.25]), ([1.0, 2.0], [-1.0, 1.0])]
    scales, stepped = [], []
    for c1, c2 in grads:
        o1.zero_grad()
        o2.zero_grad()
        loss = (w1 * torch.tensor(c1)).sum() + (w2 * torch.tensor(c2)).sum()
        scaler.scale(loss).backward()
        scaler.unscale_(o2)  # unscaled first, stepped last: the order is free
        b1, b2 = w1.detach().clone(), w2.detach().clone()
        scaler.step(o1)
        scaler.step(o2)
        stepped.append([not torch.equal(b1, w1.detach()), not torch.equal(b2, w2.detach())])
        scaler.update()
        scales.append(scaler.get_scale())
    return {"grads": [[[str(x) for x in c] for c in cs] for cs in grads], "scales": scales,
            "stepped": stepped, "w1": flat(w1), "w2": flat(w2)}


def main():
    default, custom = scaler_cases()
    data = {"torch": torch.__version__.split("+")[0], "dtypes": dtype_cases(),
            "models": model_cases(), "scaler": default, "scaler_custom": custom,
            "scaler_two_optimizers": scaler_two_optimizers_case()}
    with open(os.path.join(HERE, "amp_cases.json"), "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
