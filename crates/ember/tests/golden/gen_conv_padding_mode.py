"""Golden values for the convolution layers' padding modes (`nn.Conv1d/2d/3d`
with padding_mode "reflect", "replicate" and "circular"): the layer's output
and the gradients of its input, weight and bias for sum(out * weights),
weights a fixed pattern, with explicit paddings (one per dim, some zero),
padding="same" (odd and even kernels: the extra on the right), strides,
dilation and groups, batched and unbatched; and PyTorch's refusals (the first
line of each message). Writes conv_padding_mode_cases.json beside this
script."""
import json, os
import torch
import torch.nn as nn

torch.manual_seed(0)
f64 = torch.float64


def rec(x):
    return {"shape": list(x.shape), "dtype": str(x.dtype).replace("torch.", ""),
            "values": x.detach().reshape(-1).tolist()}


def dyadic(*shape):
    """Small values exact in binary (multiples of 1/8)."""
    return (torch.randint(-16, 17, shape) / 8).to(f64)


def out_weights(y):
    n = y.numel()
    return (torch.arange(n) % 7 + 1).reshape(y.shape).to(y.dtype)


cases = []
LAYERS = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}


def case(name, dims, mode, x_shape, cin, cout, kernel, padding, stride=1, dilation=1, groups=1,
         bias=True):
    conv = LAYERS[dims](cin, cout, kernel, stride=stride, padding=padding, dilation=dilation,
                        groups=groups, bias=bias, padding_mode=mode).to(f64)
    with torch.no_grad():
        conv.weight.copy_(dyadic(*conv.weight.shape))
        if bias:
            conv.bias.copy_(dyadic(cout))
    x = dyadic(*x_shape).requires_grad_()
    y = conv(x)
    (y * out_weights(y)).sum().backward()
    tup = lambda v: list(v) if isinstance(v, tuple) else [v] * dims
    cases.append({
        "name": name, "dims": dims, "mode": mode,
        "kernel": tup(kernel), "padding": padding if padding == "same" else tup(padding),
        "stride": tup(stride), "dilation": tup(dilation), "groups": groups,
        "in_channels": cin, "out_channels": cout,
        "x": rec(x), "weight": rec(conv.weight), "bias": rec(conv.bias) if bias else None,
        "out": rec(y), "grad_x": rec(x.grad), "grad_weight": rec(conv.weight.grad),
        "grad_bias": rec(conv.bias.grad) if bias else None,
    })


for mode in ["reflect", "replicate", "circular"]:
    case(f"1d_{mode}", 1, mode, (2, 3, 9), 3, 4, 3, 2)
    case(f"1d_{mode}_same_even", 1, mode, (2, 2, 7), 2, 3, 4, "same", dilation=2)
    case(f"1d_{mode}_unbatched_strided", 1, mode, (2, 8), 2, 2, 3, 1, stride=2, bias=False)
    case(f"2d_{mode}", 2, mode, (2, 2, 6, 5), 2, 4, 3, (1, 2))
    case(f"2d_{mode}_one_dim", 2, mode, (1, 4, 5, 6), 4, 2, (3, 2), (0, 1), stride=(1, 2), groups=2)
    case(f"2d_{mode}_same", 2, mode, (1, 2, 5, 6), 2, 2, (2, 3), "same", bias=False)
    case(f"2d_{mode}_dilated", 2, mode, (1, 1, 7, 7), 1, 2, 3, 2, dilation=2)
    case(f"2d_{mode}_unbatched", 2, mode, (2, 4, 4), 2, 3, 3, 1)
    case(f"3d_{mode}", 3, mode, (1, 2, 4, 5, 4), 2, 3, 3, 1)
    case(f"3d_{mode}_same_mixed", 3, mode, (1, 2, 4, 4, 5), 2, 2, (2, 3, 1), "same", groups=2)
    case(f"3d_{mode}_strided", 3, mode, (2, 1, 5, 4, 4), 1, 2, 2, (1, 0, 1), stride=(2, 1, 2))

errors = {}


def err(name, fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 (PyTorch's message is what is kept)
        errors[name] = str(e).split("\n")[0]
    else:
        raise SystemExit(f"{name}: PyTorch accepted it")


err("bad_mode", lambda: nn.Conv2d(2, 2, 3, padding_mode="mirror"))
# reflection needs the padding smaller than the dim
err("reflect_too_wide", lambda: nn.Conv2d(1, 1, 3, padding=3, padding_mode="reflect")(torch.zeros(1, 1, 3, 3)))
err("circular_too_wide", lambda: nn.Conv1d(1, 1, 3, padding=5, padding_mode="circular")(torch.zeros(1, 1, 3)))

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conv_padding_mode_cases.json")
with open(out, "w") as f:
    json.dump({"torch": torch.__version__, "cases": cases, "errors": errors}, f)
print(f"{len(cases)} cases, {len(errors)} errors -> {out}")
print(json.dumps(errors, indent=1))
