#!/usr/bin/env python3
"""Records what PyTorch does with every op of cases.json on empty, 0-d and size-1
shapes, for the edge-shape property test (crates/ember/tests/golden/edges.rs).

Run from anywhere, after gen.py:  python3 crates/ember/tests/golden/gen_edges.py
Writes edges.json next to this script.

The combinations are derived from cases.json, as edges.rs derives them (the two
must agree: edges.rs fails on a combination this file has no record of):

- Templates: for each op, its first case that PyTorch accepts and that has a
  tensor input. (Ops without a tensor input whose params have a "shape", the
  creation ops, vary that shape instead; the others are left out.)
- Variants of a template, for each edge shape S in SHAPES: every tensor input
  takes shape S ("all"); and, where there are several tensor inputs, input k
  alone takes S (the others keep theirs). A reshaped input drops its "pre" views
  and its values are the original's, cycled (element i is original element
  i mod n; zeros where the original is empty).
- Params that name dims ("dim", "dims", "dim0", "dim1") are also tried adjusted
  to the new rank of input 0 (kept in range: clamped to [-r, r-1], 0 or -1 for a
  0-d input, duplicates dropped) when input 0 is reshaped and the adjustment
  changes them: the original params (often PyTorch's dim error) and the adjusted
  ones (the op's valid path) are both recorded.

Each record: its key (template case | variant | shape | "adj" or "orig"), and
PyTorch's outcome: {"shapes": [[...]...], "dtypes": [...]} (one entry per output
tensor; "str" for printing ops) or {"error": message}.
"""

import json
import math
import os
import sys
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))

# gen.py's reference semantics (run_op, DTYPES), without its case collection
_src = open(os.path.join(HERE, "gen.py")).read()
_cut = _src.index("# Case collection")
_gen = {"__name__": "gen_reference"}
exec(compile(_src[:_cut], "gen.py", "exec"), _gen)
run_op, DTYPES, NAME = _gen["run_op"], _gen["DTYPES"], _gen["NAME"]

SHAPES = [[], [0], [1], [0, 3], [3, 0], [1, 1], [2, 0, 3], [1, 0]]
DIM_KEYS = ["dim", "dims", "dim0", "dim1"]


def shape_key(s):
    return "[" + ",".join(str(d) for d in s) + "]"


def spec_values(spec):
    """The flat values of a tensor spec: floats (nan/inf decoded) or ints."""
    n = math.prod(spec["shape"])
    if "progression" in spec and spec["progression"] is not None:
        start, step = spec["progression"]
        vals = [start + i * step for i in range(n)]
        if spec["dtype"] in ("float16", "bfloat16", "float32", "float64"):
            return vals
        return [int(v) for v in vals]
    out = []
    for v in spec["data"]:
        if isinstance(v, str):
            out.append(float(v))
        else:
            out.append(v)
    return out


def build(spec, shape=None, pre=True):
    """The tensor of a spec (reshaped to `shape` with cycled values, without its
    pre views), or as the case has it."""
    dt = DTYPES[spec["dtype"]]
    vals = spec_values(spec)
    if shape is not None:
        n = math.prod(shape)
        vals = [vals[i % len(vals)] if vals else 0 for i in range(n)]
    else:
        shape = spec["shape"]
    if dt.is_floating_point:
        t = torch.tensor([float(v) for v in vals], dtype=torch.float64).to(dt)
    else:
        t = torch.tensor([int(v) for v in vals], dtype=torch.int64).to(dt)
    t = t.reshape(shape)
    if pre:
        for p in spec.get("pre", []):
            t = _gen["apply_view"](t, p["op"], p.get("args", []))
    return t


def adjust_dims(params, rank):
    """`params` with its dim params kept in range for a tensor of `rank` dims."""
    def one(d):
        if rank == 0:
            return 0 if d >= 0 else -1
        return max(-rank, min(d, rank - 1))

    out = dict(params)
    for k in DIM_KEYS:
        v = params.get(k)
        if isinstance(v, bool) or v is None:
            continue
        if isinstance(v, int):
            out[k] = one(v)
        elif isinstance(v, list):
            seen = []
            for d in v:
                x = one(d)
                # -1 and rank-1 are the same dim
                if all((x % max(rank, 1)) != (y % max(rank, 1)) for y in seen):
                    seen.append(x)
            out[k] = seen
    return out


def decode_param(v):
    if v == "nan":
        return math.nan
    if v == "inf":
        return math.inf
    if v == "-inf":
        return -math.inf
    return v


def combos(cases):
    """(key, op, params, inputs) of every derived combination; inputs as
    ("t", spec, shape or None) or ("s", value)."""
    seen = set()
    out = []
    for c in cases:
        op = c["op"]
        if op in seen or "error" in c["expected"]:
            continue
        params = c.get("params", {})
        tensors = [k for k, i in enumerate(c["inputs"]) if "scalar" not in i]
        if not tensors and "shape" not in params:
            continue
        seen.add(op)
        if not tensors:
            for s in SHAPES:
                out.append((f"{c['name']}|shape|{shape_key(s)}|orig", op, dict(params, shape=s), []))
            continue
        variants = [("all", tensors)] + ([(str(k), [k]) for k in tensors] if len(tensors) > 1 else [])
        for vname, which in variants:
            for s in SHAPES:
                ins = [("t", i, s if k in which else None) if "scalar" not in i else ("s", i)
                       for k, i in enumerate(c["inputs"])]
                key = f"{c['name']}|{vname}|{shape_key(s)}"
                out.append((key + "|orig", op, params, ins))
                if tensors[0] in which:
                    adj = adjust_dims(params, len(s))
                    if adj != params:
                        out.append((key + "|adj", op, adj, ins))
    return out


def scalar(i):
    v = decode_param(i["scalar"])
    k = i.get("kind")
    return bool(v) if k == "bool" else int(v) if k == "int" else float(v)


def outcome(op, params, ins):
    p = {k: decode_param(v) for k, v in params.items()}
    try:
        x = [build(i[1], i[2], pre=i[2] is None) if i[0] == "t" else scalar(i[1]) for i in ins]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(0)
            r = run_op(op, p, x)
    except Exception as e:  # noqa: BLE001 (PyTorch's refusal, whatever its type)
        return {"error": (str(e).splitlines() or [type(e).__name__])[0][:160]}
    if isinstance(r, str):
        return {"str": True}
    rs = r if isinstance(r, list) else [r]
    return {"shapes": [list(t.shape) for t in rs], "dtypes": [NAME[t.dtype] for t in rs]}


def main():
    cases = json.load(open(os.path.join(HERE, "cases.json")))["cases"]
    recs = {}
    for key, op, params, ins in combos(cases):
        assert key not in recs, key
        recs[key] = outcome(op, params, ins)
    path = os.path.join(HERE, "edges.json")
    header = {"generator": "crates/ember/tests/golden/gen_edges.py", "torch": torch.__version__.split("+")[0]}
    with open(path, "w") as f:
        f.write("{" + json.dumps(header)[1:-1] + ',"records":{\n')
        f.write(",\n".join(json.dumps(k) + ":" + json.dumps(v, separators=(",", ":")) for k, v in recs.items()))
        f.write("\n}}\n")
    errs = sum("error" in v for v in recs.values())
    print(f"wrote {len(recs)} records ({errs} PyTorch errors) to {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
