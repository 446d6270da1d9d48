"""Golden values for ember's ordering and counting ops (tensor/counting.rs):
msort, kthvalue, searchsorted, bucketize. Writes counting_cases.json beside
this script. Gradients are of the sum of the first output, for float inputs."""
import json, math, os
import torch

torch.manual_seed(0)

def rec(t):
    def enc(v):
        if isinstance(v, float) and math.isnan(v):
            return None
        if isinstance(v, float) and math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return v
    vals = [enc(v) for v in t.detach().reshape(-1).tolist()]
    return {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""), "values": vals}

cases = []
def case(name, fn, *inputs):
    xs = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
    out = fn(*xs)
    out = list(out) if isinstance(out, tuple) else [out]
    grads = []
    if out[0].is_floating_point() and out[0].requires_grad:
        out[0].sum().backward()
        grads = [rec(x.grad) if x.grad is not None else None for x in xs]
    cases.append({"name": name, "inputs": [rec(x) for x in inputs],
                  "outputs": [rec(o) for o in out], "grads": grads})

nan = float("nan")
x = torch.randn(4, 3, dtype=torch.float64)
case("msort", lambda a: torch.msort(a), x)
case("msort_i64", lambda a: torch.msort(a), torch.tensor([[3, 1], [1, 2], [2, 0]]))
y = torch.tensor([[3., 1., 2., 5.], [0., -1., 4., 4.]])
case("kthvalue_2_m1", lambda a: torch.kthvalue(a, 2, -1), y)
case("kthvalue_1_0_keep", lambda a: torch.kthvalue(a, 1, 0, True), y)
case("kthvalue_4_1", lambda a: torch.kthvalue(a, 4, 1), y)
case("kthvalue_i64", lambda a: torch.kthvalue(a, 2, 0), torch.tensor([5, 2, 9, 1]))
seq = torch.tensor([1., 2., 2., 3.])
vals = torch.tensor([[2., 0.], [5., nan], [2.5, 1.]])
case("searchsorted_left", lambda s, v: torch.searchsorted(s, v), seq, vals)
case("searchsorted_right", lambda s, v: torch.searchsorted(s, v, right=True), seq, vals)
seq2 = torch.tensor([[0., 1., 2.], [10., 20., 30.]])
vals2 = torch.tensor([[1., 3.], [5., 20.]])
case("searchsorted_nd", lambda s, v: torch.searchsorted(s, v), seq2, vals2)
case("searchsorted_nd_right", lambda s, v: torch.searchsorted(s, v, right=True), seq2, vals2)
case("searchsorted_i64", lambda s, v: torch.searchsorted(s, v), torch.tensor([1, 3, 5, 7]), torch.tensor([0, 3, 8]))
case("bucketize", lambda v, b: torch.bucketize(v, b), torch.tensor([[0.5, 1.], [3., 9.]]), torch.tensor([1., 3., 5.]))
case("bucketize_right", lambda v, b: torch.bucketize(v, b, right=True), torch.tensor([[0.5, 1.], [3., 9.]]), torch.tensor([1., 3., 5.]))
# long sequences (the binary search's many steps), duplicates, values at,
# between and past the elements, infinities, NaN values, and a sequence with
# NaNs at its end (sorted order), where PyTorch's probes decide
long_seq = torch.sort(torch.randint(0, 60, (300,)).double()).values
long_vals = torch.cat([torch.randint(-5, 65, (40,)).double(), torch.rand(20, dtype=torch.float64) * 60,
                       torch.tensor([nan, float("inf"), -float("inf"), 0., 59.])])
case("searchsorted_long", lambda s, v: torch.searchsorted(s, v), long_seq, long_vals)
case("searchsorted_long_right", lambda s, v: torch.searchsorted(s, v, right=True), long_seq, long_vals)
nan_seq = torch.tensor([1., 2., 2., 4., nan, nan])
nan_vals = torch.tensor([0., 2., 3., 5., nan, float("inf")])
case("searchsorted_nan_seq", lambda s, v: torch.searchsorted(s, v), nan_seq, nan_vals)
case("searchsorted_nan_seq_right", lambda s, v: torch.searchsorted(s, v, right=True), nan_seq, nan_vals)
batch_seq = torch.sort(torch.randint(-100, 100, (3, 77)), dim=1).values
batch_vals = torch.randint(-110, 110, (3, 9))
case("searchsorted_batch_i64", lambda s, v: torch.searchsorted(s, v, right=True), batch_seq, batch_vals)
case("searchsorted_empty_seq", lambda s, v: torch.searchsorted(s, v), torch.zeros(0), torch.tensor([1., nan]))
case("searchsorted_empty_values", lambda s, v: torch.searchsorted(s, v), long_seq, torch.zeros(2, 0, dtype=torch.float64))
case("bucketize_long", lambda v, b: torch.bucketize(v, b), long_vals.reshape(13, 5), long_seq)
# dtypes: the two tensors compare in their promoted dtype; half types, bytes,
# and a 0-d value
case("searchsorted_mixed", lambda s, v: torch.searchsorted(s, v), torch.tensor([1., 2., 3.]), torch.tensor([[0, 2], [3, 4]]))
case("searchsorted_mixed_f64", lambda s, v: torch.searchsorted(s, v, right=True), torch.tensor([1., 2.5, 3.]),
     torch.tensor([2.5, 2.5000001, 3.0], dtype=torch.float64))
half_seq = torch.sort(torch.randn(50)).values
half_vals = torch.cat([torch.randn(20), half_seq[::7]])
case("searchsorted_bf16", lambda s, v: torch.searchsorted(s, v), half_seq.bfloat16(), half_vals.bfloat16())
case("searchsorted_f16_right", lambda s, v: torch.searchsorted(s, v, right=True), half_seq.half(), half_vals.half())
case("searchsorted_u8", lambda s, v: torch.searchsorted(s, v), torch.tensor([1, 4, 4, 200], dtype=torch.uint8),
     torch.tensor([0, 4, 5, 255], dtype=torch.uint8))
case("searchsorted_scalar_value", lambda s, v: torch.searchsorted(s, v), long_seq, torch.tensor(30.5, dtype=torch.float64))

errors = []
def err(name, fn):
    try:
        fn()
    except Exception as e:
        errors.append({"name": name, "message": str(e).split("\n")[0]})
        return
    raise SystemExit(f"{name} did not fail")
err("kthvalue_k_big", lambda: torch.zeros(3).kthvalue(4))
err("kthvalue_k_zero", lambda: torch.zeros(3).kthvalue(0))
err("searchsorted_shape", lambda: torch.searchsorted(torch.zeros(2, 3), torch.zeros(3, 1)))
err("searchsorted_bool", lambda: torch.searchsorted(torch.tensor([False, True]), torch.tensor([True])))
err("bucketize_2d", lambda: torch.bucketize(torch.zeros(3), torch.zeros(2, 2)))

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "counting_cases.json")
with open(out, "w") as f:
    json.dump({"torch": torch.__version__, "cases": cases, "errors": errors}, f, indent=1)
print(len(cases), "cases,", len(errors), "errors")
