#!/usr/bin/env python3
"""cuDNN's own graphs for ember's cuDNN attention and convolutions, and a check of ember's against them.

ember's fused attention on cuDNN (crates/ember/src/backend/cuda/dnn/sdpa/graphs.rs) writes
its forward and backward as graphs of cuDNN's backend API: matrix products,
pointwise nodes and row reductions that cuDNN's flash-attention engines recognise.
cuDNN's frontend library (cudnn-frontend, what PyTorch's cuDNN attention is built
on) writes the same computation with its `sdpa` and `sdpa_backward` nodes. This
script has the frontend build its graph for each geometry of cases.json and keeps
what cuDNN's debug log records of it (every node, every tensor's type, sizes,
strides and flags) in a canonical text, graphs.json; `check` then compares the
graphs ember built (the same log, of `cudnn_builds_plans_for_the_attention_graphs`,
which `bench/cudnn-offline` runs) with them. Equal graphs compute the same thing.
No GPU is needed for either: cuDNN 9.8 and later takes an H200 described by its
properties. The same for the convolutions' graphs (crates/ember/src/backend/cuda/
dnn/conv_graph.rs: one forward, data-gradient or weight-gradient node) against
the frontend's `conv_fprop`, `conv_dgrad` and `conv_wgrad`, for the
`convolutions` of cases.json (each must be among the graphs ember's
`cudnn_builds_plans_for_the_convolution_graphs` built: that test builds more).

In the canonical text each tensor's id is replaced: the ones an execution binds
(q, k, v, the output, the log-sum-exps, the scale, and the backward's output
gradient, dq, dk and dv) by their names, which the frontend's tensors get here by
taking ember's ids (backend/cuda/dnn/sdpa/mod.rs's `uid`) plus 1000 (the frontend numbers the tensors
it makes itself from 0); the rest (inner tensors, and the workspace
and constants the frontend makes for itself) by their order of first appearance.

  gen_graphs.py generate     writes graphs.json (pip installs the frontend, cuDNN
                             9.14 and NVRTC into a temporary folder; needs a C
                             compiler for a stand-in CUDA runtime: nothing runs)
  gen_graphs.py check ATTENTION_LOG CONVOLUTION_LOG
                             compares the graphs of those cuDNN debug logs (of
                             the two tests) with graphs.json; exits 1 where one
                             differs
"""
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CUDNN = "nvidia-cudnn-cu13==9.14.0.64"
FRONTEND = "nvidia-cudnn-frontend==1.32.0"
NVRTC = "nvidia-cuda-nvrtc==13.0.88"

# ember's ids of the tensors an execution binds (backend/cuda/dnn/sdpa/mod.rs, `mod uid`)
NAMED = {1: "q", 2: "k", 3: "v", 4: "o", 5: "stats", 6: "scale", 8: "do", 9: "dq", 10: "dk", 11: "dv"}
# and what the frontend's tensors take: those plus FE
FE = 1000
# the convolutions' (conv_graph.rs: X, W, Y; in a data-gradient pass x and in a
# weight-gradient pass w are the results, y the gradient taken)
CONV_NAMED = {1: "x", 2: "w", 3: "y"}

# the H200's properties as cuDNN's JSON describes a device (as graph.rs's `DeviceModel::h200` does)
H200 = {
    "maxGridSize": [2147483647, 65535, 65535], "maxBlockSize": [1024, 1024, 64],
    "regsPerBlock": 65536, "multiProcessorCount": 132, "warpSize": 32,
    "maxSharedMemoryPerBlock": 49152, "maxSharedMemoryPerBlockOptin": 232448,
    "reservedSharedMemoryPerBlock": 1024, "maxRegistersPerSM": 65536, "maxCtasPerSM": 32,
    "maxThreadsPerBlock": 1024, "maxThreadsPerSM": 2048, "pciDeviceId": 9013,
    "isTccDriver": 0, "supportCoopLaunch": 1, "totalGlobalMem": 150754820096,
    "smClockRateKHz": 1980000, "memClockRateKHz": 3201000, "l2CacheSize": 52428800,
    "cudaDeviceId": 0, "deviceVer": 900, "driverVer": 13000, "deviceName": "NVIDIA H200",
}


def graphs_in(log_text, named):
    """The operation graphs a cuDNN debug log shows finalised, each canonical,
    the tensors with ids in `named` (id: name) by their names."""
    out = []
    for block in log_text.split("\n\n"):
        if "function cudnnBackendFinalize() called" not in block:
            continue
        lines = [l[2:] for l in block.split("\n") if l.startswith("i!")]
        if not lines or "type=CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR" not in lines[0]:
            continue
        names = {}
        text = []
        for l in lines[1:]:
            if l.strip().startswith(("Time:", "Process=")):
                continue
            m = re.search(r"uid: type=int64_t; val=(-?\d+);", l)
            if m:
                u = int(m.group(1))
                if u in named:
                    name = named[u]
                else:
                    name = names.setdefault(u, f"t{len(names)}")
                l = l[: m.start()] + f"uid: {name};" + l[m.end():]
            text.append(l.rstrip())
        out.append("\n".join(text))
    return out


def check(log_path, conv_log_path):
    with open(os.path.join(HERE, "graphs.json")) as f:
        j = json.load(f)
    golden, golden_conv = j["graphs"], j["convolutions"]
    with open(os.path.join(HERE, "cases.json")) as f:
        j = json.load(f)
    names = [c["name"] for c in j["cases"]]
    bad = 0
    # graphs.json made from this cases.json
    for kind, want, have in (("attention", names, golden), ("convolutions", [c["name"] for c in j["convolutions"]], golden_conv)):
        if sorted(want) != sorted(have):
            print(f"graphs.json's {kind} are not cases.json's: run gen_graphs.py generate")
            return 1
    for path in (log_path, conv_log_path):
        if not os.path.exists(path):
            print(f"no cuDNN log at {path}: cuDNN did not load, or the test skipped")
            bad += 1
    if bad:
        return 1
    with open(log_path, errors="replace") as f:
        # the attention graphs in the order the test built them (cases.json's),
        # each logged once or more
        ember = []
        for g in graphs_in(f.read(), NAMED):
            if "OPERATION_MATMUL_DESCRIPTOR" in g and (not ember or ember[-1] != g):
                ember.append(g)
    if len(ember) != len(names):
        bad += 1
        print(f"the log holds {len(ember)} attention graphs; cases.json has {len(names)} geometries")
    for name, g in zip(names, ember):
        if g == golden[name]:
            print(f"{name}: ember's graph is the frontend's")
            continue
        bad += 1
        print(f"{name}: ember's graph differs from the frontend's:")
        diff = difflib.unified_diff(golden[name].split("\n"), g.split("\n"), "frontend", "ember", lineterm="", n=3)
        print("\n".join(list(diff)[:80]))
    with open(conv_log_path, errors="replace") as f:
        convs = {g for g in graphs_in(f.read(), CONV_NAMED) if "OPERATION_CONVOLUTION_" in g}
    for name, g in golden_conv.items():
        if g in convs:
            print(f"{name}: among ember's graphs")
            continue
        bad += 1
        print(f"{name}: ember built no graph equal to the frontend's; against the closest:")
        closest = max(convs, key=lambda e: difflib.SequenceMatcher(None, e, g).ratio(), default="")
        diff = difflib.unified_diff(g.split("\n"), closest.split("\n"), "frontend", "ember", lineterm="", n=3)
        print("\n".join(list(diff)[:60]))
    total = len(names) + len(golden_conv)
    print(f"{total} of {total} graphs match" if bad == 0 else f"{bad} difference(s)")
    return 0 if bad == 0 else 1


def new_graph(case):
    """A frontend graph for the H200 in `case`'s data type (float32 inside),
    and that type."""
    import cudnn

    dt = {"bf16": cudnn.data_type.BFLOAT16, "f16": cudnn.data_type.HALF, "f32": cudnn.data_type.FLOAT}[case["dtype"]]
    f32 = cudnn.data_type.FLOAT
    g = cudnn.pygraph(
        io_data_type=dt,
        intermediate_data_type=f32,
        compute_data_type=f32,
        device_property=cudnn.create_device_properties(json.dumps(H200)),
    )
    return g, dt


def build_conv(case):
    """(run with the frontend importable) builds convolution `case`'s graph."""
    import cudnn

    g, dt = new_graph(case)
    f32 = cudnn.data_type.FLOAT

    def strides(d):
        _, c, h, w = d
        return [h * w * c, 1, w * c, c] if case["nhwc"] else [c * h * w, h * w, w, 1]

    def real(name, uid):
        t = g.tensor(name=name, dim=case[name], stride=strides(case[name]), data_type=dt)
        t.set_uid(FE + uid)
        return t

    conv = dict(padding=case["pad"], stride=case["stride"], dilation=case["dilation"], compute_data_type=f32)
    if case["pass"] == "fwd":
        out, name = g.conv_fprop(image=real("x", 1), weight=real("w", 2), **conv), "y"
    elif case["pass"] == "dgrad":
        out, name = g.conv_dgrad(loss=real("y", 3), filter=real("w", 2), **conv), "x"
    else:
        out, name = g.conv_wgrad(image=real("x", 1), loss=real("y", 3), **conv), "w"
    uid = {"x": 1, "w": 2, "y": 3}[name]
    out.set_output(True).set_dim(case[name]).set_stride(strides(case[name])).set_data_type(dt).set_uid(FE + uid)
    g.validate()
    g.build_operation_graph()
    try:
        g.create_execution_plans([cudnn.heur_mode.A])
    except cudnn.cudnnGraphNotSupportedError:
        pass


def build_one(case):
    """(run with the frontend importable) builds `case`'s graph; cuDNN logs it."""
    import cudnn

    g, dt = new_graph(case)
    f32 = cudnn.data_type.FLOAT
    b, h, l, s, d = (case[k] for k in "bhlsd")

    def real(uid, rows, st, dtype=dt):
        t = g.tensor(name=NAMED[uid], dim=[b, h, rows, d], stride=[st[0], st[1], st[2], 1], data_type=dtype)
        t.set_uid(FE + uid)
        return t

    q, k, v = real(1, l, case["q"]), real(2, s, case["k"]), real(3, s, case["v"])
    scale = g.tensor(name="scale", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=f32, is_pass_by_value=True)
    scale.set_uid(FE + 6)
    if case["grads"] is None:
        # the composite form: matrix products, pointwise nodes and reductions, as
        # ember writes it (on cuDNN 9.13 and later the frontend would write a
        # forward without a mask as one SDPA_FWD node of cuDNN's, whose engines
        # are the same flash-attention ones)
        o, stats = g.sdpa(name="sdpa", q=q, k=k, v=v, generate_stats=True, attn_scale=scale,
                          use_causal_mask=case["causal"],
                          implementation=cudnn.attention_implementation.COMPOSITE)
        o.set_output(True).set_dim([b, h, l, d]).set_stride(case["o"] + [1]).set_uid(FE + 4)
        stats.set_output(True).set_data_type(f32).set_uid(FE + 5)
    else:
        go, gq, gk, gv = case["grads"]
        o = real(4, l, case["o"])
        do = real(8, l, go)
        stats = g.tensor(name="stats", dim=[b, h, l, 1], stride=[h * l, l, 1, 1], data_type=f32)
        stats.set_uid(FE + 5)
        dq, dk, dv = g.sdpa_backward(name="sdpa_backward", q=q, k=k, v=v, o=o, dO=do, stats=stats,
                                     attn_scale=scale, use_causal_mask=case["causal"])
        for t, st, uid, rows in ((dq, gq, 9, l), (dk, gk, 10, s), (dv, gv, 11, s)):
            t.set_output(True).set_dim([b, h, rows, d]).set_stride(st + [1]).set_uid(FE + uid)
    g.validate()
    g.build_operation_graph()
    # the operation graph is finalised (and logged) when the heuristics are
    # asked; without NVRTC and a driver they find no engine, which is no matter
    try:
        g.create_execution_plans([cudnn.heur_mode.A])
    except cudnn.cudnnGraphNotSupportedError:
        pass


def generate():
    with open(os.path.join(HERE, "cases.json")) as f:
        j = json.load(f)
    cases, convolutions = j["cases"], j["convolutions"]
    with tempfile.TemporaryDirectory() as work:
        site = os.path.join(work, "site")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "--no-deps", "--target", site, CUDNN, FRONTEND, NVRTC], check=True)
        cudnn_lib = os.path.dirname(next(os.path.join(r, n) for r, _, fs in os.walk(site)
                                         for n in fs if n == "libcudnn.so.9"))
        # a stand-in CUDA runtime: the device queries answer (device 0, CUDA 13),
        # every other entry point the frontend names fails; nothing runs
        module = next(os.path.join(r, n) for r, _, fs in os.walk(os.path.join(site, "cudnn"))
                      for n in fs if n.startswith("_compiled_module"))
        names = sorted(set(re.findall(rb"\b(cuda[A-Z][A-Za-z0-9_]+)\b", open(module, "rb").read())))
        ok = {
            "cudaGetDevice": "int cudaGetDevice(int *d) { *d = 0; return 0; }",
            "cudaGetLastError": "int cudaGetLastError(void) { return 0; }",
            "cudaRuntimeGetVersion": "int cudaRuntimeGetVersion(int *v) { *v = 13000; return 0; }",
            "cudaGetErrorString": 'const char *cudaGetErrorString(int e) { return "no GPU (stand-in)"; }',
            # the H200's: compute capability 9.0 (attributes 75, 76), 132
            # multiprocessors (16), 227 KiB of shared memory a block (97)
            "cudaDeviceGetAttribute": "int cudaDeviceGetAttribute(int *v, int a, int d) {"
            " *v = a == 75 ? 9 : a == 16 ? 132 : a == 97 ? 232448 : 0; return 0; }",
        }
        src = [ok.get(n.decode(), f"int {n.decode()}(void) {{ return 100; }}") for n in names]
        src += [v for k, v in ok.items() if k.encode() not in names]
        rt = os.path.join(work, "rt")
        os.makedirs(rt)
        with open(os.path.join(rt, "rt.c"), "w") as f:
            f.write("\n".join(src) + "\n")
        subprocess.run(["cc", "-shared", "-fPIC", "-w", "-o", os.path.join(rt, "libcudart.so.13"),
                        os.path.join(rt, "rt.c"), "-Wl,-soname,libcudart.so.13"], check=True)
        # and a cuBLASLt of failing entry points: cuDNN 9.14 aborts where some of
        # its convolution engines find none
        lt = set()
        for n in os.listdir(cudnn_lib):
            if n.startswith("libcudnn"):
                lt |= set(re.findall(rb"\b(cublasLt[A-Za-z0-9_]+)\b", open(os.path.join(cudnn_lib, n), "rb").read()))
        with open(os.path.join(rt, "lt.c"), "w") as f:
            f.write("\n".join(f"int {n.decode()}(void) {{ return 1; }}" for n in sorted(lt)) + "\n")
        subprocess.run(["cc", "-shared", "-fPIC", "-w", "-o", os.path.join(rt, "libcublasLt.so.13"),
                        os.path.join(rt, "lt.c"), "-Wl,-soname,libcublasLt.so.13"], check=True)

        def logged(case, kind, named):
            log = os.path.join(work, case["name"] + ".log")
            env = dict(os.environ, PYTHONPATH=site, CUDNN_LOGLEVEL_DBG="3", CUDNN_LOGDEST_DBG=log,
                       LD_LIBRARY_PATH=":".join(p for p in [rt, cudnn_lib, os.environ.get("LD_LIBRARY_PATH")] if p),
                       CUDNN_FRONTEND_CUDART_LIB_NAME=os.path.join(rt, "libcudart.so.13"))
            subprocess.run([sys.executable, __file__, kind, json.dumps(case), cudnn_lib], env=env, check=True)
            with open(log, errors="replace") as f:
                found = list(dict.fromkeys(graphs_in(f.read(), {FE + u: n for u, n in named.items()})))
            if len(found) != 1:
                sys.exit(f"{case['name']}: the frontend finalised {len(found)} distinct graphs, not 1")
            print(f"{case['name']}: {found[0].count('Op: type=')} nodes")
            return found[0]

        graphs = {case["name"]: logged(case, "one", NAMED) for case in cases}
        conv_graphs = {case["name"]: logged(case, "conv", CONV_NAMED) for case in convolutions}
    about = ("the operation graphs cuDNN's frontend (" + FRONTEND + ", cuDNN " + CUDNN.split("==")[1]
             + ") builds for the attention geometries and the convolutions of cases.json, as"
             " gen_graphs.py writes them")
    with open(os.path.join(HERE, "graphs.json"), "w") as f:
        json.dump({"about": about, "graphs": graphs, "convolutions": conv_graphs}, f, indent=1)
        f.write("\n")


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "generate":
        generate()
    elif len(sys.argv) == 4 and sys.argv[1] == "check":
        sys.exit(check(sys.argv[2], sys.argv[3]))
    elif len(sys.argv) == 4 and sys.argv[1] in ("one", "conv"):
        import ctypes

        # cuDNN's parts loaded first, so that the frontend finds them
        for n in ["graph", "engines_precompiled", "engines_runtime_compiled", "heuristic", "ops", "cnn", "adv"]:
            ctypes.CDLL(os.path.join(sys.argv[3], f"libcudnn_{n}.so.9"), mode=ctypes.RTLD_GLOBAL)
        ctypes.CDLL(os.path.join(sys.argv[3], "libcudnn.so.9"), mode=ctypes.RTLD_GLOBAL)
        (build_one if sys.argv[1] == "one" else build_conv)(json.loads(sys.argv[2]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
