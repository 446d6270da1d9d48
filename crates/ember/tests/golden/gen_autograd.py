"""Golden values for ember's autograd.grad and autograd.backward
(autograd/walk.rs): the gradients each case asks for, and PyTorch's refusals.
Writes autograd_cases.json beside this script. Inputs are float64 unless a
case says otherwise; `None` marks an input that receives no gradient."""
import json, os
import torch

torch.manual_seed(0)


def rec(t):
    if t is None:
        return None
    return {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
            "values": t.detach().reshape(-1).tolist()}


x = torch.randn(3, dtype=torch.float64)
w = torch.randn(3, 2, dtype=torch.float64)
z = torch.randn(2, dtype=torch.float64)
g = torch.randn(3, 2, dtype=torch.float64)
inputs = {"x": x, "w": w, "z": z, "g": g}


def leaves():
    return {k: v.clone().requires_grad_(k != "g") for k, v in inputs.items()}


cases = []


def case(name, fn):
    """fn(leaves) -> list of gradients (tensors or None)."""
    t = leaves()
    out = fn(t)
    cases.append({"name": name, "grads": [rec(o) for o in out],
                  "leaf_grads": {k: rec(v.grad) for k, v in t.items() if k != "g"}})


# an intermediate and a leaf, one scalar output
def chain(t):
    h = t["x"] * 2
    return torch.autograd.grad((h * h).sum(), [h, t["x"]])
case("chain", chain)

# two outputs, the same input twice
case("two_outputs", lambda t: torch.autograd.grad(
    [(t["x"] * t["x"]).sum(), (t["x"].exp()).sum()], [t["x"], t["x"]]))

# a non-scalar output with its gradient
case("grad_outputs", lambda t: torch.autograd.grad(
    t["x"].unsqueeze(1) * t["w"], [t["x"], t["w"]], [t["g"]]))

# an input no output uses, allowed; and materialized as zeros
case("unused_allowed", lambda t: torch.autograd.grad(
    (t["x"] * t["x"]).sum(), [t["x"], t["z"]], allow_unused=True))
case("unused_materialized", lambda t: torch.autograd.grad(
    (t["x"] * t["x"]).sum(), [t["x"], t["z"]], materialize_grads=True))

# a view as the input: the gradient sums over both of its consumers
def through_view(t):
    v = t["w"].t()
    y = (v.sin() * v).sum() + v[1].sum() * 3
    return torch.autograd.grad(y, [v])
case("through_view", through_view)

# an output's gradient in another float dtype is cast to the output's
def cast_grad(t):
    y = t["x"].float() * 2
    return torch.autograd.grad(y, [t["x"]], [torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)])
case("cast_grad_output", cast_grad)

# backward from two tensors at once, into the leaves' .grad
def backward_two(t):
    a = t["x"].unsqueeze(1) * t["w"]
    b = (t["w"] * t["w"]).sum(0)
    torch.autograd.backward([a, b], [t["g"], torch.ones(2, dtype=torch.float64)])
    return []
case("backward_two", backward_two)


errors = []


def err(name, fn):
    t = leaves()
    try:
        fn(t)
    except RuntimeError as e:
        errors.append({"name": name, "phrase": str(e)})
        return
    raise SystemExit(f"{name} did not fail")


err("unused", lambda t: torch.autograd.grad((t["x"] * t["x"]).sum(), [t["x"], t["z"]]))
err("input_without_grad", lambda t: torch.autograd.grad((t["x"] * t["x"]).sum(), [t["g"]]))
err("output_without_grad", lambda t: torch.autograd.grad(t["g"].sum(), [t["x"]]))
err("implicit_non_scalar", lambda t: torch.autograd.grad(t["x"] * 2, [t["x"]]))
err("grad_output_shape", lambda t: torch.autograd.grad(t["x"] * 2, [t["x"]], [t["z"]]))
err("grad_output_count", lambda t: torch.autograd.grad([t["x"] * 2, t["x"].sum()], [t["x"]], [t["x"]]))
err("empty_inputs", lambda t: torch.autograd.grad((t["x"] * 2).sum(), []))
err("backward_shape", lambda t: torch.autograd.backward([t["x"] * 2], [t["z"]]))

out = {"inputs": {k: rec(v) for k, v in inputs.items()}, "cases": cases, "errors": errors}
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "autograd_cases.json"), "w") as f:
    json.dump(out, f, indent=1)
    f.write("\n")
