"""Step time of double-backward programs, dtorch against PyTorch (when
installed), float32, one thread:

- WGAN-GP critic step: 2 strided convs + LeakyReLU + Linear, batch 32 of
  28x28, gradient penalty through autograd.grad(create_graph=True);
- MAML outer step: 2 x (conv 3x3 + training BatchNorm + ReLU + max pool)
  + Linear, one inner step with create_graph=True, cross_entropy.

Usage: python benchmarks/double_backward.py [--repeat 7]
Prints the median milliseconds per step for each framework.
"""
import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import dtorch  # noqa: E402

try:
    import torch
    torch.set_num_threads(1)
except ImportError:          # dtorch alone
    torch = None


def wgan_gp(M, repeat):
    rng = np.random.default_rng(0)
    real, fake = rng.standard_normal((2, 32, 1, 28, 28)).astype(np.float32)
    alpha = rng.random((32, 1, 1, 1)).astype(np.float32)
    M.manual_seed(0)
    nn = M.nn
    model = nn.Sequential(nn.Conv2d(1, 32, 4, 2, 1), nn.LeakyReLU(0.2),
                          nn.Conv2d(32, 64, 4, 2, 1), nn.LeakyReLU(0.2),
                          nn.Flatten(), nn.Linear(64 * 7 * 7, 1))

    def step():
        r, f = M.tensor(real), M.tensor(fake)
        a = M.tensor(alpha)
        x = (a * r + (1 - a) * f).requires_grad_(True)
        d = model(x)
        g, = M.autograd.grad(d, x, grad_outputs=M.ones_like(d),
                             create_graph=True)
        gp = ((g.reshape(32, -1).norm(2, dim=1) - 1) ** 2).mean()
        (model(f).mean() - model(r).mean() + 10 * gp).backward()
    return _time(step, repeat)


def maml(M, repeat):
    rng = np.random.default_rng(3)
    shapes = [(32, 1, 3, 3), (32,), (32,), (32,), (32, 32, 3, 3), (32,),
              (32,), (32,), (5, 32 * 7 * 7), (5,)]
    init = [(rng.standard_normal(s) * 0.2).astype(np.float32)
            for s in shapes]
    xs, xq = rng.standard_normal((2, 25, 1, 28, 28)).astype(np.float32)
    ys, yq = rng.integers(0, 5, (2, 25))
    F = M.nn.functional

    def fwd(p, x):
        for i in (0, 4):
            x = F.conv2d(x, p[i], p[i + 1], padding=1)
            x = F.batch_norm(x, None, None, p[i + 2], p[i + 3],
                             training=True)
            x = F.max_pool2d(F.relu(x), 2)
        return F.linear(x.flatten(1), p[8], p[9])

    def step():
        params = [M.tensor(a, requires_grad=True) for a in init]
        loss = F.cross_entropy(fwd(params, M.tensor(xs)), M.tensor(ys))
        grads = M.autograd.grad(loss, params, create_graph=True)
        fast = [p - 0.4 * g for p, g in zip(params, grads)]
        F.cross_entropy(fwd(fast, M.tensor(xq)), M.tensor(yq)).backward()
    return _time(step, repeat)


def _time(step, repeat):
    step()                                  # warm-up
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        step()
        ts.append(time.perf_counter() - t0)
    return 1000 * sorted(ts)[len(ts) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    for name, fn in (("wgan_gp", wgan_gp), ("maml", maml)):
        line = f"{name:8s} dtorch {fn(dtorch, args.repeat):7.1f} ms"
        if torch is not None:
            line += f"   torch {fn(torch, args.repeat):7.1f} ms"
        print(line)


if __name__ == "__main__":
    main()
