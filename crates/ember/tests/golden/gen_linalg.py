"""Golden values for ember::linalg: inv, det, slogdet, solve, cholesky, qr,
eigh, eigvalsh, svd, svdvals, solve_triangular, pinv, matrix_rank,
matrix_power, matrix_norm, lu_factor, lu, multi_dot and lstsq. Writes
linalg_cases.json beside this script.

Each case records its inputs, its arguments, its outputs and the gradients of
a loss over them: the sum of each float output times a recorded weight, except
for eigh and svd, whose vectors are fixed only up to sign: their loss is
sum(values * c1) + sum(V diag(c2) V^T * W) (eigh) or
sum(S * c1) + sum(U diag(c2) Vh * W) (svd), which the signs do not change.

The cases are drawn in order from one seed, so a case added at the end leaves
the earlier ones' inputs as they were. Their outputs depend on the machine's
LAPACK in the last bits (and det_singular's gradient, PyTorch's at a singular
matrix, more than that): the committed file keeps the earlier cases as first
generated and has the later ones (from lu_grad on) appended."""
import json, math, os
import torch

torch.manual_seed(0)
t = torch.tensor
f64 = torch.float64

def num(v):
    if isinstance(v, float):
        if math.isnan(v):
            return None
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
    return v

def rec(x):
    if x.dtype == torch.int32:
        x = x.long()  # lu_factor's pivots: ember's are int64
    return {"shape": list(x.shape), "dtype": str(x.dtype).replace("torch.", ""),
            "values": [num(v) for v in x.detach().reshape(-1).tolist()]}

cases = []

def case(name, op, inputs, args=None, grad=True, loss="weighted"):
    """`op` names the function (ember's and torch.linalg's); `args` its options."""
    args = args or {}
    xs = [x.clone().requires_grad_(grad and x.is_floating_point()) for x in inputs]
    fn = getattr(torch.linalg, op)
    # an infinite order is recorded as "inf"/"-inf" (JSON has no infinity)
    kw = {k: float(v) if k == "ord" and v in ("inf", "-inf") else v for k, v in args.items()}
    out = fn(xs, **kw) if op == "multi_dot" else fn(*xs, **kw)
    if op == "lstsq":
        out = out.solution
    out = list(out) if isinstance(out, tuple) else [out]
    weights, grads = [], []
    if grad:
        if loss == "eigh":
            w, v = out
            n = w.shape[-1]
            c1, c2 = torch.randn(w.shape, dtype=w.dtype), torch.randn(w.shape, dtype=w.dtype)
            W = torch.randn(v.shape, dtype=v.dtype)
            weights = [c1, c2, W]
            L = (w * c1).sum() + (((v * c2.unsqueeze(-2)) @ v.mT) * W).sum()
        elif loss == "svd":
            u, s, vh = out
            c1, c2 = torch.randn(s.shape, dtype=s.dtype), torch.randn(s.shape, dtype=s.dtype)
            k = s.shape[-1]
            W = torch.randn(u.shape[:-1] + (vh.shape[-1],), dtype=s.dtype)
            weights = [c1, c2, W]
            L = (s * c1).sum() + (((u[..., :k] * c2.unsqueeze(-2)) @ vh[..., :k, :]) * W).sum()
        else:
            L = 0
            for o in out:
                if o.is_floating_point() and o.requires_grad:
                    w = torch.randn(o.shape, dtype=o.dtype)
                    weights.append(w)
                    L = L + (o * w).sum()
                else:
                    weights.append(None)
        L.backward()
        grads = [rec(x.grad) if x.grad is not None else None for x in xs]
    cases.append({"name": name, "op": op, "args": args, "inputs": [rec(x) for x in inputs],
                  "outputs": [rec(o) for o in out],
                  "weights": [rec(w) if w is not None else None for w in weights],
                  "loss": loss, "grads": grads})

def errcase(name, op, inputs, args=None):
    try:
        getattr(torch.linalg, op)(*inputs, **(args or {}))
    except Exception as e:
        cases.append({"name": name, "op": op, "args": args or {}, "inputs": [rec(x) for x in inputs],
                      "error": str(e).split("\n")[0]})
        return
    raise SystemExit(f"{name}: no error")

def well(n, *batch, dtype=f64):
    """A well-conditioned square matrix."""
    return torch.randn(*batch, n, n, dtype=dtype) + 3 * torch.eye(n, dtype=dtype)

def spd(n, *batch, dtype=f64):
    a = torch.randn(*batch, n, n, dtype=dtype)
    return a @ a.mT + n * torch.eye(n, dtype=dtype)

def sym(n, *batch, dtype=f64):
    a = torch.randn(*batch, n, n, dtype=dtype)
    return a + a.mT

# inverse and determinants
case("inv", "inv", [well(4)])
case("inv_batch_f32", "inv", [well(3, 2, dtype=torch.float32)])
case("inv_1x1", "inv", [t([[4.]], dtype=f64)])
case("inv_empty", "inv", [torch.zeros(2, 0, 0, dtype=f64)], grad=False)
case("inv_pivots", "inv", [t([[0., 2., 1.], [1., 0., 0.], [3., 1., 5.]], dtype=f64)])
errcase("inv_singular", "inv", [t([[1., 2.], [2., 4.]])])
errcase("inv_singular_batch", "inv", [torch.stack([torch.eye(2), t([[1., 2.], [2., 4.]])])])
errcase("inv_not_square", "inv", [torch.ones(2, 3)])
errcase("inv_1d", "inv", [torch.ones(3)])
errcase("inv_int", "inv", [torch.ones(2, 2, dtype=torch.int64)])
errcase("inv_bf16", "inv", [torch.ones(2, 2, dtype=torch.bfloat16)])
case("det", "det", [well(4)])
case("det_batch_f32", "det", [torch.randn(3, 3, 3)])
case("det_singular", "det", [t([[1., 2., 3.], [2., 4., 6.], [1., 0., 1.]], dtype=f64)])
case("det_1x1", "det", [t([[-2.5]], dtype=f64)])
case("det_0x0", "det", [torch.zeros(0, 0, dtype=f64)], grad=False)
errcase("det_not_square", "det", [torch.ones(2, 3)])
case("slogdet", "slogdet", [t([[0., 2., 1.], [1., 0., 0.], [3., 1., 5.]], dtype=f64)])
case("slogdet_batch", "slogdet", [torch.randn(2, 4, 4, dtype=f64)])
case("slogdet_singular", "slogdet", [t([[1., 2.], [2., 4.]], dtype=f64)], grad=False)

# solving
case("solve", "solve", [well(4), torch.randn(4, 2, dtype=f64)])
case("solve_vector", "solve", [well(3), torch.randn(3, dtype=f64)])
case("solve_batch_vector", "solve", [well(3, 2), torch.randn(2, 3, dtype=f64)])
case("solve_broadcast", "solve", [well(3, 2, 1), torch.randn(4, 3, 2, dtype=f64)])
case("solve_f32", "solve", [well(5, dtype=torch.float32), torch.randn(5, 3)])
case("solve_right", "solve", [well(3), torch.randn(2, 3, dtype=f64)], {"left": False})
errcase("solve_singular", "solve", [t([[1., 2.], [2., 4.]]), torch.ones(2)])
errcase("solve_shapes", "solve", [torch.eye(2), torch.ones(3)])
errcase("solve_shapes_matrix", "solve", [torch.eye(3), torch.ones(2, 2)])
errcase("solve_dtypes", "solve", [torch.eye(2), torch.ones(2, dtype=f64)])
case("solve_triangular_upper", "solve_triangular", [torch.randn(4, 4, dtype=f64).triu() + 4 * torch.eye(4, dtype=f64), torch.randn(4, 3, dtype=f64)], {"upper": True})
case("solve_triangular_lower_right", "solve_triangular", [torch.randn(3, 3, dtype=f64) + 4 * torch.eye(3, dtype=f64), torch.randn(2, 3, dtype=f64)], {"upper": False, "left": False})
case("solve_triangular_unit", "solve_triangular", [torch.randn(2, 3, 3, dtype=f64), torch.randn(2, 3, 2, dtype=f64)], {"upper": False, "unitriangular": True})
errcase("solve_triangular_1d", "solve_triangular", [torch.eye(2), torch.ones(2)], {"upper": True})

# factorizations
case("cholesky", "cholesky", [spd(4)])
case("cholesky_upper", "cholesky", [spd(3)], {"upper": True})
case("cholesky_batch_f32", "cholesky", [spd(3, 2, dtype=torch.float32)])
errcase("cholesky_not_pd", "cholesky", [t([[1., 2.], [2., 1.]])])
errcase("cholesky_not_pd_batch", "cholesky", [torch.stack([torch.eye(2), t([[1., 2.], [2., 1.]])])])
case("qr_tall", "qr", [torch.randn(5, 3, dtype=f64)])
case("qr_square_f32", "qr", [torch.randn(2, 4, 4)])
case("qr_wide", "qr", [torch.randn(3, 5, dtype=f64)])
case("qr_complete_tall", "qr", [torch.randn(4, 2, dtype=f64)], {"mode": "complete"}, grad=False)
case("qr_complete_wide", "qr", [torch.randn(2, 4, dtype=f64)], {"mode": "complete"})
case("qr_r", "qr", [torch.randn(4, 3, dtype=f64)], {"mode": "r"}, grad=False)
case("qr_zero_column", "qr", [t([[0., 1.], [0., 2.], [0., 3.]], dtype=f64)], grad=False)
errcase("qr_mode", "qr", [torch.ones(2, 3)], {"mode": "x"})
case("eigh", "eigh", [sym(4)], loss="eigh")
case("eigh_upper", "eigh", [torch.randn(3, 3, dtype=f64)], {"UPLO": "U"}, loss="eigh")
case("eigh_lower_batch_f32", "eigh", [torch.randn(2, 5, 5)], loss="eigh")
case("eigvalsh", "eigvalsh", [sym(5)])
case("eigvalsh_upper", "eigvalsh", [torch.randn(2, 3, 3, dtype=f64)], {"UPLO": "U"})
errcase("eigh_uplo", "eigh", [torch.ones(2, 2)], {"UPLO": "X"})
errcase("eigh_not_square", "eigh", [torch.ones(2, 3)])
case("svd_tall", "svd", [torch.randn(5, 3, dtype=f64)], {"full_matrices": False}, loss="svd")
case("svd_wide", "svd", [torch.randn(3, 5, dtype=f64)], {"full_matrices": False}, loss="svd")
case("svd_batch_f32", "svd", [torch.randn(2, 4, 4)], {"full_matrices": False}, loss="svd")
case("svd_full", "svd", [torch.randn(4, 2, dtype=f64)], {"full_matrices": True}, grad=False)
case("svd_full_wide", "svd", [torch.randn(2, 3, dtype=f64)], {"full_matrices": True}, grad=False)
case("svdvals", "svdvals", [torch.randn(4, 6, dtype=f64)])
case("svdvals_rank1", "svdvals", [t([[1., 2.], [2., 4.], [3., 6.]], dtype=f64)], grad=False)
errcase("svd_1d", "svd", [torch.ones(3)])
case("lu_factor", "lu_factor", [t([[0., 2., 1.], [1., 0., 0.], [3., 1., 5.]], dtype=f64)], grad=False)
case("lu_factor_batch", "lu_factor", [torch.randn(2, 4, 4)], grad=False)
case("lu", "lu", [torch.randn(4, 4, dtype=f64)], grad=False)
case("lu_tall", "lu", [torch.randn(5, 3, dtype=f64)], grad=False)

# built on them
case("pinv", "pinv", [torch.randn(3, 5, dtype=f64)])
case("pinv_rank_deficient", "pinv", [t([[1., 2., 3.], [2., 4., 6.], [1., 0., 1.]], dtype=f64)], grad=False)
case("matrix_rank", "matrix_rank", [t([[1., 2., 3.], [2., 4., 6.], [1., 0., 1.]], dtype=f64)], grad=False)
case("matrix_rank_batch", "matrix_rank", [torch.stack([torch.eye(3), torch.zeros(3, 3), torch.ones(3, 3)])], grad=False)
for n in [3, 1, 0, -1, -2]:
    case(f"matrix_power_{n}".replace("-", "m"), "matrix_power", [well(3)], {"n": n})
errcase("matrix_power_not_square", "matrix_power", [torch.ones(2, 3)], {"n": 2})
for o in ["fro", "nuc", 1, -1, 2, -2, "inf", "-inf"]:
    case(f"matrix_norm_{o}".replace("-", "m"), "matrix_norm", [torch.randn(3, 4, dtype=f64)], {"ord": o})
case("matrix_norm_keepdim", "matrix_norm", [torch.randn(2, 3, 3)], {"ord": "fro", "keepdim": True})
errcase("matrix_norm_ord", "matrix_norm", [torch.ones(2, 2)], {"ord": 3})
case("multi_dot", "multi_dot", [torch.randn(4, 10, dtype=f64), torch.randn(10, 2, dtype=f64), torch.randn(2, 7, dtype=f64)])
case("multi_dot_vectors", "multi_dot", [torch.randn(3, dtype=f64), torch.randn(3, 4, dtype=f64), torch.randn(4, dtype=f64)])
case("lstsq_tall", "lstsq", [torch.randn(6, 3, dtype=f64), torch.randn(6, 2, dtype=f64)])
case("lstsq_batch", "lstsq", [torch.randn(2, 5, 3, dtype=f64), torch.randn(2, 5, 1, dtype=f64)])
# LU's gradients (L and U of lu; the compact LU of lu_factor): square, tall,
# wide, batched
case("lu_grad", "lu", [torch.randn(4, 4, dtype=f64)])
case("lu_grad_tall", "lu", [torch.randn(5, 3, dtype=f64)])
case("lu_grad_wide", "lu", [torch.randn(3, 5, dtype=f64)])
case("lu_factor_grad", "lu_factor", [torch.randn(4, 4, dtype=f64)])
case("lu_factor_grad_tall", "lu_factor", [torch.randn(5, 3, dtype=f64)])
case("lu_factor_grad_wide", "lu_factor", [torch.randn(3, 5, dtype=f64)])
case("lu_factor_grad_batch_f32", "lu_factor", [torch.randn(2, 3, 3)])

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "linalg_cases.json")
with open(path, "w") as f:
    json.dump(cases, f, separators=(",", ":"))
print(f"{len(cases)} cases -> {path}")
