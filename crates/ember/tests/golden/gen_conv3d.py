"""Golden values for ember's 3-D convolutions and pools: conv3d (strides,
padding as ints and "same", dilation, groups, bias or not, unbatched),
conv_transpose3d, max_pool3d (with indices), avg_pool3d (count_include_pad,
ceil_mode, divisor_override), adaptive_avg_pool3d, adaptive_max_pool3d,
BatchNorm3d and InstanceNorm3d, in float32 and float64. Gradients are of
sum(out * weights), weights a fixed pattern, so that every output position
counts differently. Writes conv3d_cases.json beside this script, with
PyTorch's refusals (the first line of each message)."""
import json, math, os
import torch
import torch.nn.functional as F

torch.manual_seed(0)
f64, f32 = torch.float64, torch.float32


def num(v):
    if isinstance(v, float):
        if math.isnan(v):
            return None
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        # float32 values need no more than 9 significant digits
        return float(f"{v:.17g}")
    return v


def rec(x):
    vals = x.detach().reshape(-1).tolist()
    if x.dtype == f32:
        vals = [float(f"{v:.9g}") for v in vals]
    return {"shape": list(x.shape), "dtype": str(x.dtype).replace("torch.", ""),
            "values": [num(v) for v in vals]}


def dyadic(*shape, dtype=f64):
    """Small values exact in binary (multiples of 1/8), so the sums are short."""
    return (torch.randint(-16, 17, shape) / 8).to(dtype)


def out_weights(y):
    """The fixed pattern the gradient is taken against: 1, 2, ..., 7, 1, ..."""
    n = y.numel()
    return (torch.arange(n) % 7 + 1).reshape(y.shape).to(y.dtype)


cases = []


def case(name, op, args, fn, *inputs):
    xs = [x.clone().requires_grad_(x.is_floating_point()) if x is not None else None
          for x in inputs]
    out = fn(*xs)
    out = list(out) if isinstance(out, tuple) else [out]
    grads = []
    if out[0].is_floating_point() and out[0].requires_grad:
        (out[0] * out_weights(out[0])).sum().backward()
        grads = [rec(x.grad) if x is not None and x.grad is not None else None for x in xs]
    cases.append({"name": name, "op": op, "args": args,
                  "inputs": [rec(x) if x is not None else None for x in inputs],
                  "outputs": [rec(o) for o in out], "grads": grads})


def conv(name, x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    trip = lambda v: list(v) if isinstance(v, tuple) else [v, v, v]
    args = {"stride": trip(stride), "dilation": trip(dilation), "groups": groups}
    if padding == "same":
        args["same"] = True
        args["padding"] = [0, 0, 0]
    else:
        args["padding"] = trip(padding)
    case(name, "conv3d", args,
         lambda x, w, b: F.conv3d(x, w, b, stride, padding, dilation, groups), x, w, b)


conv("basic", dyadic(2, 2, 4, 5, 4), dyadic(3, 2, 2, 3, 2), dyadic(3))
conv("stride_pad", dyadic(2, 2, 5, 4, 5), dyadic(3, 2, 3, 2, 3), dyadic(3),
     stride=(2, 1, 2), padding=(1, 0, 1))
conv("dilation_nobias", dyadic(1, 2, 6, 5, 4), dyadic(2, 2, 2, 2, 2), None,
     padding=(2, 1, 0), dilation=(2, 1, 2))
conv("groups", dyadic(1, 4, 4, 4, 4), dyadic(6, 2, 3, 1, 2), dyadic(6),
     stride=(1, 2, 1), groups=2)
conv("depthwise", dyadic(2, 3, 3, 4, 3), dyadic(3, 1, 2, 2, 2), dyadic(3), padding=1, groups=3)
conv("unbatched", dyadic(2, 4, 4, 4), dyadic(2, 2, 2, 2, 2), dyadic(2))
conv("pointwise_stride", dyadic(2, 3, 5, 4, 3), dyadic(2, 3, 1, 1, 1), dyadic(2), stride=2)
conv("stride_over_kernel", dyadic(1, 2, 7, 6, 5), dyadic(2, 2, 2, 2, 1), None, stride=3, padding=1)
conv("same_even", dyadic(1, 2, 5, 4, 3), dyadic(2, 2, 2, 3, 2), dyadic(2), padding="same")
conv("same_dilated_groups", dyadic(1, 4, 4, 5, 3), dyadic(4, 2, 3, 2, 2), dyadic(4),
     padding="same", dilation=(1, 2, 2), groups=2)
conv("same_unbatched", dyadic(2, 3, 3, 4), dyadic(3, 2, 3, 3, 2), None, padding="same")
# taps that read only padding at some or all output depths
conv("padding_only_taps", dyadic(1, 1, 1, 3, 3), dyadic(2, 1, 3, 1, 1), dyadic(2), padding=(1, 0, 0))
conv("padding_only_taps_strided", dyadic(1, 2, 2, 3, 3), dyadic(1, 2, 3, 1, 2), None,
     stride=(2, 1, 1), padding=(2, 0, 1))
# one output position, with a bias
conv("one_position", dyadic(1, 2, 2, 2, 2), dyadic(3, 2, 2, 2, 2), dyadic(3))
conv("f32", torch.randn(2, 3, 5, 4, 4), torch.randn(4, 3, 2, 3, 2), torch.randn(4),
     stride=(2, 1, 1), padding=(1, 1, 0))
conv("f32_dilated", torch.randn(1, 2, 6, 6, 5), torch.randn(3, 2, 2, 2, 2), None,
     dilation=2, stride=(1, 2, 1))


def convt(name, x, w, b=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    trip = lambda v: list(v) if isinstance(v, tuple) else [v, v, v]
    args = {"stride": trip(stride), "padding": trip(padding),
            "output_padding": trip(output_padding), "dilation": trip(dilation), "groups": groups}
    case(name, "conv_transpose3d", args,
         lambda x, w, b: F.conv_transpose3d(x, w, b, stride, padding, output_padding, groups,
                                            dilation), x, w, b)


convt("t_one_position", dyadic(1, 2, 1, 1, 1), dyadic(2, 3, 1, 1, 1), dyadic(3))
convt("t_cropped_taps", dyadic(1, 1, 1, 2, 2), dyadic(1, 2, 3, 1, 1), dyadic(2), padding=(1, 0, 0))
convt("t_basic", dyadic(2, 2, 3, 3, 2), dyadic(2, 3, 2, 2, 2), dyadic(3))
convt("t_stride_pad", dyadic(1, 2, 3, 2, 3), dyadic(2, 2, 3, 2, 3), dyadic(2),
      stride=(2, 1, 2), padding=(1, 0, 1), output_padding=(1, 0, 0))
convt("t_dilation_groups", dyadic(1, 4, 2, 3, 2), dyadic(4, 1, 2, 2, 2), None,
      stride=(1, 2, 1), dilation=(2, 1, 2), groups=2, output_padding=(1, 1, 1))
convt("t_unbatched", dyadic(2, 2, 3, 2), dyadic(2, 2, 2, 2, 2), dyadic(2), stride=3, padding=1)
convt("t_f32", torch.randn(2, 3, 2, 3, 3), torch.randn(3, 2, 3, 2, 2), torch.randn(2),
      stride=2, padding=(0, 1, 1), output_padding=(1, 0, 1))


def pool(name, op, x, kernel, stride=None, padding=0, dilation=1, ceil_mode=False,
         count_include_pad=True, divisor_override=None):
    trip = lambda v: list(v) if isinstance(v, tuple) else [v, v, v]
    args = {"kernel": trip(kernel), "stride": trip(stride) if stride is not None else None,
            "padding": trip(padding), "dilation": trip(dilation), "ceil_mode": ceil_mode,
            "count_include_pad": count_include_pad, "divisor_override": divisor_override}
    if op == "max_pool3d":
        fn = lambda x: F.max_pool3d(x, kernel, stride, padding, dilation, ceil_mode,
                                    return_indices=True)
    else:
        fn = lambda x: F.avg_pool3d(x, kernel, stride, padding, ceil_mode, count_include_pad,
                                    divisor_override)
    case(name, op, args, fn, x)


r = lambda *s, dtype=f64: torch.randn(*s, dtype=dtype)
pool("max_2", "max_pool3d", r(2, 2, 4, 4, 4), 2)
pool("max_pad", "max_pool3d", r(1, 2, 5, 6, 4), (2, 3, 2), (1, 2, 1), (1, 1, 0))
pool("max_dilation", "max_pool3d", r(1, 1, 7, 6, 6), 2, 1, 1, 2)
pool("max_ceil", "max_pool3d", r(1, 2, 5, 5, 4), 2, 2, 0, 1, True)
pool("max_ceil_pad", "max_pool3d", r(1, 1, 6, 5, 5), 3, 2, 1, 1, True)
pool("max_unbatched", "max_pool3d", r(2, 3, 4, 5), (3, 2, 2), (1, 2, 2))
pool("max_f32", "max_pool3d", r(2, 1, 4, 5, 6, dtype=f32), (2, 2, 3), (2, 1, 2), (1, 1, 1))
ties = (torch.randint(0, 3, (1, 2, 4, 4, 4))).to(f64)
pool("max_ties", "max_pool3d", ties, 2, 1)
pool("avg_2", "avg_pool3d", r(2, 2, 4, 4, 4), 2)
pool("avg_pad", "avg_pool3d", r(1, 2, 5, 6, 5), 3, 2, 1)
pool("avg_pad_nocount", "avg_pool3d", r(1, 2, 5, 6, 5), 3, 2, 1, count_include_pad=False)
pool("avg_ceil", "avg_pool3d", r(1, 1, 5, 6, 7), (2, 3, 3), (2, 2, 2), (1, 1, 0), ceil_mode=True)
pool("avg_ceil_nocount", "avg_pool3d", r(1, 1, 5, 6, 7), (2, 3, 3), (2, 2, 2), (1, 1, 0),
     ceil_mode=True, count_include_pad=False)
pool("avg_divisor", "avg_pool3d", r(1, 2, 5, 4, 4), 3, 2, 1, divisor_override=5)
pool("avg_divisor_ceil", "avg_pool3d", r(1, 1, 5, 5, 4), 2, 2, 1, ceil_mode=True,
     divisor_override=3)
pool("avg_unbatched", "avg_pool3d", r(2, 4, 5, 3), (2, 2, 1), 1)
pool("avg_f32", "avg_pool3d", r(2, 1, 6, 4, 5, dtype=f32), (3, 2, 2), (2, 1, 2), (1, 1, 1),
     ceil_mode=True, count_include_pad=False)

ints = torch.randint(-50, 50, (1, 2, 5, 4, 5))
pool("avg_i64", "avg_pool3d", ints, (2, 3, 2), (2, 2, 1), (1, 1, 0))
pool("avg_i64_nocount_ceil", "avg_pool3d", ints, 3, 2, 1, ceil_mode=True, count_include_pad=False)
pool("avg_i64_divisor", "avg_pool3d", ints, 2, 1, 1, divisor_override=3)


def adaptive(name, op, x, out):
    fn = (lambda x: F.adaptive_max_pool3d(x, out, return_indices=True)) if op.endswith("max") \
        else (lambda x: F.adaptive_avg_pool3d(x, out))
    case(name, "adaptive_" + op + "_pool3d", {"output": list(out)}, fn, x)


adaptive("aavg", "avg", r(2, 2, 5, 7, 4), (2, 3, 2))
adaptive("aavg_one", "avg", r(1, 3, 3, 4, 5), (1, 1, 1))
adaptive("aavg_grow", "avg", r(3, 2, 3, 2), (4, 3, 5))
adaptive("aavg_f32", "avg", r(1, 2, 6, 5, 4, dtype=f32), (4, 2, 3))
adaptive("amax", "max", r(2, 2, 5, 7, 4), (2, 3, 2))
adaptive("amax_grow", "max", r(3, 2, 3, 2), (4, 3, 5))
adaptive("amax_f32", "max", r(1, 2, 6, 5, 4, dtype=f32), (4, 2, 3))

bn = torch.nn.BatchNorm3d(3, dtype=f64)
with torch.no_grad():
    bn.weight.copy_(torch.tensor([1.5, -0.5, 2.0]))
    bn.bias.copy_(torch.tensor([0.25, 0.0, -1.0]))
case("bn3d", "batch_norm3d", {}, lambda x: (bn(x), bn.running_mean.clone(),
                                            bn.running_var.clone()), r(2, 3, 2, 3, 2))
inorm = torch.nn.InstanceNorm3d(2, affine=True, dtype=f64)
with torch.no_grad():
    inorm.weight.copy_(torch.tensor([0.5, 2.0]))
    inorm.bias.copy_(torch.tensor([1.0, -0.5]))
case("in3d", "instance_norm3d", {}, lambda x: inorm(x), r(2, 2, 3, 2, 3))

errors = []


def err(name, fn):
    try:
        fn()
    except Exception as e:
        errors.append({"name": name, "message": str(e).split("\n")[0]})
        return
    raise SystemExit(f"{name} did not fail")


z = torch.zeros
err("conv_rank", lambda: F.conv3d(z(2, 3, 4), z(4, 3, 1, 1, 1)))
err("conv_channels", lambda: F.conv3d(z(1, 2, 4, 4, 4), z(4, 3, 1, 1, 1)))
err("conv_groups_out", lambda: F.conv3d(z(1, 4, 4, 4, 4), z(3, 2, 1, 1, 1), groups=2))
err("conv_groups_zero", lambda: F.conv3d(z(1, 4, 4, 4, 4), z(3, 2, 1, 1, 1), groups=0))
err("conv_kernel_big", lambda: F.conv3d(z(1, 3, 2, 4, 4), z(4, 3, 5, 2, 2), padding=1))
err("conv_kernel_dilated", lambda: F.conv3d(z(1, 3, 5, 4, 4), z(4, 3, 3, 2, 2), dilation=(3, 1, 1)))
err("conv_stride_zero", lambda: F.conv3d(z(1, 3, 4, 4, 4), z(4, 3, 1, 1, 1), stride=0))
err("conv_dilation_zero", lambda: F.conv3d(z(1, 3, 4, 4, 4), z(4, 3, 1, 1, 1), dilation=0))
err("conv_bias", lambda: F.conv3d(z(1, 3, 4, 4, 4), z(4, 3, 1, 1, 1), z(3)))
err("conv_same_strided", lambda: F.conv3d(z(1, 3, 4, 4, 4), z(4, 3, 1, 1, 1), stride=2,
                                          padding="same"))
err("convt_rank", lambda: F.conv_transpose3d(z(3, 4, 4), z(3, 4, 2, 2, 2)))
err("convt_channels", lambda: F.conv_transpose3d(z(1, 2, 4, 4, 4), z(3, 4, 2, 2, 2)))
err("convt_output_padding", lambda: F.conv_transpose3d(z(1, 3, 4, 4, 4), z(3, 4, 2, 2, 2),
                                                       stride=2, output_padding=2))
err("max_rank", lambda: F.max_pool3d(z(3, 4, 4), 2))
err("max_pad", lambda: F.max_pool3d(z(1, 1, 4, 4, 4), 2, padding=2))
err("max_pad_dilated", lambda: F.max_pool3d(z(1, 1, 6, 6, 6), 3, padding=2, dilation=2))
err("max_stride_zero", lambda: F.max_pool3d(z(1, 1, 4, 4, 4), 2, stride=0))
err("max_small", lambda: F.max_pool3d(z(1, 1, 1, 4, 4), 3))
err("avg_rank", lambda: F.avg_pool3d(z(3, 4, 4), 2))
err("avg_pad", lambda: F.avg_pool3d(z(1, 1, 4, 4, 4), 2, padding=2))
err("avg_small", lambda: F.avg_pool3d(z(1, 1, 2, 4, 4), 3, padding=1))
err("avg_u8", lambda: F.avg_pool3d(z(1, 1, 4, 4, 4, dtype=torch.uint8), 2))
err("avg_divisor_zero", lambda: F.avg_pool3d(z(1, 1, 4, 4, 4), 2, divisor_override=0))
err("aavg_rank", lambda: F.adaptive_avg_pool3d(z(3, 4, 4), 2))
err("aavg_empty", lambda: F.adaptive_avg_pool3d(z(1, 1, 0, 4, 4), 2))
err("amax_rank", lambda: F.adaptive_max_pool3d(z(3, 4, 4), 2))
err("amax_empty", lambda: F.adaptive_max_pool3d(z(1, 1, 0, 4, 4), 2))
err("amax_long", lambda: F.adaptive_max_pool3d(z(1, 1, 4, 4, 4, dtype=torch.long), 2))
err("bn3d_rank", lambda: torch.nn.BatchNorm3d(3)(z(2, 3, 4, 4)))
err("in3d_rank", lambda: torch.nn.InstanceNorm3d(3)(z(2, 3, 4)))
err("module_groups", lambda: torch.nn.Conv3d(4, 6, 3, groups=4))
err("module_same_strided", lambda: torch.nn.Conv3d(4, 6, 3, stride=2, padding="same"))

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conv3d_cases.json")
with open(out, "w") as f:
    json.dump({"torch": torch.__version__, "cases": cases, "errors": errors}, f,
              separators=(",", ":"))
print(len(cases), "cases,", len(errors), "errors,", os.path.getsize(out), "bytes")
