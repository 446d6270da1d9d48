"""Golden values for ember's tensor/more_ops.rs and tensor/more_products.rs:
cummax, cummin, logcumsumexp, hypot, heaviside, the bitwise ops and shifts,
cross, kron, tensordot, baddbmm, addbmm, addmv, addr, cdist, argwhere,
bincount and histc. Writes more_ops_cases.json beside this script. Gradients
are of the sum of the first output, for float inputs (none where PyTorch has
no derivative)."""
import json, math, os
import torch

torch.manual_seed(0)
nan, inf = float("nan"), float("inf")
t = torch.tensor

def num(v):
    if isinstance(v, float):
        if math.isnan(v):
            return None
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
    return v

def rec(x):
    return {"shape": list(x.shape), "dtype": str(x.dtype).replace("torch.", ""),
            "values": [num(v) for v in x.detach().reshape(-1).tolist()]}

cases = []
def case(name, fn, *inputs, grad=True):
    xs = [x.clone().requires_grad_(grad and x.is_floating_point()) for x in inputs]
    out = fn(*xs)
    out = list(out) if isinstance(out, tuple) else [out]
    grads = []
    if grad and out[0].is_floating_point() and out[0].requires_grad:
        out[0].sum().backward()
        grads = [rec(x.grad) if x.grad is not None else None for x in xs]
    cases.append({"name": name, "inputs": [rec(x) for x in inputs],
                  "outputs": [rec(o) for o in out], "grads": grads})

# running extremes
x = torch.randn(3, 5, dtype=torch.float64)
x[1, 3] = x[1, 1]
case("cummax_1", lambda a: torch.cummax(a, 1), x)
case("cummin_0", lambda a: torch.cummin(a, 0), x)
case("cummax_nan", lambda a: torch.cummax(a, 0), t([1., 3., 3., 2., nan, 5., nan]))
case("cummin_nan", lambda a: torch.cummin(a, -1), t([[2., nan, 1., 1.], [4., 4., -1., nan]]))
case("cummax_m1", lambda a: torch.cummax(a, -1), torch.randn(2, 3, 4).round())
case("cummin_i64", lambda a: torch.cummin(a, 0), t([[3, 1], [1, 2], [1, 0], [5, 0]]))
case("cummax_bool", lambda a: torch.cummax(a, 0), t([True, False, True]))
case("cummax_0d", lambda a: torch.cummax(a, 0), t(2.5, dtype=torch.float64))
case("cummin_empty", lambda a: torch.cummin(a, 0), torch.zeros(0, 3))
case("logcumsumexp_1", lambda a: torch.logcumsumexp(a, 1), torch.randn(3, 6, dtype=torch.float64))
case("logcumsumexp_big", lambda a: torch.logcumsumexp(a, 0), t([1000., -1000., 999., 0., 1001.], dtype=torch.float64))
case("logcumsumexp_f32", lambda a: torch.logcumsumexp(a, -2), torch.randn(5, 2) * 30)
case("logcumsumexp_inf", lambda a: torch.logcumsumexp(a, 0), t([-inf, -inf, 1000., 0.], dtype=torch.float64))
case("logcumsumexp_0d", lambda a: torch.logcumsumexp(a, 0), t(0.5, dtype=torch.float64))
case("cummax_empty_dim", lambda a: torch.cummax(a, 1), torch.zeros(2, 0, dtype=torch.float64))
case("logcumsumexp_empty", lambda a: torch.logcumsumexp(a, 0), torch.zeros(0, dtype=torch.float64))
case("logcumsumexp_nan", lambda a: torch.logcumsumexp(a, 1), t([[1., nan, 2.], [0., 1., -inf]], dtype=torch.float64))

# elementwise
case("hypot", lambda a, b: torch.hypot(a, b), torch.randn(3, 1, dtype=torch.float64), torch.randn(4, dtype=torch.float64))
case("hypot_f32_big", lambda a, b: torch.hypot(a, b), t([3e30, 0., -4., 1e-30]), t([4e30, 0.5, 3., 1e-30]))
case("hypot_mixed", lambda a, b: torch.hypot(a, b), t([1., -2.]), t([2., 2.], dtype=torch.float64))
case("hypot_inf", lambda a, b: torch.hypot(a, b), t([inf, nan, -inf, 1.], dtype=torch.float64), t([nan, 1., 2., nan], dtype=torch.float64), grad=False)
case("hypot_0d", lambda a, b: torch.hypot(a, b), t(3., dtype=torch.float64), torch.randn(2, dtype=torch.float64))
case("heaviside_0d", lambda a, b: torch.heaviside(a, b), t(0.), t(0.7), grad=False)
case("heaviside", lambda a, b: torch.heaviside(a, b), t([[nan, 0., -1.5], [2., -0., 0.]], dtype=torch.float64), t([0.5, 2., 3.], dtype=torch.float64), grad=False)
case("heaviside_i64", lambda a, b: torch.heaviside(a, b), t([1, 0, -2]), t([7]))
big = t([-7, 3, 2**62 + 5, -2**63, 255, -1, 0, 12345678901])
other = t([5, -6, 2**40 + 1, -1, 15, 2**63 - 1, -3, 987654321])
for op in ["and", "or", "xor"]:
    f = getattr(torch, "bitwise_" + op)
    case(f"bitwise_{op}_i64", f, big, other)
    case(f"bitwise_{op}_u8", f, t([200, 3, 255, 0], dtype=torch.uint8), t([[170], [15]], dtype=torch.uint8))
    case(f"bitwise_{op}_bool", f, t([True, True, False, False]), t([True, False, True, False]))
case("bitwise_and_bool_u8", torch.bitwise_and, t([True, False, True]), t([3, 2, 254], dtype=torch.uint8))
case("bitwise_or_i64_u8", torch.bitwise_or, t([[-8], [1024]]), t([1, 2, 255], dtype=torch.uint8))
case("bitwise_and_empty", torch.bitwise_and, torch.zeros(0, 2, dtype=torch.int64), t([3, 5]))
case("bitwise_and_scalar", lambda a: torch.bitwise_and(a, 6), big)
case("bitwise_xor_bool_scalar", lambda a: torch.bitwise_xor(a, 3), t([True, False]))
case("right_shift_scalar", lambda a: torch.bitwise_right_shift(a, 2), t([200, 7], dtype=torch.uint8))
case("bitwise_not_i64", torch.bitwise_not, big)
case("bitwise_not_u8", torch.bitwise_not, t([0, 1, 200, 255], dtype=torch.uint8))
case("bitwise_not_bool", torch.bitwise_not, t([True, False]))
a = t([5, -5, 7, -1, 1, 2**62, -3, 9, -9])
b = t([0, 1, 63, 64, -1, 1, 62, 3, 100])
case("left_shift_i64", torch.bitwise_left_shift, a, b)
case("right_shift_i64", torch.bitwise_right_shift, a, b)
case("left_shift_u8", torch.bitwise_left_shift, t([200, 3, 1, 255], dtype=torch.uint8), t([1, 8, 7, 4], dtype=torch.uint8))
case("right_shift_u8", torch.bitwise_right_shift, t([200, 3, 128, 255], dtype=torch.uint8), t([1, 9, 7, 4], dtype=torch.uint8))
case("left_shift_0d", torch.bitwise_left_shift, t([[1, -2], [3, 4]]), t(3))

# products
f64 = torch.float64
r = lambda *s: torch.randn(*s, dtype=f64)
case("cross_m1", lambda a, b: torch.linalg.cross(a, b), r(4, 3), r(4, 3))
case("cross_0_bcast", lambda a, b: torch.linalg.cross(a, b, dim=0), torch.randn(3, 2), torch.randn(3, 1))
case("cross_i64", lambda a, b: torch.linalg.cross(a, b), t([[1, 2, 3], [-4, 0, 5]]), t([[2, -1, 7], [3, 3, 3]]))
case("cross_empty", lambda a, b: torch.linalg.cross(a, b), torch.zeros(0, 3, dtype=f64), torch.zeros(0, 3, dtype=f64))
case("kron_empty", torch.kron, torch.zeros(0, 2, dtype=f64), r(2, 2))
case("kron_2d", torch.kron, r(2, 3), r(2, 2))
case("kron_rank", torch.kron, torch.randn(2, 3), torch.randn(4))
case("kron_0d", torch.kron, t(2.5, dtype=f64), r(3))
case("tensordot_2", lambda a, b: torch.tensordot(a, b, ([1, 2], [1, 0])), r(2, 3, 4), r(4, 3, 5))
case("tensordot_neg", lambda a, b: torch.tensordot(a, b, ([-1], [0])), r(2, 3), r(3, 2, 2))
case("tensordot_none", lambda a, b: torch.tensordot(a, b, ([], [])), torch.randn(2), torch.randn(3))
case("baddbmm", lambda s, a, b: torch.baddbmm(s, a, b, beta=0.5, alpha=2.0), r(4), r(2, 3, 5), r(2, 5, 4))
case("baddbmm_beta0", lambda s, a, b: torch.baddbmm(s, a, b, beta=0.0), t([[nan, 1.]]), torch.randn(3, 2, 4), torch.randn(3, 4, 2))
case("addbmm", lambda s, a, b: torch.addbmm(s, a, b, alpha=-1.5), r(3, 4), r(2, 3, 5), r(2, 5, 4))
case("addmv", lambda s, m, v: torch.addmv(s, m, v, beta=2.0, alpha=0.5), r(3), r(3, 4), r(4))
case("addmv_f32", lambda s, m, v: torch.addmv(s, m, v), torch.randn(1), torch.randn(2, 3), torch.randn(3))
case("addmv_i64", lambda s, m, v: torch.addmv(s, m, v, beta=1.5, alpha=2.5), t([3, 4]), t([[1, 2], [3, 4]]), t([1, 1]))
case("addr", lambda s, a, b: torch.addr(s, a, b), r(3, 1), r(3), r(2))
case("addr_i64", lambda s, a, b: torch.addr(s, a, b, beta=2, alpha=3), t([[1, 2], [3, 4]]), t([1, -2]), t([5, 6]))
x1 = r(4, 3)
x2 = r(5, 3)
x2[0] = x1[1]
case("cdist_2", lambda a, b: torch.cdist(a, b), x1, x2)
case("cdist_empty", lambda a, b: torch.cdist(a, b), torch.zeros(0, 3, dtype=f64), r(2, 3))
case("cdist_mm", lambda a, b: torch.cdist(a, b), r(30, 4), r(7, 4))
case("cdist_1_batch", lambda a, b: torch.cdist(a, b, p=1), torch.randn(2, 3, 4), torch.randn(1, 5, 4))
case("cdist_inf", lambda a, b: torch.cdist(a, b, p=float("inf")), r(3, 4), r(2, 4))
case("cdist_0", lambda a, b: torch.cdist(a, b, p=0), (r(3, 4) * 2).round(), (r(2, 4) * 2).round())
case("cdist_3", lambda a, b: torch.cdist(a, b, p=3), r(3, 4), r(2, 4))
case("cdist_half", lambda a, b: torch.cdist(a, b, p=0.5), r(3, 4), r(2, 4))

# counts
case("argwhere", torch.argwhere, t([[0., 1.5], [nan, 0.]]))
case("argwhere_i64", torch.argwhere, t([[[0, 3], [1, 0]], [[0, 0], [0, 9]]]))
case("argwhere_0d", torch.argwhere, t(3.))
case("argwhere_0d_zero", torch.argwhere, t(0.))
case("argwhere_empty", torch.argwhere, torch.zeros(0, 2))
case("bincount", torch.bincount, t([1, 1, 3, 0, 7]))
case("bincount_minlength", lambda x: torch.bincount(x, minlength=10), t([1, 1, 3, 0, 7]))
case("bincount_w32", lambda x, w: torch.bincount(x, w), t([2, 0, 2]), t([0.5, 1., 2.]), grad=False)
case("bincount_w_i64", lambda x, w: torch.bincount(x, w, minlength=5), t([2, 0, 2]), t([3, 1, 4]), grad=False)
case("bincount_empty", torch.bincount, t([], dtype=torch.int64))
case("bincount_u8", torch.bincount, t([3, 0, 3], dtype=torch.uint8))
case("histc", lambda x: torch.histc(x, 7, -1, 1), r(50), grad=False)
case("histc_auto", lambda x: torch.histc(x, 4), torch.randn(20), grad=False)
case("histc_same", lambda x: torch.histc(x, 3), t([2., 2.], dtype=f64), grad=False)
def on_edges(bins, lo, hi, dtype):
    x = torch.linspace(lo, hi, bins * 3 + 1, dtype=f64)
    e = t([lo + (hi - lo) * k / bins for k in range(bins + 1)], dtype=f64)
    return torch.cat([x, e]).to(dtype)
case("histc_edges", lambda x: torch.histc(x, 10, 0.1, 0.7), on_edges(10, 0.1, 0.7, f64), grad=False)
case("histc_edges_f32", lambda x: torch.histc(x, 13, 0.1, 0.7), on_edges(13, 0.1, 0.7, torch.float32), grad=False)
case("histc_nan", lambda x: torch.histc(x, 2, 0, 1), t([nan, 1., 5., 0.5, 1., -0.1, 0.], dtype=f64), grad=False)

errors = []
def err(name, fn):
    try:
        fn()
    except Exception as e:
        errors.append({"name": name, "message": str(e).split("\n")[0]})
        return
    raise SystemExit(f"{name} did not fail")
err("cummax_dim", lambda: torch.cummax(torch.zeros(3), 1))
err("logcumsumexp_i64", lambda: torch.logcumsumexp(t([1, 2]), 0))
err("hypot_i64", lambda: torch.hypot(t([1]), t([1])))
err("heaviside_dtypes", lambda: torch.heaviside(t([1.]), t([1.], dtype=torch.float64)))
err("heaviside_backward", lambda: torch.heaviside(t([1., 0.], requires_grad=True), t([.5])).sum().backward())
err("bitwise_and_f32", lambda: torch.bitwise_and(t([1.]), t([1.])))
err("bitwise_or_f32_i64", lambda: torch.bitwise_or(t([1]), t([1.])))
err("bitwise_xor_f64", lambda: torch.bitwise_xor(t([1.], dtype=torch.float64), t([1], dtype=torch.float64)))
err("bitwise_not_f32", lambda: torch.bitwise_not(t([1.])))
err("left_shift_bool", lambda: torch.bitwise_left_shift(t([True]), t([True])))
err("right_shift_f32", lambda: torch.bitwise_right_shift(t([1.]), t([1.])))
z = torch.zeros
err("cross_len", lambda: torch.linalg.cross(z(2, 2), z(2, 2)))
err("cross_dtype", lambda: torch.linalg.cross(z(3), z(3, dtype=torch.float64)))
err("cross_rank", lambda: torch.linalg.cross(z(2, 3), z(3)))
err("tensordot_size", lambda: torch.tensordot(z(2, 3), z(2, 3), ([1], [0])))
err("tensordot_len", lambda: torch.tensordot(z(2, 3), z(3, 2), ([1, 0], [0])))
err("baddbmm_3d", lambda: torch.baddbmm(z(2, 2), z(2, 2), z(2, 2, 2)))
err("baddbmm_shape", lambda: torch.baddbmm(z(2, 2), z(2, 2, 3), z(2, 2, 2)))
err("baddbmm_dtype", lambda: torch.baddbmm(z(2, 2, 2), z(2, 2, 3), z(2, 3, 2, dtype=torch.float64)))
err("addbmm_3d", lambda: torch.addbmm(z(2, 2), z(2, 2), z(2, 2, 2)))
err("addmv_size", lambda: torch.addmv(z(2), z(2, 3), z(2)))
err("addmv_rank", lambda: torch.addmv(z(2), z(2), z(2)))
err("addr_1d", lambda: torch.addr(z(2, 2), z(2, 2), z(2)))
err("cdist_cols", lambda: torch.cdist(z(2, 3), z(2, 4)))
err("cdist_p", lambda: torch.cdist(z(2, 3), z(2, 3), p=-1))
err("cdist_long", lambda: torch.cdist(z(2, 3, dtype=torch.long), z(2, 3, dtype=torch.long)))
err("cdist_1d", lambda: torch.cdist(z(3), z(3)))
err("bincount_neg", lambda: torch.bincount(t([1, -1])))
err("bincount_2d", lambda: torch.bincount(t([[1]])))
err("bincount_float", lambda: torch.bincount(t([1.])))
err("bincount_backward", lambda: torch.bincount(t([0, 1]), t([1., 2.], requires_grad=True)).sum().backward())
err("bincount_weights", lambda: torch.bincount(t([1, 2]), weights=t([1.])))
err("bincount_minlength", lambda: torch.bincount(t([1, 2]), minlength=-1))
err("histc_long", lambda: torch.histc(t([1, 2]), bins=3))
err("histc_bins", lambda: torch.histc(t([1., 2.]), bins=0))
err("histc_minmax", lambda: torch.histc(t([1., 2.]), bins=3, min=3, max=1))
err("histc_inf", lambda: torch.histc(t([inf, 1.]), bins=2))

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "more_ops_cases.json")
with open(out, "w") as f:
    json.dump({"torch": torch.__version__, "cases": cases, "errors": errors}, f, indent=1)
print(len(cases), "cases,", len(errors), "errors")
