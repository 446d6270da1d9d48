"""Golden values for ember's added elementwise math and reductions, from PyTorch.

Writes math_cases.json next to this file:
- unary: sinh, cosh, asin, acos, asinh, acosh, atanh, erfc, erfinv, lgamma,
  digamma and polygamma (n = 1, 2, 3) over float32, float64, float16 and
  bfloat16, int64, uint8 and bool inputs: values (domain edges included:
  asin(1.5), atanh(+-1), lgamma at the poles, erfinv(+-1), digamma(+-0)) and
  input gradients for a fixed output gradient; in-place forms; PyTorch's
  refusals.
- composite: logit (with and without eps), logaddexp, logaddexp2, exp2, frac,
  fmax, fmin, copysign, float_power, deg2rad, rad2deg and sinc, with values
  and gradients; PyTorch's refusals.
- reductions: isclose, equal, nansum, nanmean, var_mean, std_mean,
  count_nonzero, aminmax, diff and isin; PyTorch's refusals.
Each value list writes NaN and the infinities as the strings "nan", "inf"
and "-inf". Run from anywhere:
    python3 crates/ember/tests/golden/gen_math.py [SECTION...]
(only the named sections are regenerated; the others are kept).
"""
import json
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
NAMES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
         torch.bfloat16: "bfloat16", torch.int64: "int64", torch.uint8: "uint8", torch.bool: "bool"}


def num(v):
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def tj(t):
    """A tensor as {dtype, shape, values} (exact: half values widen to double)."""
    t = t.detach()
    vals = t.reshape(-1).tolist() if not t.dtype.is_floating_point else t.double().reshape(-1).tolist()
    return {"dtype": NAMES[t.dtype], "shape": list(t.shape), "values": [num(v) for v in vals]}


def message(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - PyTorch's refusals are what is recorded
        return str(e).split("\n")[0]
    raise AssertionError("expected an error")


UNARY = {
    "sinh": (torch.sinh, [0.0, -0.0, 1.0, -2.5, 10.0, 100.0, 1000.0, "inf", "-inf", "nan"], (-3, 3)),
    "cosh": (torch.cosh, [0.0, -0.0, 1.0, -2.5, 10.0, 100.0, 1000.0, "inf", "-inf", "nan"], (-3, 3)),
    "asin": (torch.asin, [-1.0, 1.0, 0.5, -0.3, 1.5, -1.5, 0.0, -0.0, "inf", "nan"], (-0.95, 0.95)),
    "acos": (torch.acos, [-1.0, 1.0, 0.5, -0.3, 1.5, -1.5, 0.0, "nan"], (-0.95, 0.95)),
    "asinh": (torch.asinh, [-3.0, 0.0, -0.0, 1e-8, 1e10, -1e30, "inf", "-inf", "nan"], (-4, 4)),
    "acosh": (torch.acosh, [1.0, 0.5, 2.0, 10.0, 1e10, -1.0, "inf", "nan"], (1.05, 5)),
    "atanh": (torch.atanh, [-1.0, 1.0, 0.5, -0.999, 1.5, 0.0, -0.0, 1e-8, "nan"], (-0.95, 0.95)),
    "erfc": (torch.erfc, [0.0, -0.0, 1.0, -1.0, 5.0, 10.0, 27.0, -5.0, "inf", "-inf", "nan"], (-3, 3)),
    "erfinv": (torch.erfinv, [-1.0, 1.0, 0.0, -0.0, 0.5, -0.9999, 0.999999, 1e-10, 1.5, -1.5, "nan"],
               (-0.95, 0.95)),
    "lgamma": (torch.lgamma, [0.0, -0.0, -1.0, -2.0, -2.5, -0.5, 0.5, 1.0, 2.0, 3.5, 100.0, 1e30,
                              "inf", "-inf", "nan"], (0.2, 6)),
    "digamma": (torch.digamma, [0.0, -0.0, -1.0, -2.0, -2.5, -0.5, 0.5, 1.0, 1.4616321, 10.0, 1e6,
                                "inf", "-inf", "nan"], (0.2, 6)),
    "polygamma1": (lambda t: torch.polygamma(1, t), [0.3, -0.3, 1.0, 5.0, 100.0, -2.5, 1e4, "nan"], (0.2, 6)),
    "polygamma2": (lambda t: torch.polygamma(2, t), [0.3, -0.3, 1.0, 5.0, 100.0, -2.5, 0.0, -1.0, "nan"],
                   (0.2, 6)),
    "polygamma3": (lambda t: torch.polygamma(3, t), [0.3, -0.3, 1.0, 5.0, 100.0, -2.5, "nan"], (0.2, 6)),
}


def to_float(v):
    return float(v) if not isinstance(v, str) else float(v)


def unary_cases():
    """Per op: the edge values in float32 and float64 (values only), random
    values in the op's domain in each float dtype (values and the input
    gradient for the output gradient `grad_out`), small integers as int64 and
    uint8, and bools (values: PyTorch gives float32)."""
    torch.manual_seed(3)
    cases = []
    for name, (fn, edges, (lo, hi)) in UNARY.items():
        edge = torch.tensor([to_float(v) for v in edges], dtype=torch.float64)
        for dt in (torch.float32, torch.float64):
            x = edge.to(dt)
            cases.append({"name": f"{name}_edges_{NAMES[dt]}", "op": name, "x": tj(x), "y": tj(fn(x))})
        base = torch.rand(2, 3, dtype=torch.float64) * (hi - lo) + lo
        for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
            x = base.to(dt).detach().requires_grad_(True)
            y = fn(x)
            g = torch.linspace(-1, 1.3, y.numel(), dtype=torch.float64).reshape(y.shape).to(dt)
            y.backward(g)
            cases.append({"name": f"{name}_{NAMES[dt]}", "op": name, "x": tj(x), "y": tj(y),
                          "grad_out": tj(g), "grad": tj(x.grad)})
        ints = torch.tensor([0, 1, 2, 3, 5], dtype=torch.int64)
        if name in ("asin", "acos", "atanh", "erfinv"):
            ints = torch.tensor([0, 1, -1, 2], dtype=torch.int64)
        for dt in (torch.int64, torch.uint8, torch.bool):
            x = ints.abs().to(dt) if dt == torch.uint8 else ints.to(dt)
            cases.append({"name": f"{name}_{NAMES[dt]}", "op": name, "x": tj(x), "y": tj(fn(x))})
    # in-place forms on float32 and their refusal for an integer tensor
    errors = [{"name": "polygamma_negative", "phrase": message(lambda: torch.polygamma(-1, torch.ones(2)))},
              {"name": "sinh_inplace_int", "phrase": message(lambda: torch.ones(2, dtype=torch.int64).sinh_())},
              {"name": "digamma_inplace_bool",
               "phrase": message(lambda: torch.ones(2, dtype=torch.bool).digamma_())}]
    return {"cases": cases, "errors": errors}


def run_case(out, name, op, inputs, fn, args=None, grad=True):
    """One call of `fn` on `inputs`: its outputs, and, where `grad` and the
    output is a float, the float inputs' gradients for the output gradient
    `grad_out` (linspace(-1, 1.3))."""
    ins = [t.detach().clone().requires_grad_(grad and t.dtype.is_floating_point) for t in inputs]
    res = fn(*ins)
    outs = list(res) if isinstance(res, tuple) else [res]
    case = {"name": name, "op": op, "inputs": [tj(t) for t in inputs], "args": args or {},
            "outputs": [tj(o) if torch.is_tensor(o) else o for o in outs]}
    y = outs[0]
    if grad and torch.is_tensor(y) and y.requires_grad:
        g = torch.linspace(-1, 1.3, y.numel(), dtype=torch.float64).reshape(y.shape).to(y.dtype)
        y.backward(g)
        case["grad_out"] = tj(g)
        case["grads"] = [tj(t.grad) if t.grad is not None else None for t in ins]
    out.append(case)


def composite_cases():
    """One- and two-operand composites: logit (with and without eps),
    logaddexp, logaddexp2, exp2, frac, fmax, fmin, copysign, float_power,
    deg2rad, rad2deg, sinc, over float32 and float64 (and integer inputs
    where PyTorch promotes them): values and gradients; refusals."""
    torch.manual_seed(5)
    out = []
    nan, inf = float("nan"), float("inf")
    for dt in (torch.float32, torch.float64):
        n = NAMES[dt]
        p = torch.tensor([0.1, 0.5, 0.73, 0.999, 0.02, 0.4], dtype=dt)
        run_case(out, f"logit_{n}", "logit", [p], torch.logit)
        run_case(out, f"logit_eps_{n}", "logit", [torch.tensor([0.1, 0.5, 0.05, 0.97, 0.3, 0.7], dtype=dt)],
                 lambda t: torch.logit(t, eps=0.2), {"eps": 0.2})
        run_case(out, f"logit_edges_{n}", "logit", [torch.tensor([0.0, 1.0, -0.5, 1.5, nan], dtype=dt)],
                 torch.logit, grad=False)
        a, b = torch.randn(2, 3, dtype=dt) * 3, torch.randn(3, dtype=dt) * 3
        for op, fn in (("logaddexp", torch.logaddexp), ("logaddexp2", torch.logaddexp2)):
            run_case(out, f"{op}_{n}", op, [a, b], fn)
            e = torch.tensor([inf, -inf, 1000.0, -inf, inf, nan], dtype=dt)
            f = torch.tensor([inf, -inf, 1000.0, 2.0, -inf, 1.0], dtype=dt)
            run_case(out, f"{op}_edges_{n}", op, [e, f], fn, grad=False)
        x = torch.randn(2, 4, dtype=dt) * 4
        run_case(out, f"exp2_{n}", "exp2", [x], torch.exp2)
        run_case(out, f"frac_{n}", "frac", [x], torch.frac)
        run_case(out, f"deg2rad_{n}", "deg2rad", [x * 50], torch.deg2rad)
        run_case(out, f"rad2deg_{n}", "rad2deg", [x], torch.rad2deg)
        run_case(out, f"sinc_{n}", "sinc", [torch.tensor([0.0, 0.5, -1.25, 2.0, 0.05, -3.7], dtype=dt)], torch.sinc)
        u = torch.tensor([1.0, nan, 2.0, nan, -1.0, 3.0], dtype=dt)
        v = torch.tensor([0.5, 4.0, nan, nan, -1.0, 3.5], dtype=dt)
        run_case(out, f"fmax_{n}", "fmax", [u, v], torch.fmax)
        run_case(out, f"fmin_{n}", "fmin", [u, v], torch.fmin)
        c = torch.tensor([1.5, -2.0, 0.0, 3.0, -4.0, 2.5], dtype=dt)
        s = torch.tensor([-1.0, 2.0, -0.0, 0.0, -inf, -3.0], dtype=dt)
        run_case(out, f"copysign_{n}", "copysign", [c, s], torch.copysign)
        base = torch.rand(5, dtype=dt) * 3 + 0.1
        run_case(out, f"float_power_scalar_{n}", "float_power", [base], lambda t: torch.float_power(t, 2.5),
                 {"exponent": 2.5})
        run_case(out, f"float_power_tensor_{n}", "float_power", [base, torch.rand(5, dtype=dt) * 2],
                 torch.float_power)
    i = torch.tensor([0, 1, -2, 3], dtype=torch.int64)
    for op, fn in (("exp2", torch.exp2), ("deg2rad", torch.deg2rad), ("rad2deg", torch.rad2deg),
                   ("sinc", torch.sinc), ("logit", torch.logit)):
        run_case(out, f"{op}_int64", op, [i], fn)
    run_case(out, "copysign_int64", "copysign", [i, -i], torch.copysign)
    run_case(out, "fmax_int64", "fmax", [i, i.flip(0)], torch.fmax)
    run_case(out, "float_power_int64", "float_power", [i, i.abs()], torch.float_power)
    errors = [{"name": "frac_int", "phrase": message(lambda: torch.frac(i))},
              {"name": "logaddexp_int", "phrase": message(lambda: torch.logaddexp(i, i))}]
    return {"cases": out, "errors": errors}


def reduction_cases():
    """nansum, nanmean, var_mean, std_mean (corrections 1 and 0),
    count_nonzero, aminmax, diff (n, prepend, append, bools), isin (invert),
    isclose (equal_nan) and equal: outputs, and gradients of the first
    output; refusals."""
    torch.manual_seed(6)
    out = []
    nan = float("nan")
    for dt in (torch.float32, torch.float64):
        n = NAMES[dt]
        x = torch.randn(3, 4, dtype=dt)
        x[0, 1] = nan
        x[2, 3] = nan
        run_case(out, f"nansum_{n}", "nansum", [x], lambda t: torch.nansum(t, 1), {"dim": 1})
        run_case(out, f"nansum_all_{n}", "nansum", [x], torch.nansum, {})
        run_case(out, f"nanmean_{n}", "nanmean", [x], lambda t: torch.nanmean(t, 0, keepdim=True),
                 {"dim": 0, "keepdim": True})
        y = torch.randn(3, 5, dtype=dt)
        for corr in (1, 0):
            run_case(out, f"var_mean_c{corr}_{n}", "var_mean", [y], lambda t: torch.var_mean(t, 1, correction=corr),
                     {"dim": 1, "correction": corr})
            run_case(out, f"std_mean_c{corr}_{n}", "std_mean", [y], lambda t: torch.std_mean(t, 0, correction=corr),
                     {"dim": 0, "correction": corr})
        z = torch.tensor([[0.0, 1.0, -2.0], [3.0, 0.0, 0.5]], dtype=dt)
        run_case(out, f"aminmax_dim_{n}", "aminmax", [z], lambda t: torch.aminmax(t, dim=1), {"dim": 1})
        run_case(out, f"aminmax_all_keepdim_{n}", "aminmax", [z], lambda t: torch.aminmax(t, keepdim=True),
                 {"keepdim": True}, grad=False)
        w = torch.randn(3, 5, dtype=dt)
        run_case(out, f"diff_{n}", "diff", [w], lambda t: torch.diff(t), {"n": 1, "dim": -1})
        run_case(out, f"diff_n2_dim0_{n}", "diff", [w], lambda t: torch.diff(t, n=2, dim=0), {"n": 2, "dim": 0})
        pre, app = torch.randn(3, 2, dtype=dt), torch.randn(3, 1, dtype=dt)
        run_case(out, f"diff_prepend_append_{n}", "diff", [w, pre, app],
                 lambda t, p, a: torch.diff(t, n=3, dim=1, prepend=p, append=a), {"n": 3, "dim": 1})
        a = torch.tensor([1.0, nan, 2.0, float("inf"), 1e-9, 100.0], dtype=dt)
        b = torch.tensor([1.0 + 1e-6, nan, 2.1, float("inf"), 0.0, 100.001], dtype=dt)
        for eq_nan in (False, True):
            run_case(out, f"isclose_{eq_nan}_{n}", "isclose", [a, b],
                     lambda p, q: torch.isclose(p, q, rtol=1e-5, atol=1e-8, equal_nan=eq_nan),
                     {"rtol": 1e-5, "atol": 1e-8, "equal_nan": eq_nan}, grad=False)
    i = torch.tensor([[0, 3, 0, -1], [2, 0, 0, 5]], dtype=torch.int64)
    run_case(out, "nansum_int64", "nansum", [i], lambda t: torch.nansum(t, 1), {"dim": 1})
    run_case(out, "count_nonzero_dim", "count_nonzero", [i], lambda t: torch.count_nonzero(t, 1), {"dim": 1})
    run_case(out, "count_nonzero_all", "count_nonzero", [i], torch.count_nonzero, {})
    run_case(out, "count_nonzero_nan", "count_nonzero", [torch.tensor([0.0, nan, -0.0, 2.0])],
             torch.count_nonzero, {})
    run_case(out, "aminmax_int64", "aminmax", [i], lambda t: torch.aminmax(t, dim=0), {"dim": 0})
    run_case(out, "diff_int64", "diff", [i], lambda t: torch.diff(t, n=2), {"n": 2, "dim": -1})
    run_case(out, "diff_bool", "diff", [torch.tensor([True, False, False, True, True])], torch.diff,
             {"n": 1, "dim": -1})
    run_case(out, "isin", "isin", [i, torch.tensor([5, 0, 7])], torch.isin, {"invert": False})
    run_case(out, "isin_invert_float", "isin", [torch.tensor([1.0, nan, 2.5, 3.0]), torch.tensor([2.5, nan, 1.0])],
             lambda p, q: torch.isin(p, q, invert=True), {"invert": True})
    f = torch.tensor([1.0, 2.0])
    run_case(out, "equal_same", "equal", [f, f.clone()], torch.equal)
    run_case(out, "equal_shape", "equal", [f, torch.tensor([1.0, 2.0, 3.0])], torch.equal)
    run_case(out, "equal_nan", "equal", [torch.tensor([nan]), torch.tensor([nan])], torch.equal)
    run_case(out, "equal_dtypes", "equal", [f, torch.tensor([1, 2])], torch.equal)
    errors = [{"name": "nanmean_int", "phrase": message(lambda: torch.nanmean(i))},
              {"name": "var_mean_int", "phrase": message(lambda: torch.var_mean(i))},
              {"name": "isclose_dtypes", "phrase": message(lambda: torch.isclose(f, torch.tensor([1, 2])))},
              {"name": "isclose_rtol", "phrase": message(lambda: torch.isclose(f, f, rtol=-1.0))},
              {"name": "diff_0d", "phrase": message(lambda: torch.diff(torch.tensor(1.0)))}]
    return {"cases": out, "errors": errors}


SECTIONS = {"unary": unary_cases, "composite": composite_cases, "reductions": reduction_cases}


def main():
    path = os.path.join(HERE, "math_cases.json")
    only = sys.argv[1:]
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        sys.exit(f"unknown sections {unknown}; known: {list(SECTIONS)}")
    data = {}
    if only and os.path.exists(path):
        with open(path) as f:
            data = json.load(f)
    data["torch"] = torch.__version__
    for name, make in SECTIONS.items():
        if not only or name in only:
            data[name] = make()
    with open(path, "w") as f:
        json.dump(data, f, separators=(",", ":"), allow_nan=False)
        f.write("\n")


if __name__ == "__main__":
    main()
