"""What several test files need, in one place (issue 30 item 5): a fresh
interpreter to run code in, loopback ports, and the comparisons of dtorch
with PyTorch or NumPy. ``import helpers`` from any file in tests/ (pytest
puts tests/ on sys.path; a test file run as a script has it as sys.path[0]).

Ports: a server that binds port 0 and reports what it got (``TCPStore(...,
0, is_server=True).port``) needs no helper and races with nobody; use
``free_port`` only where the port must be known before the process that
binds it starts (a rendezvous address passed to rank processes), and retry
on a fresh port when that process reports it could not bind.
"""
import json
import os
import socket
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one_thread_env(**extra):
    """os.environ with one BLAS/OpenMP thread (the machine is shared) and
    ``extra`` on top (a value of None removes that variable)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def run_python(code, *argv, env=None, cwd=None, timeout=120, check=True):
    """Run ``python -c code argv...`` in a fresh interpreter; with
    ``check``, fail the test (with the end of stderr) unless it exits 0.
    Returns the CompletedProcess (text stdout/stderr)."""
    r = subprocess.run([sys.executable, "-c", code, *map(str, argv)],
                       capture_output=True, text=True, timeout=timeout,
                       env=env, cwd=cwd)
    if check:
        assert r.returncode == 0, (
            f"the subprocess exited {r.returncode}:\n{r.stderr[-3000:]}")
    return r


def last_json(stdout):
    """The JSON value printed on the last line of ``stdout``."""
    return json.loads(stdout.strip().splitlines()[-1])


def free_port():
    """A loopback TCP port that was free a moment ago (another process may
    take it before ours binds it: see the module docstring)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def to_numpy(x):
    """A dtorch or torch tensor (detached), or anything NumPy takes, as an
    ndarray."""
    if getattr(x, "is_sparse", False):
        x = x.to_dense()
    if hasattr(x, "detach"):
        return np.asarray(x.detach().numpy())
    return np.asarray(x)


def close(a, b, tol=1e-10, atol=None, what=""):
    """Assert ``a`` and ``b`` (tensors of either library or arrays) agree
    within ``rtol=tol`` and ``atol`` (default ``tol``)."""
    np.testing.assert_allclose(to_numpy(a), to_numpy(b), rtol=tol,
                               atol=tol if atol is None else atol,
                               err_msg=what)


def same_as_torch(fd, ft, *arrays, tol=1e-10, rtol=None, grad=True,
                  nograd=(), seed=0):
    """``fd`` on dtorch tensors and ``ft`` on torch tensors made from the
    same ``arrays``: equal outputs and, with ``grad``, equal gradients of
    ``sum(out * w)`` (w fixed by ``seed``) for the floating inputs whose
    index is not in ``nograd`` (a gradient one library leaves None is
    zeros). Returns the two outputs."""
    import dtorch
    import torch
    req = [grad and a.dtype.kind in "fc" and i not in nograd
           for i, a in enumerate(arrays)]
    xd = [dtorch.tensor(a, requires_grad=r) for a, r in zip(arrays, req)]
    xt = [torch.tensor(a, requires_grad=r) for a, r in zip(arrays, req)]
    od, ot = fd(*xd), ft(*xt)
    rtol = tol if rtol is None else rtol
    close(od, ot, tol=rtol, atol=tol)
    if grad and any(req):
        w = np.random.default_rng(seed).standard_normal(tuple(ot.shape))
        (od * dtorch.tensor(w)).sum().backward()
        (ot * torch.tensor(w)).sum().backward()
        for i, (a, b) in enumerate(zip(xd, xt)):
            if req[i] and (a.grad is not None or b.grad is not None):
                zero = np.zeros(a.shape, arrays[i].dtype)
                close(zero if a.grad is None else a.grad,
                      zero if b.grad is None else b.grad, tol=rtol,
                      atol=tol, what=f"gradient of input {i}")
    return od, ot


def tcp_rank_env(rank, world, port, token, **extra):
    """The environment of rank ``rank`` of a ``world``-rank tcp job that
    meets at 127.0.0.1:``port`` (what the launcher would set), one BLAS
    thread, a 60 s collective timeout unless set; ``extra`` on top."""
    env = one_thread_env(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port), DTORCH_RDZV_TOKEN=token)
    env.setdefault("DTORCH_COLLECTIVE_TIMEOUT", "60")
    env.update(extra)
    return env


def start_tcp_ranks(argv, world=2, cwd=None, rank_extra=None, **extra):
    """``python argv...`` once per rank of a loopback tcp job (see
    tcp_rank_env; ``rank_extra(rank)``: more variables for one rank), its
    output piped; returns the Popen objects, rank order."""
    port, token = free_port(), os.urandom(8).hex()
    return [subprocess.Popen(
        [sys.executable, *map(str, argv)], cwd=cwd, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=tcp_rank_env(r, world, port, token, **extra,
                         **(rank_extra(r) if rank_extra else {})))
        for r in range(world)]


def finish(procs, timeout=150, stop_when=None):
    """[(returncode, stdout, stderr)] of each process, in order; whatever
    still runs after a timeout or error, or once ``stop_when(outs so far)``
    is true, is killed (and reaped)."""
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            outs.append((p.returncode, out, err))
            if stop_when is not None and stop_when(outs):
                break
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


def mpi_env(**extra):
    """The environment for an ``mpiexec`` job from a test: Open MPI may run
    as root and oversubscribe the cores, one BLAS thread, none of an outer
    job's rank variables; ``extra`` on top (None removes one)."""
    outer = dict.fromkeys(("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "WORLD_SIZE",
                           "SLURM_NTASKS"))
    return one_thread_env(**{
        "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "OMPI_MCA_rmaps_base_oversubscribe": "1",
        "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
        **outer, **extra})


def train_steps(opt, loss, steps, sched=None):
    """``steps`` optimizer steps on ``loss()`` (a closure that computes the
    loss, drawing its batch if it has to), each followed by ``sched.step()``
    when a scheduler is given; returns the last loss."""
    for _ in range(steps):
        opt.zero_grad()
        out = loss()
        out.backward()
        opt.step()
        if sched is not None:
            sched.step()
    return out
