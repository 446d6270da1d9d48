"""Golden values for ember's shape, diagonal and index helpers, from PyTorch.

Writes ops_cases.json next to this file:
- reshaping: expand_as, view_as, reshape_as, type_as, movedim/moveaxis,
  swapaxes, ravel, unflatten, tile, repeat_interleave (counts and tensors),
  hstack/vstack/dstack/column_stack, atleast_1d/2d/3d, tensor_split and
  hsplit/vsplit/dsplit, rot90;
- diagonals: diagonal, diag, diag_embed, trace, block_diag, cartesian_prod,
  meshgrid, tril_indices/triu_indices, logspace;
- index: take_along_dim, take, index_fill, index_copy, scatter (src and
  value) and scatter_reduce (sum, mean, amax, amin; include_self or not).
Each case names the call (tests/tensor/reshaping.rs builds it by name), its
inputs (shape, dtype, values), every output, and the gradient of each float
input for the output gradients linspace(-1, 1) (null where the input is not
float). Indices are unique where a gradient would depend on which duplicate
wins (PyTorch leaves that unspecified).
- advanced: advanced indexing, x[...] with int64 and bool index tensors mixed
  with positions, ranges, None and an ellipsis (reads), torch.index_put
  (with and without accumulate) and x[...] = v on a clone (writes), and its
  refusals (advanced.errors);
- errors: PyTorch's message for refused arguments (ember's message contains
  the recorded phrase).
Run from anywhere: python3 crates/ember/tests/golden/gen_ops.py [SECTION...]
(only the named sections are regenerated; the others are kept).
"""
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
D = torch.float64


def tj(t):
    t = t.detach()
    vals = t.reshape(-1).tolist()
    if t.dtype.is_floating_point:
        vals = [float(v) if v == v else "nan" for v in vals]
    else:
        vals = [int(v) for v in vals]
    return {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""), "values": vals}


def ramp(*shape, dtype=D, scale=0.37):
    n = 1
    for s in shape:
        n *= s
    t = torch.sin(torch.arange(n, dtype=torch.float64) * scale + 0.3) * 3
    if dtype == torch.bool:
        return (t > 0).reshape(shape)
    if not dtype.is_floating_point:
        return t.round().to(dtype).reshape(shape)
    return t.to(dtype).reshape(shape)


def ints(values, shape=None):
    t = torch.tensor(values, dtype=torch.int64)
    return t.reshape(shape) if shape is not None else t


def collect(cases, name, fn, *inputs, grad=True):
    """fn(*inputs) -> tensor or list; records outputs and float inputs' grads
    (none without `grad`)."""
    ins = [i.clone().requires_grad_(grad and i.dtype.is_floating_point) for i in inputs]
    out = fn(*ins)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    loss = None
    for o in outs:
        if o.dtype.is_floating_point and o.requires_grad:
            w = torch.linspace(-1, 1, o.numel(), dtype=o.dtype).reshape(o.shape)
            term = (o * w).sum()
            loss = term if loss is None else loss + term
    grads = [None] * len(ins)
    if loss is not None:
        loss.backward()
        grads = [tj(i.grad) if i.grad is not None else (tj(torch.zeros_like(i)) if i.requires_grad else None)
                 for i in ins]
    cases.append({"name": name, "inputs": [tj(i) for i in inputs], "outputs": [tj(o) for o in outs],
                  "grads": grads})


def reshaping_cases():
    c = []
    collect(c, "expand_as", lambda x, o: x.expand_as(o), ramp(3, 1), ramp(2, 3, 4))
    collect(c, "view_as", lambda x, o: x.view_as(o), ramp(2, 6), ramp(3, 4, dtype=torch.int64))
    collect(c, "reshape_as_t", lambda x, o: x.t().reshape_as(o), ramp(2, 3), ramp(6))
    collect(c, "type_as_f32", lambda x, o: x.type_as(o), ramp(2, 3), ramp(1, dtype=torch.float32))
    collect(c, "type_as_i64", lambda x, o: x.type_as(o), ramp(2, 3), ramp(1, dtype=torch.int64))
    collect(c, "movedim_0_m1", lambda x: x.movedim(0, -1), ramp(2, 3, 4))
    collect(c, "movedim_list", lambda x: torch.movedim(x, (0, 1), (2, 0)), ramp(2, 3, 4, 5))
    collect(c, "moveaxis_i64", lambda x: torch.moveaxis(x, (-1, 0), (0, -1)), ramp(2, 3, 4, dtype=torch.int64))
    collect(c, "movedim_empty", lambda x: x.movedim(0, 2), ramp(0, 3, 2))
    collect(c, "swapaxes", lambda x: x.swapaxes(0, -1), ramp(2, 3, 4))
    collect(c, "swapdims_bool", lambda x: x.swapdims(1, 0), ramp(2, 3, dtype=torch.bool))
    collect(c, "ravel_t", lambda x: x.t().ravel(), ramp(3, 4))
    collect(c, "ravel_0d", lambda x: x.ravel(), ramp())
    collect(c, "unflatten", lambda x: x.unflatten(1, (3, -1)), ramp(2, 12))
    collect(c, "unflatten_neg", lambda x: x.unflatten(-1, (2, 2, 3)), ramp(2, 12))
    collect(c, "tile_short", lambda x: x.tile((2,)), ramp(2, 3))
    collect(c, "tile_long_bool", lambda x: x.tile((2, 1, 2)), ramp(2, 3, dtype=torch.bool))
    collect(c, "ri_int_dim1", lambda x: x.repeat_interleave(2, dim=1), ramp(2, 3))
    collect(c, "ri_int_flat", lambda x: x.repeat_interleave(3), ramp(2, 2))
    collect(c, "ri_int_neg_i64", lambda x: x.repeat_interleave(2, dim=-2), ramp(2, 3, dtype=torch.int64))
    collect(c, "ri_int_empty", lambda x: x.repeat_interleave(2, dim=1), ramp(0, 2))
    collect(c, "ri_tensor_dim0", lambda x, r: x.repeat_interleave(r, dim=0), ramp(3, 2), ints([1, 0, 2]))
    collect(c, "ri_tensor_one", lambda x, r: x.repeat_interleave(r, dim=1), ramp(2, 3), ints([2]))
    collect(c, "ri_tensor_flat", lambda x, r: x.repeat_interleave(r), ramp(2, 2), ints([0, 3, 1, 2]))
    collect(c, "ri_tensor_bool", lambda x, r: x.repeat_interleave(r, dim=-1), ramp(2, 3, dtype=torch.bool),
            ints([1, 2, 0]))
    collect(c, "hstack_1d", lambda a, b: torch.hstack([a, b]), ramp(3), ramp(2, scale=1.1))
    collect(c, "hstack_2d", lambda a, b: torch.hstack([a, b]), ramp(2, 1), ramp(2, 3, scale=1.1))
    collect(c, "hstack_0d_bool", lambda a, b: torch.hstack([a, b]), ramp(dtype=torch.bool),
            ramp(3, dtype=torch.bool, scale=1.3))
    collect(c, "vstack_1d", lambda a, b: torch.vstack([a, b]), ramp(3), ramp(3, scale=1.1))
    collect(c, "vstack_mixed", lambda a, b: torch.vstack([a, b]), ramp(2, 3), ramp(3, scale=1.1))
    collect(c, "dstack_1d", lambda a, b: torch.dstack([a, b]), ramp(2), ramp(2, scale=1.1))
    collect(c, "dstack_2d_i64", lambda a, b: torch.dstack([a, b]), ramp(2, 3, dtype=torch.int64),
            ramp(2, 3, dtype=torch.int64, scale=1.1))
    collect(c, "column_stack", lambda a, b: torch.column_stack([a, b]), ramp(3), ramp(3, 2, scale=1.1))
    collect(c, "atleast_0d", lambda x: [torch.atleast_1d(x), torch.atleast_2d(x), torch.atleast_3d(x)], ramp())
    collect(c, "atleast_1d", lambda x: [torch.atleast_1d(x), torch.atleast_2d(x), torch.atleast_3d(x)], ramp(3))
    collect(c, "atleast_2d", lambda x: [torch.atleast_1d(x), torch.atleast_2d(x), torch.atleast_3d(x)],
            ramp(2, 3))
    collect(c, "tensor_split_sections", lambda x: x.tensor_split(3), ramp(7))
    collect(c, "tensor_split_indices", lambda x: x.tensor_split([1, 5]), ramp(7))
    collect(c, "tensor_split_negative", lambda x: x.tensor_split([-2]), ramp(7))
    collect(c, "tensor_split_dim1", lambda x: x.tensor_split(2, dim=1), ramp(2, 5))
    collect(c, "tensor_split_backwards", lambda x: x.tensor_split([4, 1], dim=-1), ramp(2, 5))
    collect(c, "tensor_split_more_than_size", lambda x: x.tensor_split(4), ramp(2))
    collect(c, "tensor_split_empty", lambda x: x.tensor_split(2), ramp(0, 3))
    collect(c, "hsplit", lambda x: x.hsplit(2), ramp(2, 4))
    collect(c, "hsplit_indices_1d", lambda x: x.hsplit([1, 3]), ramp(5))
    collect(c, "vsplit", lambda x: x.vsplit(2), ramp(4, 2))
    collect(c, "dsplit_i64", lambda x: x.dsplit([1]), ramp(1, 2, 4, dtype=torch.int64))
    for k in (1, 2, 3, -1, 4):
        collect(c, f"rot90_k{k}", lambda x, k=k: x.rot90(k, (0, 1)), ramp(2, 3))
    collect(c, "rot90_dims12", lambda x: x.rot90(1, (1, 2)), ramp(2, 3, 4))
    collect(c, "rot90_neg_dims", lambda x: x.rot90(1, (-1, 0)), ramp(2, 3))
    collect(c, "rot90_bool", lambda x: x.rot90(3, (0, 1)), ramp(2, 3, dtype=torch.bool))
    collect(c, "rot90_empty", lambda x: x.rot90(1, (0, 1)), ramp(0, 3))
    return {"cases": c}


def diagonal_cases():
    c = []
    for off in (0, 1, -1, 5):
        collect(c, f"diagonal_{off}", lambda x, off=off: x.diagonal(off, 0, 1), ramp(3, 4))
    collect(c, "diagonal_3d", lambda x: x.diagonal(1, 0, 2), ramp(2, 3, 4))
    collect(c, "diagonal_3d_neg", lambda x: x.diagonal(-1, -1, -3), ramp(2, 3, 4))
    collect(c, "diagonal_i64_t", lambda x: x.t().diagonal(0, 0, 1), ramp(3, 4, dtype=torch.int64))
    for k in (0, 1, -2):
        collect(c, f"diag_vec_{k}", lambda x, k=k: x.diag(k), ramp(3))
    for k in (0, 1, -1):
        collect(c, f"diag_mat_{k}", lambda x, k=k: x.diag(k), ramp(3, 4))
    collect(c, "diag_i64", lambda x: x.diag(), ramp(2, dtype=torch.int64))
    collect(c, "diag_empty", lambda x: x.diag(), ramp(0))
    collect(c, "diag_embed", lambda x: torch.diag_embed(x), ramp(2, 3))
    collect(c, "diag_embed_dims", lambda x: torch.diag_embed(x, 1, 0, 2), ramp(2, 3))
    collect(c, "diag_embed_swapped", lambda x: torch.diag_embed(x, -1, 2, 0), ramp(2, 3))
    collect(c, "diag_embed_bool", lambda x: torch.diag_embed(x, 1), ramp(3, dtype=torch.bool))
    collect(c, "trace", lambda x: x.trace(), ramp(3, 4))
    collect(c, "trace_i64", lambda x: x.trace(), ramp(3, 3, dtype=torch.int64))
    collect(c, "block_diag", lambda a, b, s, v: torch.block_diag(a, b, s, v), ramp(2, 2), ramp(1, 3, scale=1.1),
            ramp(scale=2.0), ramp(2, scale=0.7))
    collect(c, "block_diag_promote", lambda a, b: torch.block_diag(a, b), ramp(2, 2, dtype=torch.int64),
            ramp(1, 2))
    collect(c, "block_diag_empty", lambda a, b: torch.block_diag(a, b), ramp(0, 2), ramp(2, 1))
    collect(c, "cartesian_prod", lambda a, b: torch.cartesian_prod(a, b), ramp(2), ramp(3, scale=1.1))
    collect(c, "cartesian_prod3_i64", lambda a, b, d: torch.cartesian_prod(a, b, d), ramp(2, dtype=torch.int64),
            ramp(3, dtype=torch.int64, scale=1.1), ramp(2, dtype=torch.int64, scale=0.9))
    collect(c, "meshgrid_ij", lambda a, b, d: torch.meshgrid(a, b, d, indexing="ij"), ramp(2), ramp(3, scale=1.1),
            ramp(4, scale=0.9))
    collect(c, "meshgrid_xy", lambda a, b, d: torch.meshgrid(a, b, d, indexing="xy"), ramp(2), ramp(3, scale=1.1),
            ramp(4, scale=0.9))
    collect(c, "meshgrid_0d", lambda a, b: torch.meshgrid(a, b, indexing="xy"), ramp(), ramp(3, scale=1.1))
    tri = []
    for (r, col, off) in ((3, 3, 0), (4, 3, -1), (3, 5, 2), (0, 3, 0), (3, 4, -5), (3, 4, 9)):
        tri.append({"row": r, "col": col, "offset": off, "tril": tj(torch.tril_indices(r, col, off)),
                    "triu": tj(torch.triu_indices(r, col, off))})
    logs = []
    for (s, e, n, b, dt) in ((0.0, 2.0, 5, 10.0, D), (-1.0, 1.0, 4, 2.0, torch.float32),
                             (0.0, 3.0, 4, 10.0, torch.int64), (1.0, 1.0, 1, 3.0, D), (0.0, 1.0, 0, 10.0, D),
                             (2.0, -2.0, 5, 0.5, D)):
        logs.append({"start": s, "end": e, "steps": n, "base": b, "out": tj(torch.logspace(s, e, n, b, dtype=dt))})
    return {"cases": c, "tri": tri, "logspace": logs}


def index_cases():
    c = []
    x34 = ramp(3, 4)
    collect(c, "take_along_dim", lambda x, i: torch.take_along_dim(x, i, 1), x34, x34.argsort(1))
    collect(c, "take_along_dim_bcast", lambda x, i: torch.take_along_dim(x, i, 1), ramp(1, 4),
            ints([[0, 3], [1, 1], [2, 0]]))
    collect(c, "take_along_dim_bcast_self", lambda x, i: torch.take_along_dim(x, i, 0), ramp(3, 4),
            ints([[2], [0]]))
    collect(c, "take_along_dim_flat", lambda x, i: torch.take_along_dim(x, i), x34, ints([11, 0, 5]))
    collect(c, "take_along_dim_i64", lambda x, i: torch.take_along_dim(x, i, -1), ramp(2, 3, dtype=torch.int64),
            ints([[2, 0], [1, 1]]))
    collect(c, "take", lambda x, i: torch.take(x, i), ramp(2, 3), ints([[0, -1], [5, 2]]))
    collect(c, "take_bool_0d", lambda x, i: torch.take(x, i), ramp(2, 3, dtype=torch.bool), ints(4))
    collect(c, "take_empty_index", lambda x, i: torch.take(x, i), ramp(2, 3), ints([], (0, 2)))
    collect(c, "index_fill", lambda x, i: x.index_fill(1, i, -2.5), x34, ints([0, -1]))
    collect(c, "index_fill_repeat", lambda x, i: x.index_fill(0, i, 7.0), x34, ints([1, 1]))
    collect(c, "index_fill_tensor", lambda x, i, v: x.index_fill(-1, i, v), x34, ints([2]), ramp(scale=0.9))
    collect(c, "index_fill_i64", lambda x, i: x.index_fill(0, i, 9), ramp(3, 2, dtype=torch.int64), ints([2, 0]))
    collect(c, "index_fill_bool", lambda x, i: x.index_fill(1, i, True), ramp(2, 3, dtype=torch.bool), ints(1))
    collect(c, "index_copy", lambda x, i, s: x.index_copy(0, i, s), ramp(4, 3), ints([3, 0]), ramp(2, 3, scale=1.1))
    collect(c, "index_copy_dim1", lambda x, i, s: x.index_copy(-1, i, s), ramp(2, 4), ints([1, 3, 0]),
            ramp(2, 3, scale=1.1))
    collect(c, "index_copy_i64", lambda x, i, s: x.index_copy(1, i, s), ramp(2, 3, dtype=torch.int64), ints([2]),
            ramp(2, 1, dtype=torch.int64, scale=1.1))
    collect(c, "scatter", lambda x, i, s: x.scatter(0, i, s), ramp(3, 5),
            ints([[0, 1, 2, 0, 1], [2, 0, 1, 1, 0]]), ramp(2, 5, scale=1.1))
    # (no gradients: PyTorch's backward refuses a src larger than the index)
    collect(c, "scatter_larger_src", lambda x, i, s: x.scatter(1, i, s), ramp(3, 4), ints([[3, 0], [1, 2], [0, 3]]),
            ramp(4, 5, scale=1.1), grad=False)
    collect(c, "scatter_neg_dim_i64", lambda x, i, s: x.scatter(-1, i, s), ramp(2, 3, dtype=torch.int64),
            ints([[2], [0]]), ramp(2, 1, dtype=torch.int64, scale=1.1))
    collect(c, "scatter_bool", lambda x, i, s: x.scatter(0, i, s), ramp(4, dtype=torch.bool), ints([3, 0]),
            ramp(2, dtype=torch.bool, scale=2.1))
    collect(c, "scatter_value", lambda x, i: x.scatter(1, i, 2.5), ramp(3, 4), ints([[3, 0], [1, 2], [0, 3]]))
    collect(c, "scatter_value_repeats", lambda x, i: x.scatter(0, i, -1.0), ramp(4), ints([1, 1, 2]))
    collect(c, "scatter_0d", lambda x, i, s: x.scatter(0, i, s), ramp(), ints(0), ramp(scale=1.7))
    idx = ints([0, 1, 0, 1, 3, 1])
    src = torch.tensor([0.5, -1.25, 2.0, 3.5, -0.75, 1.5], dtype=D)
    for red in ("sum", "mean", "amax", "amin"):
        for inc in (True, False):
            collect(c, f"scatter_reduce_{red}_{int(inc)}",
                    lambda x, i, s, red=red, inc=inc: x.scatter_reduce(0, i, s, red, include_self=inc),
                    ramp(5), idx, src)
    i2 = ints([[0, 2, 0], [1, 1, 1]])
    for red in ("sum", "mean", "amax", "amin"):
        collect(c, f"scatter_reduce_2d_{red}",
                lambda x, i, s, red=red: x.scatter_reduce(1, i, s, red, include_self=False),
                ramp(2, 3), i2, ramp(2, 3, scale=1.3) * 0.9)
        collect(c, f"scatter_reduce_i64_{red}",
                lambda x, i, s, red=red: x.scatter_reduce(0, i, s, red),
                ints([-3, 4, 7]), ints([0, 0, 2, 2, 2]), ints([-4, 1, 2, -6, 0]))
    nan = torch.tensor([1.0, float("nan"), -2.0], dtype=D)
    for red in ("amax", "amin"):
        collect(c, f"scatter_reduce_nan_{red}", lambda x, i, s, red=red: x.scatter_reduce(0, i, s, red),
                torch.zeros(2, dtype=D), ints([0, 0, 1]), nan, grad=False)
    return {"cases": c}


def error_cases():
    errors = []

    def err(name, fn, phrase=None):
        try:
            fn()
        except (RuntimeError, ValueError, IndexError, TypeError, NotImplementedError) as e:
            msg = str(e)
            phrase = phrase or msg.split("\n")[0]
            assert phrase in msg, (name, msg)
            errors.append({"name": name, "phrase": phrase})
            return
        raise AssertionError(f"{name}: no error")

    z = lambda *s: torch.zeros(*s, dtype=D)
    i64 = lambda v: torch.tensor(v, dtype=torch.int64)
    err("movedim_lengths", lambda: z(2, 3).movedim((0, 1), (0,)))
    err("movedim_repeat_source", lambda: z(2, 3).movedim((0, 0), (0, 1)))
    err("movedim_repeat_destination", lambda: z(2, 3).movedim((0, 1), (1, 1)))
    err("movedim_range", lambda: z(2, 3).movedim(2, 0), "expected to be in range of [-2, 1], but got 2")
    err("view_as_strides", lambda: z(2, 3).t().view_as(z(6)), "view size is not compatible")
    err("expand_as", lambda: z(2, 3).expand_as(z(3, 3)),
        "The expanded size of the tensor (3) must match the existing size (2) at non-singleton dimension 0")
    err("unflatten_sizes", lambda: z(2, 6).unflatten(1, (4, -1)))
    err("unflatten_two_inferred", lambda: z(2, 6).unflatten(1, (-1, -1)), "only one dimension can be inferred")
    err("ri_negative", lambda: z(3).repeat_interleave(i64([1, -1, 2])), "repeats can not be negative")
    err("ri_length", lambda: z(3).repeat_interleave(i64([1, 2])))
    err("ri_2d_repeats", lambda: z(3).repeat_interleave(i64([[1, 2, 3]])), "repeats must be 0-dim or 1-dim tensor")
    err("hstack_empty", lambda: torch.hstack([]), "hstack expects a non-empty TensorList")
    err("vstack_empty", lambda: torch.vstack([]), "vstack expects a non-empty TensorList")
    err("tensor_split_0d", lambda: z(()).tensor_split(2))
    err("tensor_split_zero", lambda: z(4).tensor_split(0))
    err("hsplit_0d", lambda: z(()).hsplit(2))
    err("hsplit_divisible", lambda: z(2, 5).hsplit(2))
    err("vsplit_rank", lambda: z(4).vsplit(2))
    err("dsplit_rank", lambda: z(2, 4).dsplit(2))
    err("dsplit_divisible", lambda: z(1, 2, 3).dsplit(2))
    err("rot90_dims_len", lambda: z(2, 3).rot90(1, (0, 1, 2)))
    err("rot90_rank", lambda: z(3).rot90(1, (0, 1)))
    err("rot90_same", lambda: z(2, 3).rot90(1, (1, 1)))
    err("rot90_wrapped_same", lambda: z(2, 3).rot90(1, (1, -1)))
    err("rot90_range", lambda: z(2, 3).rot90(1, (0, 2)), "expected to be in range of [-2, 1], but got 2")
    err("diagonal_same", lambda: z(2, 3).diagonal(0, 1, -1))
    err("diagonal_1d", lambda: z(3).diagonal(), "expected to be in range of [-1, 0], but got 1")
    err("diag_rank", lambda: z(2, 2, 2).diag())
    err("diag_embed_same", lambda: torch.diag_embed(z(2, 3), 0, 1, -2))
    err("trace_rank", lambda: z(2, 2, 2).trace())
    err("trace_bool", lambda: torch.zeros(2, 2, dtype=torch.bool).trace())
    err("block_diag_rank", lambda: torch.block_diag(z(2, 2), z(1, 2, 2)))
    err("cartesian_prod_rank", lambda: torch.cartesian_prod(z(2), z(2, 2)))
    err("meshgrid_rank", lambda: torch.meshgrid(z(2), z(2, 2), indexing="ij"),
        "torch.meshgrid: Expected 0D or 1D tensor in the tensor list but got:")
    err("meshgrid_dtype", lambda: torch.meshgrid(z(2), torch.zeros(2, dtype=torch.int64), indexing="ij"),
        "same dtype")
    err("take_along_dim_rank", lambda: torch.take_along_dim(z(2, 3), i64([0]), 1))
    err("take_along_dim_dtype", lambda: torch.take_along_dim(z(2, 3), z(2, 3), 1))
    err("take_along_dim_bcast", lambda: torch.take_along_dim(z(2, 3), i64([[0], [1], [0]]), 1),
        "must match the size of tensor b")
    err("index_fill_value_rank", lambda: z(3).index_fill(0, i64([0]), z(2)))
    err("index_fill_index_rank", lambda: z(3).index_fill(0, i64([[0]]), 1.0), "Index has to be a vector/scalar")
    err("index_copy_index_rank", lambda: z(3).index_copy(0, i64([[0]]), z(1)))
    err("index_copy_count", lambda: z(3, 2).index_copy(0, i64([0, 1]), z(3, 2)))
    err("index_copy_dtype", lambda: z(3).index_copy(0, i64([0]), torch.zeros(1)))
    err("index_copy_slices", lambda: z(3, 2).index_copy(0, i64([0]), z(1, 3)),
        "Source/destination tensor must have same slice shapes")
    err("scatter_rank", lambda: z(3, 2).scatter(0, i64([0]), z(1)),
        "Index tensor must have the same number of dimensions as self tensor")
    err("scatter_dtype", lambda: z(3).scatter(0, i64([0]), torch.zeros(1)), "Expected self.dtype to be equal to src.dtype")
    err("scatter_index_dtype", lambda: z(3).scatter(0, z(1), z(1)), "Expected dtype int32/int64 for index")
    err("scatter_index_larger", lambda: z(2, 2).scatter(0, i64([[0, 1, 0]]), z(1, 3)),
        "to be no larger than self")
    err("scatter_reduce_name", lambda: z(3).scatter_reduce(0, i64([0]), z(1), "foo"),
        "reduce argument must be either sum, prod, mean, amax or amin, got foo")
    return {"errors": errors}


def advanced_cases():
    c = []
    t = torch.tensor
    x43, x234 = ramp(4, 3), ramp(2, 3, 4)

    def get(name, x, *index_inputs, key, grad=True):
        """x[key(*index_inputs)]; the index tensors are inputs too."""
        collect(c, name, lambda x, *ix: x[key(*ix)], x, *index_inputs, grad=grad)

    get("int_dim0", x43, ints([2, 0, 2]), key=lambda i: i)
    get("int_2d_index", x43, ints([[0, 1], [3, 3]]), key=lambda i: i)
    get("int_negative_dim1", x43, ints([-1, 0]), key=lambda i: (slice(None), i))
    get("two_adjacent", x234, ints([0, 2]), ints([1, -1]), key=lambda i, j: (slice(None), i, j))
    get("two_separated", x234, ints([0, 1]), ints([1, 3]), key=lambda i, j: (i, slice(None), j))
    get("two_broadcast", ramp(3, 4), ints([[0], [2]]), ints([1, 3, 0]), key=lambda i, j: (i, j))
    get("three_full", x234, ints([1, 0]), ints([2, 2]), ints([3, 0]), key=lambda i, j, k: (i, j, k))
    get("select_then_index", x234, ints([0, 1]), key=lambda i: (0, slice(None), i))
    get("newaxis_ellipsis", x234, ints([0, 2]), key=lambda i: (None, Ellipsis, i))
    get("ellipsis_middle", x234, ints([1]), ints([3, 2]), key=lambda i, j: (i, Ellipsis, j))
    get("slice_step_then_index", ramp(5, 4), ints([3, 0]), key=lambda i: (slice(1, None, 2), i))
    get("mask_full", x43, x43 > 0, key=lambda m: m)
    get("mask_dim1", x234, t([True, False, True]), key=lambda m: (slice(None), m))
    get("mask_trailing_2d", x234, ramp(3, 4, scale=0.9) > 0, key=lambda m: (slice(None), m))
    get("mask_and_int", x43, t([True, False, True, False]), ints([2, 0]), key=lambda m, i: (m, i))
    get("mask_none_true", x43, torch.zeros(4, dtype=torch.bool), key=lambda m: m)
    get("mask_0d_true", ramp(2, 3), t(True), key=lambda m: m)
    get("mask_0d_false", ramp(2, 3), t(False), key=lambda m: m)
    get("uint8_mask", ramp(3), t([True, False, True]), key=lambda m: m.to(torch.uint8))
    get("empty_index", x43, ints([], (0,)), key=lambda i: i)
    get("empty_index_dim1", x43, ints([], (2, 0)), key=lambda i: (slice(None), i))
    get("index_0d", x43, ints(1), key=lambda i: i)
    get("index_0d_and_vector", x43, ints(-1), ints([0, 2]), key=lambda i, j: (i, j))
    get("i64_self", ramp(3, 2, dtype=torch.int64), ints([2, 0]), key=lambda i: i)
    get("bool_self", ramp(2, 3, dtype=torch.bool), ints([1, 1]), key=lambda i: (slice(None), i))
    get("f32_self", ramp(4, 3, dtype=torch.float32), ints([3, 1]), key=lambda i: i)

    def put(name, x, v, *index_inputs, accumulate=False, grad=True):
        collect(c, name, lambda x, v, *ix: torch.index_put(x, ix, v, accumulate), x, v, *index_inputs, grad=grad)

    put("put_rows", x43, ramp(2, 3, scale=1.1), ints([3, 0]))
    put("put_accumulate_repeats", x43, ramp(3, 3, scale=1.1), ints([1, 1, 2]), accumulate=True)
    put("put_broadcast_value", x43, ramp(3, scale=1.1), ints([0, 2]))
    put("put_scalar_value", x43, ramp(scale=1.1), ints([[1], [2]]), ints([0, 2]))
    put("put_two_accumulate", x234, ramp(2, 4, scale=1.1), ints([0, 0]), ints([1, 1]), accumulate=True)
    put("put_mask", x43, ramp(scale=1.1), x43 > 0)
    put("put_mask_accumulate", x43, ramp(scale=1.1), x43 > 0, accumulate=True)
    put("put_i64", ramp(3, 2, dtype=torch.int64), ints([5, -5]), ints([2, 0]), ints([1, 1]), accumulate=True)

    def setitem(name, x, v, *index_inputs, key, grad=True):
        def f(x, v, *ix):
            y = x.clone()
            y[key(*ix)] = v
            return y
        collect(c, name, f, x, v, *index_inputs, grad=grad)

    setitem("set_adjacent", x234, ramp(2, 2, scale=1.1), ints([0, 2]), ints([1, 3]),
            key=lambda i, j: (slice(None), i, j))
    setitem("set_separated", x234, ramp(2, 3, scale=1.1), ints([0, 1]), ints([1, 3]),
            key=lambda i, j: (i, slice(None), j))
    setitem("set_mask_tensor", x43, ramp(scale=1.1), x43 > 0, key=lambda m: m)
    setitem("set_mask_rows", x43, ramp(1, 1, 3, scale=1.1), t([False, True, True, False]), key=lambda m: m)
    setitem("set_ellipsis", x234, ramp(2, 3, 1, scale=1.1), ints([3]), key=lambda i: (Ellipsis, i))
    # written through a view: no gradient (ember refuses a recorded write into a view)
    setitem("set_slice_then_index", ramp(4, 3), ramp(2, scale=1.1), ints([2, 0]),
            key=lambda i: (slice(1, 3), i), grad=False)
    setitem("set_select_then_mask", x234, ramp(scale=1.1), ramp(3, 4, scale=0.8) > 0,
            key=lambda m: (1, m), grad=False)

    errors = []

    def err(name, fn, phrase=None):
        try:
            fn()
        except (RuntimeError, IndexError, TypeError) as e:
            msg = str(e)
            phrase = phrase or msg.split("\n")[0]
            assert phrase in msg, (name, msg)
            errors.append({"name": name, "phrase": phrase})
            return
        raise AssertionError(f"{name}: no error")

    z = lambda *s: torch.zeros(*s, dtype=D)
    err("out_of_bounds", lambda: z(2, 3, 4)[ints([5])])
    err("out_of_bounds_negative", lambda: z(2, 3, 4)[:, ints([1, -4])])
    err("out_of_bounds_second", lambda: z(2, 3, 4)[ints([0]), :, ints([9])])
    err("empty_dim", lambda: z(0, 3)[ints([0])])
    err("too_many", lambda: z(2, 3)[ints([0]), ints([0]), ints([0])])
    err("mask_shape", lambda: z(2, 3, 4)[:, t([True, False])])
    err("mask_shape_2d", lambda: z(2, 3, 4)[:, t([[True, False, True, True], [True, True, True, True]])])
    err("index_dtype", lambda: z(3)[z(1)])
    err("broadcast", lambda: z(2, 3, 4)[ints([0, 1]), ints([0, 1, 2])])
    err("put_dtype", lambda: torch.index_put(z(3), (ints([0]),), torch.zeros(1)))
    err("put_shape", lambda: torch.index_put(z(2, 3, 4), (ints([0]),), z(2)))
    return {"cases": c, "errors": errors}


SECTIONS = {"reshaping": reshaping_cases, "diagonals": diagonal_cases, "index": index_cases,
            "advanced": advanced_cases, "errors": error_cases}


def main():
    path = os.path.join(HERE, "ops_cases.json")
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
        json.dump(data, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
