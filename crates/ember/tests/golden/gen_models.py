"""torchvision's architectures, from PyTorch, for ember::models (tests/models.rs).

Writes models.json next to this file: for AlexNet, VGG-11, VGG-16, ResNet-18 and
ResNet-50 (1000 classes), the parameter count, every state_dict entry (name, shape,
dtype) in order, and the output shape for a few input shapes (or the error); and
under "gpt2_small", ember::models::gpt2_small's layout built from torch.nn (GPT-2's
124M decoder from nn.TransformerEncoderLayer blocks, the head tied to the token
embedding): its parameter count, its parameters (a tied tensor is listed once, as
named_parameters lists it), the state_dict entries that repeat a tied tensor, and
the logits' shape.

torchvision itself is not needed: the classes below are torchvision's
(torchvision/models/alexnet.py, vgg.py, resnet.py) reduced to plain torch.nn, with
the same modules, attribute names and forward. Everything is built on the meta
device, so nothing is allocated or initialised.
Run from anywhere: python3 crates/ember/tests/golden/gen_models.py
"""
import json
import os

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))


class AlexNet(nn.Module):
    def __init__(self, num_classes=1000, dropout=0.5):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, kernel_size=11, stride=4, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(64, 192, kernel_size=5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(192, 384, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout),
            nn.Linear(256 * 6 * 6, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(p=dropout),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x):
        x = self.features(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


VGG_CFGS = {
    "A": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "D": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
}


class VGG(nn.Module):
    def __init__(self, features, num_classes=1000, dropout=0.5):
        super().__init__()
        self.features = features
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096),
            nn.ReLU(True),
            nn.Dropout(p=dropout),
            nn.Linear(4096, 4096),
            nn.ReLU(True),
            nn.Dropout(p=dropout),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x):
        x = self.features(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


def make_layers(cfg):
    layers = []
    in_channels = 3
    for v in cfg:
        if v == "M":
            layers += [nn.MaxPool2d(kernel_size=2, stride=2)]
        else:
            layers += [nn.Conv2d(in_channels, v, kernel_size=3, padding=1), nn.ReLU(inplace=True)]
            in_channels = v
    return nn.Sequential(*layers)


def conv3x3(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        width = planes
        self.conv1 = conv1x1(inplanes, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = conv3x3(width, width, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = conv1x1(width, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    def __init__(self, block, layers, num_classes=1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)

    def _make_layer(self, block, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes * block.expansion, stride),
                                       nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        for _ in range(1, blocks):
            layers.append(block(self.inplanes, planes))
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


class Gpt2Small(nn.Module):
    """A decoder of nn.TransformerEncoderLayer(norm_first=True) blocks with a
    causal mask, learned positions, a final LayerNorm and a head that is the token
    embedding (GPT-2's 50257 tokens padded to 50304)."""

    def __init__(self, vocab=50304, context=1024, layers=12, heads=12, width=768):
        super().__init__()
        self.tok_emb, self.pos_emb = nn.Embedding(vocab, width), nn.Embedding(context, width)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok_emb.weight

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(t, device=idx.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=idx.device)
        return self.head(self.ln_f(self.blocks(x, mask=mask, is_causal=True)))


def gpt2_small():
    with torch.device("meta"):
        m = Gpt2Small()
    params = [[k, list(v.shape), str(v.dtype).replace("torch.", "")] for k, v in m.named_parameters()]
    listed = {k for k, _ in m.named_parameters()}
    with torch.no_grad():
        y = m(torch.zeros(2, 16, dtype=torch.long, device="meta"))
    out = {"num_parameters": sum(p.numel() for p in m.parameters()), "parameters": params,
           "tied_state": [k for k in m.state_dict() if k not in listed],
           "input": [2, 16], "output": list(y.shape)}
    print(f"gpt2_small: {out['num_parameters']:,} parameters, {len(params)} tensors")
    return out


MODELS = {
    "alexnet": lambda: AlexNet(),
    "vgg11": lambda: VGG(make_layers(VGG_CFGS["A"])),
    "vgg16": lambda: VGG(make_layers(VGG_CFGS["D"])),
    "resnet18": lambda: ResNet(BasicBlock, [2, 2, 2, 2]),
    "resnet50": lambda: ResNet(Bottleneck, [3, 4, 6, 3]),
}
# [N, 3, H, W] inputs: 224 as trained, 32 (CIFAR-sized), and a size too small for
# some (AlexNet needs 63, VGG 32)
INPUTS = [[2, 3, 224, 224], [2, 3, 32, 32], [1, 3, 31, 31]]


def main():
    out = {"torch": torch.__version__, "models": {}}
    for name, make in MODELS.items():
        with torch.device("meta"):
            m = make()
        m.eval()
        state = [[k, list(v.shape), str(v.dtype).replace("torch.", "")] for k, v in m.state_dict().items()]
        outputs = []
        for shape in INPUTS:
            try:
                with torch.no_grad():
                    y = m(torch.empty(shape, device="meta"))
                outputs.append({"input": shape, "output": list(y.shape)})
            except RuntimeError as e:
                outputs.append({"input": shape, "error": str(e).splitlines()[0]})
        out["models"][name] = {"num_parameters": sum(p.numel() for p in m.parameters()),
                               "state": state, "outputs": outputs}
        print(f"{name}: {out['models'][name]['num_parameters']:,} parameters, {len(state)} state entries")
    # one state entry or output per line
    lines = ['{"torch": %s, "models": {' % json.dumps(out["torch"])]
    for i, (name, m) in enumerate(out["models"].items()):
        lines.append('%s: {"num_parameters": %d, "state": [' % (json.dumps(name), m["num_parameters"]))
        lines.append(",\n".join(json.dumps(e) for e in m["state"]))
        lines.append('], "outputs": [')
        lines.append(",\n".join(json.dumps(o) for o in m["outputs"]))
        lines.append("]}" + ("," if i + 1 < len(out["models"]) else ""))
    out["gpt2_small"] = gpt2_small()
    g = out["gpt2_small"]
    lines.append('}, "gpt2_small": {"num_parameters": %d, "parameters": [' % g["num_parameters"])
    lines.append(",\n".join(json.dumps(e) for e in g["parameters"]))
    lines.append('], "tied_state": %s, "input": %s, "output": %s}}' % (
        json.dumps(g["tied_state"]), json.dumps(g["input"]), json.dumps(g["output"])))
    text = "\n".join(lines) + "\n"
    assert json.loads(text) == out
    with open(os.path.join(HERE, "models.json"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
