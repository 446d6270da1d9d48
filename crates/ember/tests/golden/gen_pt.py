"""torch.save files for ember::io::PtFile (tests/pt.rs), written by real PyTorch.

Writes into pt/ next to this file (small files, committed):
  dtypes.pt, dtypes_legacy.pt,  one tensor per dtype ember has (NaN, infinities,
  dtypes_p4.pt,                 (the last two with pickle protocol 4, the next
  views_legacy_p4.pt,           with protocol 1: text integers)
  views_legacy_p1.pt
                                -0.0, subnormals, integer extremes), a 0-d and an
                                empty tensor, and values that are not tensors
  views.pt, views_legacy.pt     views of one storage: transposed, sliced with an
                                offset, strided, broadcast (stride 0), 0-d at an
                                offset, empty; and a second name for one tensor
  checkpoint.pt                 {"model": state dict, "optimizer": Adam's state
                                after two steps, "epoch": 3, "args": an
                                argparse.Namespace (an object ember does not build)}
  int32.pt                      an int32 and a uint16 tensor (dtypes ember does
                                not have; uint16 goes through _rebuild_tensor_v3)
  module.pt                     torch.save of a whole nn.Module (not a state dict)
  one_tensor.pt                 torch.save of one tensor (no name for it)
  script.pt                     torch.jit.save of a scripted nn.Linear (TorchScript)
  numpy.pt                      torch.save of a numpy array (not a model, no tensor)
  os_system.pt, eval.pt         pickles that call os.system / builtins.eval when
                                PyTorch loads them with weights_only=False
  small_net.pth                 a conv-BN-ReLU-linear net after a few training
                                steps (running statistics moved)
  gpt2_tiny.bin                 Hugging Face's GPT2LMHeadModel (transformers), 2
                                layers of width 32, its state dict as
                                pytorch_model.bin holds it (lm_head tied to wte,
                                one storage), with the causal-mask buffers older
                                transformers versions saved (h.N.attn.bias)
and expected.json: each file's tensors (name, dtype, shape, the bytes of the
contiguous values in hex) and other values (as Python's repr writes them),
small_net's output in eval mode on a fixed input, and gpt2_tiny's logits for
fixed ids (needs the transformers package).

With --zoo DIR it instead writes into DIR, for a test that runs when PyTorch is
present (the files are large): resnet18.pth and resnet50.pth (torchvision's
layouts from gen_models.py, seeded random weights, batch norm statistics moved by
two training-mode passes), their eval-mode outputs on a fixed input in
zoo.json; with --all, alexnet, vgg11 and vgg16 too.

Run from anywhere: python3 crates/ember/tests/golden/gen_pt.py [--zoo DIR [--all]]
"""
import argparse
import builtins
import json
import os
import sys

import numpy as np
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "pt")


def tensor_record(name, t):
    t = t.detach().contiguous()
    if t.dtype == torch.bool:
        raw = t.to(torch.uint8).numpy().tobytes()
    elif t.dtype == torch.bfloat16:
        raw = t.view(torch.int16).numpy().tobytes()
    else:
        raw = t.numpy().tobytes()
    return {"name": name, "dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
            "hex": raw.hex()}


def flatten(obj, prefix=""):
    """The tensors and other leaves of a saved object, named as ember names them."""
    tensors, values = [], []

    def walk(o, name):
        join = (lambda k: f"{name}.{k}") if name else (lambda k: str(k))
        if isinstance(o, torch.Tensor):
            tensors.append(tensor_record(name, o))
        elif isinstance(o, dict):
            if not o:
                values.append([name, "{}"])
            for k, v in o.items():
                walk(v, join(k))
        elif isinstance(o, (list, tuple)):
            if not o:
                values.append([name, "[]" if isinstance(o, list) else "()"])
            for i, v in enumerate(o):
                walk(v, join(i))
        elif isinstance(o, bytes):
            values.append([name, f"<{len(o)} bytes>"])
        elif isinstance(o, str):
            values.append([name, repr(o)])
        elif isinstance(o, torch.device):
            values.append([name, repr(str(o))])
        elif o is None or isinstance(o, (bool, int, float)):
            values.append([name, repr(o)])
        else:
            raise TypeError(f"{name}: {type(o)}")

    walk(obj, prefix)
    return {"tensors": tensors, "values": values}


def dtypes():
    f32 = torch.tensor([0.0, -0.0, 1.5, float("nan"), float("inf"), float("-inf"), 1e-45, 3.4e38])
    return {
        "f32": f32,
        "f64": torch.tensor([[1.0 / 3, -2.5e-310], [1e308, float("nan")]], dtype=torch.float64),
        "f16": torch.tensor([65504.0, -6e-8, 0.1, float("inf")], dtype=torch.float16),
        "bf16": torch.tensor([3.0e38, -1.0e-38, 0.1, float("nan")], dtype=torch.bfloat16),
        "i64": torch.tensor([-(2 ** 63), 2 ** 63 - 1, 0, -1]),
        "u8": torch.tensor([[0, 255], [7, 128]], dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(2, 0),
        "param": nn.Parameter(torch.arange(6.0).reshape(2, 3)),
        "meta": {"epoch": 3, "lr": 0.1, "name": "run-1", "betas": (0.9, 0.999), "none": None,
                 "flag": True, "raw": b"xy", "big": 2 ** 40, "neg": -7, "nothing": [],
                 "quote": "it's\tdone", "size": torch.Size([2, 3]),
                 "device": torch.device("cuda", 1), "no_bytes": b"", "eps": 1e-8},
    }


def views():
    base = torch.arange(60.0).reshape(3, 4, 5)
    return {
        "base": base,
        "transposed": base.transpose(0, 2),
        "sliced": base[1:, ::2, 1:4],
        "row": base[2, 1],
        "broadcast": base[0, 0, :1].expand(3, 4),
        "scalar": base[1, 2, 3],
        "empty": base[:, 0:0],
        "again": base,
        "ints": torch.arange(10)[2:8:3],
    }


def checkpoint():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(5, 4)).square().sum().backward()
        opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3,
            "args": argparse.Namespace(lr=0.01, epochs=3)}


class SystemCall:
    def __reduce__(self):
        return (os.system, ("echo this would run",))


class EvalCall:
    def __reduce__(self):
        return (builtins.eval, ("1 + 1",))


def small_net():
    torch.manual_seed(1)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                        nn.Linear(4 * 5 * 5, 3))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        net(torch.randn(8, 3, 5, 5)).square().mean().backward()
        opt.step()
    net.eval()
    x = torch.linspace(-1, 1, 2 * 3 * 5 * 5).reshape(2, 3, 5, 5)
    with torch.no_grad():
        y = net(x)
    return net, x, y


def gpt2_tiny():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(2)
    cfg = GPT2Config(vocab_size=96, n_positions=16, n_embd=32, n_layer=2, n_head=4,
                     activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # layer norms and biases off their initial 1 and 0
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    state = model.state_dict()
    for i in range(cfg.n_layer):
        state[f"transformer.h.{i}.attn.bias"] = torch.tril(torch.ones(16, 16, dtype=torch.bool)).view(1, 1, 16, 16)
    ids = torch.tensor([[5, 17, 90, 3, 3, 64, 0, 41, 12, 7]])
    with torch.no_grad():
        logits = model(ids).logits
    return state, ids, logits


def write_small():
    os.makedirs(OUT, exist_ok=True)
    expected = {"torch": torch.__version__, "files": {}}

    def save(name, obj, legacy=False, record=True, protocol=2):
        path = os.path.join(OUT, name)
        torch.save(obj, path, _use_new_zipfile_serialization=not legacy, pickle_protocol=protocol)
        if record:
            expected["files"][name] = flatten(obj)
        print(f"{name}: {os.path.getsize(path)} bytes")

    save("dtypes.pt", dtypes())
    save("dtypes_legacy.pt", dtypes(), legacy=True)
    save("views.pt", views())
    save("views_legacy.pt", views(), legacy=True)
    save("dtypes_p4.pt", dtypes(), protocol=4)
    save("views_legacy_p4.pt", views(), legacy=True, protocol=4)
    save("views_legacy_p1.pt", views(), legacy=True, protocol=1)
    ck = checkpoint()
    save("checkpoint.pt", ck, record=False)
    expected["files"]["checkpoint.pt"] = {
        "model": flatten(ck["model"]), "optimizer": flatten(ck["optimizer"]),
        "epoch": ck["epoch"]}
    save("int32.pt", {"ok": torch.ones(2), "counts": torch.tensor([1, 2], dtype=torch.int32),
                      "u16": torch.tensor([1, 2, 3]).to(torch.uint16)}, record=False)
    save("module.pt", nn.Linear(2, 2), record=False)
    save("one_tensor.pt", torch.arange(6.0).reshape(2, 3), record=False)
    torch.manual_seed(0)
    torch.jit.save(torch.jit.script(nn.Linear(2, 2)), os.path.join(OUT, "script.pt"))
    save("numpy.pt", np.arange(3.0), record=False)
    save("os_system.pt", {"weight": torch.ones(2), "payload": SystemCall()}, record=False)
    save("eval.pt", {"payload": EvalCall()}, record=False)
    net, x, y = small_net()
    save("small_net.pth", net.state_dict())
    expected["small_net"] = {"input": tensor_record("input", x), "output": y.flatten().tolist(),
                             "output_shape": list(y.shape)}
    state, ids, logits = gpt2_tiny()
    save("gpt2_tiny.bin", state, record=False)
    expected["gpt2_tiny"] = {"ids": ids.tolist(), "logits_shape": list(logits.shape),
                             "logits": logits.flatten().tolist()}
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")


def write_zoo(out, every):
    sys.path.insert(0, HERE)
    import gen_models

    os.makedirs(out, exist_ok=True)
    names = list(gen_models.MODELS) if every else ["resnet18", "resnet50"]
    x = torch.linspace(-2, 2, 2 * 3 * 64 * 64).reshape(2, 3, 64, 64)
    result = {"torch": torch.__version__, "input_shape": list(x.shape), "models": {}}
    for name in names:
        torch.manual_seed(0)
        m = gen_models.MODELS[name]()
        m.train()
        with torch.no_grad():  # move the batch norm statistics off their defaults
            for _ in range(2):
                m(torch.randn(4, 3, 64, 64))
        m.eval()
        with torch.no_grad():
            y = m(x)
        path = os.path.join(out, f"{name}.pth")
        torch.save(m.state_dict(), path)
        result["models"][name] = {"file": path, "output_shape": list(y.shape),
                                  "output": y.flatten().tolist()}
        print(f"{name}: {os.path.getsize(path)} bytes")
    with open(os.path.join(out, "zoo.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--zoo", metavar="DIR")
    ap.add_argument("--all", action="store_true")
    a = ap.parse_args()
    if a.zoo:
        write_zoo(a.zoo, a.all)
    else:
        write_small()
