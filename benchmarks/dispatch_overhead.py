"""Per-op dispatch overhead on tiny tensors: dtorch vs PyTorch vs a minimal
closure-based NumPy autograd (the floor a NumPy framework can hope for).

Each case is a chain of --ops ops on tiny float32 tensors, forward and
backward (and forward alone), divided by the op count:

    chain    z = z * y; z = z + y         (4 elements, the issue-18 chain)
    add      z = z + y                     (same shape, float32, 16 elements)
    view     z = z.reshape(4, 4); z = z.t()
    matmul   z = z @ w                     (4x4, w requires grad too)
    linear   z = lin(z)                    (nn.Linear(8, 8), batch 2)

Times are CPU time of this thread (time.thread_time), which a loaded
machine disturbs far less than wall-clock time. The three frameworks run
interleaved, case by case, so they see the same machine; each round takes
the median of --reps runs, and the figures are ranges over --rounds rounds.

    OMP_NUM_THREADS=1 python benchmarks/dispatch_overhead.py [--rounds 7]
        [--reps 5] [--ops 1000] [--out F]

Measured 2026-12-01 (2-core VM under load 4-8; torch 2.13, 1 thread;
median dtorch/torch ratio of two runs, before = commit dd7f4b7):

    case     before      after       after, us/op (dtorch | torch | minimal)
    chain    1.50-1.59   1.22-1.27   5.4-6.2 | 4.2-4.8 | 2.8-3.1
    add      1.39-1.41   1.14-1.15   4.3-5.1 | 3.8-5.0 | 2.3-2.6
    view     1.31-1.37   0.92-0.96   5.1-6.4 | 5.3-6.5 | 2.2-2.4
    matmul   1.48-1.64   1.16-1.20   11.2-12.9 | 9.1-11.0 | 5.5-5.9
    linear   0.88-0.93   0.81-0.82   17.8-22.8 | 21.8-33.5 | 8.1-13.6
"""
import argparse
import gc
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dtorch  # noqa: E402

try:
    import torch
    torch.set_num_threads(1)
except ImportError:
    torch = None


# ---------------------------------------------------------------------------
# The leanest NumPy autograd one can write: a node is (parents, closure).

class V:
    __slots__ = ("d", "g", "parents", "bw")

    def __init__(self, d, parents=(), bw=None):
        self.d, self.g, self.parents, self.bw = d, None, parents, bw

    def __mul__(self, o):
        a, b = self.d, o.d
        return V(a * b, (self, o), lambda g: (g * b, g * a))

    def __add__(self, o):
        return V(self.d + o.d, (self, o), lambda g: (g, g))

    def __matmul__(self, o):
        a, b = self.d, o.d
        return V(a @ b, (self, o), lambda g: (g @ b.T, a.T @ g))

    def reshape(self, *shape):
        s = self.d.shape
        return V(self.d.reshape(shape), (self,), lambda g: (g.reshape(s),))

    def t(self):
        return V(self.d.T, (self,), lambda g: (g.T,))

    def sum(self):
        s = self.d.shape
        return V(self.d.sum(), (self,), lambda g: (np.broadcast_to(g, s),))

    def backward(self):
        topo, seen = [], set()
        stack = [(self, False)]
        while stack:              # iterative DFS post-order
            n, done = stack.pop()
            if done:
                topo.append(n)
                continue
            if id(n) in seen:
                continue
            seen.add(id(n))
            stack.append((n, True))
            stack.extend((p, False) for p in n.parents)
        self.g = np.ones_like(self.d)
        for n in reversed(topo):
            if n.bw is None or n.g is None:
                continue
            for p, g in zip(n.parents, n.bw(n.g)):
                p.g = g if p.g is None else p.g + g


class MinimalLinear:
    def __init__(self, n_in, n_out):
        # the identity: values stay put along the chain (no denormals)
        self.w = V(np.eye(n_out, n_in, dtype=np.float32))
        self.b = V(np.zeros(n_out, np.float32))

    def __call__(self, x):
        w, b, a = self.w, self.b, x.d
        out = a @ w.d.T + b.d
        return V(out, (x, w, b),
                 lambda g: (g @ w.d, g.T @ a, g.sum(0)))


class Minimal:
    """The minimal framework behind the same small interface."""
    @staticmethod
    def tensor(a, requires_grad=False):
        return V(np.asarray(a, np.float32))

    @staticmethod
    def linear(n_in, n_out):
        return MinimalLinear(n_in, n_out)

    @staticmethod
    def backward(s):
        s.backward()


def lib_api(lib):
    class Api:
        @staticmethod
        def tensor(a, requires_grad=False):
            return lib.tensor(np.asarray(a, np.float32),
                              requires_grad=requires_grad)

        @staticmethod
        def linear(n_in, n_out):
            lin = lib.nn.Linear(n_in, n_out)
            with lib.no_grad():     # the identity, as in MinimalLinear
                lin.weight.copy_(lib.tensor(np.eye(n_out, n_in,
                                                   dtype=np.float32)))
                lin.bias.zero_()
            return lin

        @staticmethod
        def backward(s):
            s.backward()
    return Api


# ---------------------------------------------------------------------------
# The cases: make(api, n_ops) -> (forward() -> scalar, ops per forward)

def case_chain(api, n):
    x = api.tensor(np.ones(4), requires_grad=True)
    y = api.tensor(np.full(4, 0.5))

    def fwd():
        z = x
        for _ in range(n // 2):
            z = z * y
            z = z + y
        return z.sum()
    return fwd


def case_add(api, n):
    x = api.tensor(np.ones(16), requires_grad=True)
    y = api.tensor(np.full(16, 0.5))

    def fwd():
        z = x
        for _ in range(n):
            z = z + y
        return z.sum()
    return fwd


def case_view(api, n):
    x = api.tensor(np.ones(16), requires_grad=True)

    def fwd():
        z = x
        for _ in range(n // 2):
            z = z.reshape(4, 4)
            z = z.t()
            z = z.reshape(16)
        return z.sum()
    return fwd


def case_matmul(api, n):
    x = api.tensor(np.eye(4), requires_grad=True)
    w = api.tensor(np.eye(4), requires_grad=True)

    def fwd():
        z = x
        for _ in range(n):
            z = z @ w
        return z.sum()
    return fwd


def case_linear(api, n):
    lin = api.linear(8, 8)
    x = api.tensor(np.ones((2, 8)), requires_grad=True)

    def fwd():
        z = x
        for _ in range(n):
            z = lin(z)
        return z.sum()
    return fwd


# ops per forward of each case (the view case makes 3 per step)
CASES = {"chain": (case_chain, lambda n: 2 * (n // 2)),
         "add": (case_add, lambda n: n),
         "view": (case_view, lambda n: 3 * (n // 2)),
         "matmul": (case_matmul, lambda n: n),
         "linear": (case_linear, lambda n: n)}


def run_once(api, fwd):
    gc.collect()
    t0 = time.thread_time()
    s = fwd()
    t1 = time.thread_time()
    api.backward(s)
    t2 = time.thread_time()
    return t1 - t0, t2 - t1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ops", type=int, default=1000)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    libs = {"dtorch": lib_api(dtorch), "minimal": Minimal}
    if torch is not None:
        libs["torch"] = lib_api(torch)
    report = {}
    for cname in args.cases.split(","):
        make, count = CASES[cname]
        n_ops = count(args.ops)
        runs = {k: make(api, args.ops) for k, api in libs.items()}
        for k, api in libs.items():      # warm up (first calls, caches)
            run_once(api, runs[k])
        per_round = {k: [] for k in libs}     # (fwd+bwd, fwd, bwd) us/op
        for _ in range(args.rounds):
            got = {k: [] for k in libs}
            for _ in range(args.reps):
                for k, api in libs.items():
                    got[k].append(run_once(api, runs[k]))
            for k, v in got.items():
                f = statistics.median(a for a, _ in v)
                b = statistics.median(b for _, b in v)
                t = statistics.median(a + b for a, b in v)
                per_round[k].append(tuple(1e6 * x / n_ops for x in (t, f, b)))
        report[cname] = per_round
        line = [f"{cname:7s}"]
        for k, v in per_round.items():
            tot = sorted(x[0] for x in v)
            fw = statistics.median(x[1] for x in v)
            bw = statistics.median(x[2] for x in v)
            line.append(f"{k} {tot[0]:.2f}-{tot[-1]:.2f} "
                        f"(fwd {fw:.2f} bwd {bw:.2f})")
        if "torch" in per_round:
            r = sorted(d[0] / t[0] for d, t in
                       zip(per_round["dtorch"], per_round["torch"]))
            line.append(f"dtorch/torch {r[0]:.2f}-{r[-1]:.2f} "
                        f"(median {statistics.median(r):.2f})")
        print(" | ".join(line), flush=True)
    print("us per op, forward+backward, ranges over rounds "
          f"(rounds={args.rounds}, reps={args.reps}, ops={args.ops}); "
          "fwd/bwd are medians")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "us_per_op": report}, f, indent=1)


if __name__ == "__main__":
    main()
