"""Golden values for ember's gradients of gradients (create_graph) and kept
graphs (retain_graph), autograd/walk.rs: whole uses of a differentiated
gradient, each case's results in PyTorch. Writes double_backward_cases.json
beside this script. Every tensor is float64."""
import json, os
import torch
import torch.nn.functional as F

torch.manual_seed(0)


def rec(t):
    return {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
            "values": t.detach().reshape(-1).tolist()}


def randn(*shape):
    return torch.randn(*shape, dtype=torch.float64)


inputs = {
    "x": randn(4, 3),        # a batch of 4 inputs of 3 features
    "x2": randn(4, 3),       # a second batch (fake samples, query set)
    "w1": randn(5, 3) * 0.7,  # linear(3 -> 5)
    "b1": randn(5) * 0.1,
    "w2": randn(1, 5) * 0.7,  # linear(5 -> 1)
    "b2": randn(1) * 0.1,
    "y": randn(4, 1),        # regression targets
    "y2": randn(4, 1),
    "eps": torch.rand(4, 1, dtype=torch.float64),  # interpolation weights
    "v": randn(4, 3),        # a direction
    "img": randn(2, 3, 6, 6),   # images for a convolutional critic
    "k1": randn(4, 3, 3, 3) * 0.3,  # conv 3 -> 4, 3x3, stride 2, padding 1
    "kb1": randn(4) * 0.1,
    "k2": randn(2, 2, 3, 3) * 0.3,  # conv 4 -> 2, 3x3, 2 groups
    # a small convolutional classifier for MAML (conv, batch norm, ReLU, pools)
    "support": randn(4, 1, 6, 6),
    "query": randn(4, 1, 6, 6),
    "c1": randn(3, 1, 3, 3) * 0.5,  # conv 1 -> 3, 3x3, padding 1
    "cb1": randn(3) * 0.1,
    "gamma": 1 + randn(3) * 0.1,    # batch norm's weight and bias
    "beta": randn(3) * 0.1,
    "wh": randn(2, 3) * 0.5,        # linear(3 -> 2)
    "bh": randn(2) * 0.1,
    # attention: queries [1, 2, 3, 4], keys and values [1, 2, 5, 4]
    "q": randn(1, 2, 3, 4),
    "k": randn(1, 2, 5, 4),
    "vv": randn(1, 2, 5, 4),
    # a covariance factor and residuals for a Gaussian likelihood
    "m": randn(3, 3) * 0.6,
    "r": randn(3, 2),
}
cases = []


def leaves(need):
    return {k: v.clone().requires_grad_(k in need) for k, v in inputs.items()}


def case(name, need, fn):
    """fn(leaves) -> dict of named result tensors."""
    t = leaves(need)
    out = fn(t)
    cases.append({"name": name, "results": {k: rec(v) for k, v in out.items()}})


def critic(t, z, act):
    return F.linear(act(F.linear(z, t["w1"], t["b1"])), t["w2"], t["b2"])


# WGAN-GP's gradient penalty for a leaky-relu critic: the critic's gradient at
# points between real and fake samples, its norm pushed to 1, differentiated
# with respect to the critic's weights
def wgan_gp(t):
    mix = (t["eps"] * t["x"] + (1 - t["eps"]) * t["x2"]).requires_grad_(True)
    out = critic(t, mix, lambda h: F.leaky_relu(h, 0.2))
    (g,) = torch.autograd.grad(out.sum(), mix, create_graph=True)
    penalty = ((g.norm(2, dim=1) - 1) ** 2).mean()
    loss = critic(t, t["x2"], lambda h: F.leaky_relu(h, 0.2)).mean() \
        - critic(t, t["x"], lambda h: F.leaky_relu(h, 0.2)).mean() + 10 * penalty
    grads = torch.autograd.grad(loss, [t["w1"], t["b1"], t["w2"], t["b2"]])
    return {"penalty": penalty, "w1": grads[0], "b1": grads[1], "w2": grads[2],
            "b2": grads[3]}


case("wgan_gp", {"w1", "b1", "w2", "b2"}, wgan_gp)


# StyleGAN's R1 penalty for a convolutional critic: the squared gradient of
# the critic at real images, differentiated with respect to its kernels
def r1(t):
    img = t["img"].clone().requires_grad_(True)
    h = F.leaky_relu(F.conv2d(img, t["k1"], t["kb1"], stride=2, padding=1), 0.2)
    score = F.conv2d(h, t["k2"], groups=2).sum()
    (g,) = torch.autograd.grad(score, img, create_graph=True)
    penalty = g.pow(2).sum() / 2
    grads = torch.autograd.grad(penalty, [t["k1"], t["kb1"], t["k2"]])
    return {"penalty": penalty, "k1": grads[0], "kb1": grads[1], "k2": grads[2]}


case("r1", {"k1", "kb1", "k2"}, r1)


# one MAML step: an inner SGD step on the support set with create_graph, the
# query loss of the adapted weights differentiated through the inner step
def maml(t):
    params = [t["w1"], t["b1"], t["w2"], t["b2"]]

    def net(p, z):
        return F.linear(torch.tanh(F.linear(z, p[0], p[1])), p[2], p[3])

    inner = F.mse_loss(net(params, t["x"]), t["y"])
    grads = torch.autograd.grad(inner, params, create_graph=True)
    fast = [p - 0.1 * g for p, g in zip(params, grads)]
    outer = F.mse_loss(net(fast, t["x2"]), t["y2"])
    meta = torch.autograd.grad(outer, params)
    return {"outer": outer, "w1": meta[0], "b1": meta[1], "w2": meta[2],
            "b2": meta[3]}


case("maml", {"w1", "b1", "w2", "b2"}, maml)


# a Hessian-vector product of a softmax classifier's loss (log_softmax and a
# one-hot target), by double backward
def hvp(t):
    logits = F.linear(t["x"], t["w1"], t["b1"])
    target = F.one_hot(torch.tensor([0, 3, 1, 4]), 5).to(torch.float64)
    loss = -(F.log_softmax(logits, dim=1) * target).sum(1).mean()
    (g,) = torch.autograd.grad(loss, t["w1"], create_graph=True)
    direction = inputs["w1"].flip(0)
    (hv,) = torch.autograd.grad((g * direction).sum(), t["w1"])
    return {"loss": loss, "hv": hv}


case("hvp", {"w1"}, hvp)


# the full Hessian of a small function, row by row, each with retain_graph
def hessian(t):
    x = t["x"][0]
    f = (x.sin() * x.pow(3)).sum() + (x[0] * x[1] * x[2]).exp()
    (g,) = torch.autograd.grad(f, t["x"], create_graph=True)
    rows = [torch.autograd.grad(g[0, i], t["x"], retain_graph=True)[0][0]
            for i in range(3)]
    return {"f": f, "hessian": torch.stack(rows)}


case("hessian", {"x"}, hessian)


# a Jacobian-vector product by the double-backward trick: a vector-Jacobian
# product against a dummy u (which requires grad), differentiated in u
def jvp(t):
    y = torch.tanh(F.linear(t["x"], t["w1"], t["b1"]))
    u = torch.zeros_like(y, requires_grad=True)
    (vjp,) = torch.autograd.grad(y, t["x"], grad_outputs=u, create_graph=True)
    (jv,) = torch.autograd.grad(vjp, u, grad_outputs=t["v"])
    return {"jvp": jv}


case("jvp", {"x"}, jvp)


# backward(create_graph=True) into a leaf's .grad, then backward of a function
# of that gradient: .grad holds the sum of the first and the second
def backward_twice(t):
    x = t["x"]
    y = (x.exp() * x.sigmoid()).sum()
    y.backward(create_graph=True)
    first = x.grad.detach().clone()
    (x.grad * x.grad).sum().backward()
    return {"first": first, "grad": x.grad}


case("backward_twice", {"x"}, backward_twice)


# retain_graph: two backwards through one graph add up
def retained(t):
    y = (t["x"].pow(2) * t["x2"].cos()).sum()
    y.backward(retain_graph=True)
    y.backward()
    return {"grad": t["x"].grad}


case("retained", {"x"}, retained)

# MAML with a convolutional classifier in training mode (batch statistics, as
# MAML's few-shot networks run): the inner step's gradients go through batch
# norm, max pooling and average pooling, and the outer gradient through them
# again
CONV_PARAMS = ["c1", "cb1", "gamma", "beta", "wh", "bh"]


def conv_net(p, z):
    h = F.conv2d(z, p[0], p[1], padding=1)
    h = F.relu(F.batch_norm(h, None, None, p[2], p[3], training=True))
    h = F.avg_pool2d(F.max_pool2d(h, 2), 3)
    return F.linear(h.flatten(1), p[4], p[5])


def maml_conv(t):
    params = [t[k] for k in CONV_PARAMS]
    ys, yq = torch.tensor([0, 1, 1, 0]), torch.tensor([1, 0, 0, 1])
    inner = F.cross_entropy(conv_net(params, t["support"]), ys)
    grads = torch.autograd.grad(inner, params, create_graph=True)
    fast = [p - 0.4 * g for p, g in zip(params, grads)]
    outer = F.cross_entropy(conv_net(fast, t["query"]), yq)
    meta = torch.autograd.grad(outer, params)
    out = {"outer": outer}
    out.update(dict(zip(CONV_PARAMS, meta)))
    return out


case("maml_conv", set(CONV_PARAMS), maml_conv)


# a Hessian-vector product through causal attention on PyTorch's math backend
# (its fused kernels are not differentiable twice)
def attention_hvp(t):
    from torch.nn.attention import sdpa_kernel, SDPBackend
    with sdpa_kernel(SDPBackend.MATH):
        o = F.scaled_dot_product_attention(t["q"], t["k"], t["vv"], is_causal=True)
        loss = o.sin().sum()
        g = torch.autograd.grad(loss, [t["q"], t["k"], t["vv"]], create_graph=True)
        dot = sum((gi * gi.detach().flip(-1)).sum() for gi in g)
        hv = torch.autograd.grad(dot, [t["q"], t["k"], t["vv"]])
    return {"loss": loss, "q": hv[0], "k": hv[1], "vv": hv[2]}


case("attention_hvp", {"q", "k", "vv"}, attention_hvp)

# a Hessian-vector product of a Gaussian negative log-likelihood whose
# covariance S = M Mᵀ + I is learned: through Cholesky, a triangular solve, the
# eigenvalues, the determinant, the inverse and the singular values
def linalg_hvp(t):
    m = t["m"]
    s = m @ m.T + torch.eye(3, dtype=torch.float64)
    chol = torch.linalg.cholesky(s)
    z = torch.linalg.solve_triangular(chol, t["r"], upper=False)
    nll = 0.5 * z.square().sum() + 2 * chol.diagonal().log().sum()
    extra = torch.linalg.eigvalsh(s).log().sum() + torch.linalg.det(s).sqrt() \
        + torch.linalg.inv(s).trace() + torch.linalg.svdvals(m).pow(3).sum() \
        + torch.linalg.slogdet(s)[1]
    loss = nll + 0.1 * extra
    (g,) = torch.autograd.grad(loss, m, create_graph=True)
    (hv,) = torch.autograd.grad((g * inputs["m"].flip(0)).sum(), m)
    return {"loss": loss, "hv": hv}


case("linalg_hvp", {"m"}, linalg_hvp)

out = {"torch": torch.__version__,
       "inputs": {k: rec(v) for k, v in inputs.items()},
       "cases": cases}
path = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                    "double_backward_cases.json")
with open(path, "w") as f:
    json.dump(out, f, indent=1)
print(f"wrote {len(cases)} cases to {path}")
