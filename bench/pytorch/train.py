"""The workloads of crates/ember/benches/train.rs through PyTorch, on the CPU.

Prints one JSON line per row (see ops.py for the format and the timing method).
"""
import csv
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from ops import bench

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def mlp(sizes):
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        if i > 0:
            layers.append(nn.ReLU())
        layers.append(nn.Linear(a, b))
    return nn.Sequential(*layers)


def step(model, opt, x, y):
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def main():
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads()}), flush=True)
    with open(os.path.join(ROOT, "data", "iris.csv")) as f:
        rows = list(csv.reader(f))[1:]
    X = torch.tensor([[float(v) for v in r[:4]] for r in rows])
    Y = torch.tensor([int(r[4]) for r in rows])
    perm = torch.randperm(150, generator=torch.Generator().manual_seed(32))[:120]
    x, y = X[perm], Y[perm]

    def iris():
        torch.manual_seed(32)
        model = mlp([4, 8, 9, 3])
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        for _ in range(100):
            last = step(model, opt, x, y)
        return last

    bench("iris/100_epochs", iris, None, "s/run", min_time=3.0)

    torch.manual_seed(0)
    model = mlp([784, 1024, 1024, 10])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    xb, yb = torch.randn(256, 784), torch.randint(0, 10, (256,))
    bench("mlp_784_1024_1024_10/adam_step_b256", lambda: step(model, opt, xb, yb), 256, "samples/s", min_time=5.0)
    cnn()


def mnist_cnn():
    return nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(9216, 128), nn.ReLU(), nn.Linear(128, 10))


def digits_cnn():
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(512, 64), nn.ReLU(), nn.Linear(64, 10))


def cnn():
    torch.manual_seed(0)
    model = mnist_cnn()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    xb, yb = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    bench("cnn_mnist/adam_step_b64", lambda: step(model, opt, xb, yb), 64, "samples/s", min_time=5.0)

    with open(os.path.join(ROOT, "data", "digits.csv")) as f:
        rows = list(csv.reader(f))[1:]
    X = torch.tensor([[float(v) for v in r[:64]] for r in rows]).div(16).reshape(-1, 1, 8, 8)
    Y = torch.tensor([int(r[64]) for r in rows])
    perm = torch.randperm(len(Y), generator=torch.Generator().manual_seed(32))
    x, y = X[perm[:1437]], Y[perm[:1437]]
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64, shuffle=True,
                                         generator=torch.Generator().manual_seed(32))
    torch.manual_seed(32)
    model = digits_cnn()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def epoch():
        for xb, yb in loader:
            last = step(model, opt, xb, yb)
        return last

    bench("digits_cnn/epoch_b64", epoch, len(y), "samples/s", min_time=5.0)


if __name__ == "__main__":
    sys.exit(main())
