"""nn.parallel and the DDP comm hooks use dtorch.distributed's public API
only (no facade privates, no raw arrays handed to process groups), and
version counters have one owner, Tensor._bump_version."""
import os
import re

import numpy as np

import dtorch
import dtorch.distributed as dist
from dtorch import nn
from dtorch.nn.parallel import DistributedDataParallel as DDP

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "dtorch")
USERS = ["nn/parallel", "distributed/algorithms", "distributed/metrics.py"]


def _files(rel):
    p = os.path.join(ROOT, rel)
    if p.endswith(".py"):
        yield p
        return
    for d, _, fs in os.walk(p):
        yield from (os.path.join(d, f) for f in fs if f.endswith(".py"))


def test_no_private_facade_names_or_raw_group_calls():
    private = re.compile(r"\bdist\._[a-z]|_default_or_none|\._group\(")
    # a process group's own collective methods take raw arrays
    raw = re.compile(r"\b(group|g|pg|self\.group)\.(all_reduce|broadcast|"
                     r"all_gather|reduce_scatter|all_to_all|"
                     r"all_reduce_coalesced|gather|scatter)\(")
    bad = []
    for rel in USERS:
        for p in _files(rel):
            with open(p) as fh:
                for i, line in enumerate(fh, 1):
                    if private.search(line) or raw.search(line):
                        bad.append(f"{os.path.relpath(p, ROOT)}:{i}: "
                                   f"{line.strip()}")
    assert not bad


def test_version_counter_has_one_owner():
    bad = []
    for p in _files("."):
        if os.path.basename(p) == "tensor.py":
            continue
        with open(p) as fh:
            for i, line in enumerate(fh, 1):
                if re.search(r"_vc\[0\]\s*(\+|-)?=(?!=)", line):
                    bad.append(f"{os.path.relpath(p, ROOT)}:{i}")
    assert not bad


def test_ddp_bumps_each_gradient_version_once_per_step():
    def body(rank, n):
        dtorch.manual_seed(0)
        for hook in (None, "allreduce_hook"):
            model = DDP(nn.Linear(4, 3).to(dtorch.float64))
            if hook:
                from dtorch.distributed.algorithms.ddp_comm_hooks import \
                    default_hooks
                model.register_comm_hook(None, getattr(default_hooks, hook))
            x = dtorch.tensor(np.random.default_rng(rank).standard_normal(
                (2, 4)))
            model(x).sum().backward()        # creates the gradients
            before = [p.grad._version for p in model.parameters()]
            model(x).sum().backward()        # accumulates, then reduces
            after = [p.grad._version for p in model.parameters()]
            # accumulation + the reduction's write-back
            assert [a - b for a, b in zip(after, before)] == [2, 2], \
                (hook, before, after)
        return True
    assert dist.spawn_threads(body, 2, timeout=60) == [True, True]
