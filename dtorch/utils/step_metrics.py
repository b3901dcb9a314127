"""``dtorch.utils.step_metrics``: how fast a training loop runs, against
what the machine can do, and where each step's time goes.

::

    from dtorch.utils.step_metrics import StepMetrics
    metrics = StepMetrics(model, optimizer, tokens_per_step=B * T,
                          log_dir="runs/gpt")         # JSON lines + TensorBoard
    for x, y in metrics.data(loader):                 # times the data wait
        with metrics.step() as rec:
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            rec["loss"] = loss.item()                  # anything extra to log

Per step it records (seconds unless named otherwise):

- ``step_s`` the step's wall time, ``data_s`` the wait for the batch before
  it (the loader's ``next``), so a step's whole cost is ``data_s + step_s``;
- ``forward_s`` the model's forward calls (its forward hooks), ``optimizer_s``
  the optimizer's ``step`` calls (its step hooks), ``comm_wait_s`` the time
  DDP blocked at the end of backward for bucket all-reduces that had not
  finished (not the overlapped communication), ``backward_s`` the rest of
  the time from the last forward's end to the optimizer step (the loss and
  backward, less the communication wait), ``other_s`` what is left;
- ``samples_per_s`` / ``tokens_per_s`` from ``samples_per_step`` /
  ``tokens_per_step`` over ``data_s + step_s``; ``flops_per_s`` and ``mfu``
  (achieved over peak FLOP/s) from the FLOPs of one step, counted by
  ``FlopCounterMode`` during the first step (or given as ``flops_per_step``),
  against ``peak_flops`` (given, or measured once on this machine by
  ``measure_peak_flops``: a GEMM probe);
- ``peak_memory_bytes``: the device's peak allocated memory on CUDA
  (``dtorch.cuda.max_memory_allocated``), the process's peak resident set on
  the CPU (``getrusage``; it includes more than tensor data);
- ``stragglers``: under DDP or FSDP, the slow ranks its straggler detection named
  since the previous record (``DistributedDataParallel.straggler_reports``).

Each record is one line of ``<log_dir>/metrics[.rank<R>].jsonl`` and the
same numbers as TensorBoard scalars (``step/<name>``) in ``log_dir``; every
``print_every`` steps rank 0 prints a progress line. Nothing here
synchronises ranks: each rank measures itself.
"""
import contextlib
import json
import math
import os
import resource
import sys
import time

from .. import _backend as _B
from ..autograd.grad_mode import no_grad

__all__ = ["StepMetrics", "measure_peak_flops"]

_PHASES = ("data_s", "forward_s", "backward_s", "comm_wait_s",
           "optimizer_s", "other_s")
_peak_cache = {}


def measure_peak_flops(device="cpu", dtype=None, size=None, repeats=5):
    """The FLOP/s of this machine's best square GEMM (float32 by default):
    the ceiling MFU is measured against. Cached per (device, dtype, size,
    BLAS threads)."""
    import dtorch
    dtype = dtorch.float32 if dtype is None else dtype
    dev = dtorch.device(device)
    size = size or (4096 if dev.type == "cuda" else 1024)
    key = (str(dev), str(dtype), size, dtorch.get_num_threads())
    if key in _peak_cache:
        return _peak_cache[key]
    with no_grad():
        a = dtorch.randn(size, size, device=dev).to(dtype)
        b = dtorch.randn(size, size, device=dev).to(dtype)
        best = math.inf
        for _ in range(repeats + 1):           # the first one warms up
            t0 = time.perf_counter()
            c = a @ b
            _sync(c)
            best = min(best, time.perf_counter() - t0)
    _peak_cache[key] = 2 * size ** 3 / best
    return _peak_cache[key]


def _sync(t):
    if _B._cupy is not None and t.device.type == "cuda":
        _B._cupy.cuda.get_current_stream().synchronize()


def _rank():
    dist = sys.modules.get("dtorch.distributed")
    if dist is not None and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _peak_memory(device):
    if device is not None and device.type == "cuda":
        import dtorch
        return int(dtorch.cuda.max_memory_allocated(device))
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(kib) * 1024


def _reducers(model):
    """The DDP reducers under ``model`` (their ``stats['wait_s']`` is the
    communication wait)."""
    out = []
    for m in model.modules() if model is not None else ():
        r = m.__dict__.get("_reducer")
        if r is not None and hasattr(r, "stats"):
            out.append(r)
    return out


class StepMetrics:
    """Throughput, MFU and the phase breakdown of each training step (see
    the module docstring).

    Args:
        model: the module whose forward is timed (a DDP model: its wrapped
            module's time plus DDP's communication wait); optional.
        optimizer: the optimizer whose ``step`` is timed; optional.
        samples_per_step, tokens_per_step: work per step, for the rates.
        flops_per_step: FLOPs of one step; counted in the first step when
            None and a model is given.
        peak_flops: the machine's peak FLOP/s for MFU; measured when None.
        log_dir: where ``metrics[.rank<R>].jsonl`` and the TensorBoard
            events go (None: neither).
        tensorboard: write TensorBoard scalars too (needs ``tensorboard``).
        print_every: rank 0 prints a progress line every this many steps
            (0: never).
    """

    def __init__(self, model=None, optimizer=None, *, samples_per_step=None,
                 tokens_per_step=None, flops_per_step=None, peak_flops=None,
                 log_dir=None, tensorboard=True, print_every=10,
                 file=None):
        self.model, self.optimizer = model, optimizer
        self.samples_per_step = samples_per_step
        self.tokens_per_step = tokens_per_step
        self.flops_per_step = flops_per_step
        self.peak_flops = peak_flops
        self.print_every = print_every
        self.file = file if file is not None else sys.stdout
        self.records = []
        self._stragglers_seen = 0
        self.rank, self.world = _rank()
        self._data_s = 0.0
        self._acc = None          # the open step's phase sums, or None
        self._hooks = []
        self._jsonl = self._writer = None
        if model is not None:
            self._hooks += [model.register_forward_pre_hook(self._fwd_pre),
                            model.register_forward_hook(self._fwd_post)]
        if optimizer is not None:
            self._hooks += [optimizer.register_step_pre_hook(self._opt_pre),
                            optimizer.register_step_post_hook(self._opt_post)]
        if log_dir is not None:
            os.makedirs(log_dir, exist_ok=True)
            name = "metrics.jsonl" if self.world == 1 else \
                f"metrics.rank{self.rank}.jsonl"
            self.jsonl_path = os.path.join(log_dir, name)
            self._jsonl = open(self.jsonl_path, "a", encoding="utf-8")
            if tensorboard:
                from .tensorboard import SummaryWriter
                sub = log_dir if self.world == 1 else \
                    os.path.join(log_dir, f"rank{self.rank}")
                self._writer = SummaryWriter(sub)

    # ---------------------------------------------------------- hooks --
    def _fwd_pre(self, mod, args):
        acc = self._acc
        if acc is not None and acc["_fwd_depth"] == 0:
            acc["_fwd_t"] = time.perf_counter()
        if acc is not None:
            acc["_fwd_depth"] += 1

    def _fwd_post(self, mod, args, out):
        acc = self._acc
        if acc is None or acc["_fwd_depth"] == 0:
            return
        acc["_fwd_depth"] -= 1
        if acc["_fwd_depth"] == 0:
            now = time.perf_counter()
            acc["forward_s"] += now - acc["_fwd_t"]
            acc["_fwd_end"] = now

    def _opt_pre(self, opt, args, kwargs):
        acc = self._acc
        if acc is None:
            return
        now = time.perf_counter()
        if acc["_fwd_end"] is not None:        # loss + backward since then
            acc["_bwd_window"] += now - acc["_fwd_end"]
            acc["_fwd_end"] = None
        acc["_opt_t"] = now

    def _opt_post(self, opt, args, kwargs):
        acc = self._acc
        if acc is not None and acc["_opt_t"] is not None:
            acc["optimizer_s"] += time.perf_counter() - acc["_opt_t"]
            acc["_opt_t"] = None

    # ------------------------------------------------------------ API --
    def data(self, iterable):
        """Iterate ``iterable``, timing each ``next`` as the data wait of
        the step that follows."""
        it = iter(iterable)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            self._data_s += time.perf_counter() - t0
            yield batch

    @contextlib.contextmanager
    def step(self, **extra):
        """One training step; yields its record (a dict: add your own
        numbers, such as the loss, before the block ends)."""
        if self._acc is not None:
            raise RuntimeError("StepMetrics.step() is already open: steps "
                               "do not nest")
        rec = dict(extra)
        acc = self._acc = {"forward_s": 0.0, "optimizer_s": 0.0,
                           "_bwd_window": 0.0, "_fwd_depth": 0,
                           "_fwd_t": None, "_fwd_end": None, "_opt_t": None}
        reducers = _reducers(self.model)
        wait0 = sum(r.stats["wait_s"] for r in reducers)
        counter = None
        if self.flops_per_step is None and self.model is not None \
                and not self.records:
            from .flop_counter import FlopCounterMode
            counter = FlopCounterMode(display=False)
        t0 = time.perf_counter()
        try:
            with counter if counter is not None else contextlib.nullcontext():
                yield rec
            self._sync()
        finally:
            self._acc = None
        step_s = time.perf_counter() - t0
        if counter is not None:
            self.flops_per_step = counter.get_total_flops()
        comm = sum(r.stats["wait_s"] for r in reducers) - wait0
        if acc["_fwd_end"] is not None:          # no optimizer step seen
            acc["_bwd_window"] += time.perf_counter() - acc["_fwd_end"]
        rec.update(self._record(step_s, acc, comm))
        self._emit(rec)

    def _sync(self):
        if _B._cupy is not None and self.model is not None:
            p = next(iter(self.model.parameters()), None)
            if p is not None:
                _sync(p)

    def _record(self, step_s, acc, comm):
        data_s, self._data_s = self._data_s, 0.0
        backward = max(0.0, acc["_bwd_window"] - comm)
        r = {"step": len(self.records), "step_s": step_s, "data_s": data_s,
             "forward_s": acc["forward_s"], "backward_s": backward,
             "comm_wait_s": comm, "optimizer_s": acc["optimizer_s"]}
        r["other_s"] = max(0.0, step_s - r["forward_s"] - backward - comm
                           - r["optimizer_s"])
        whole = step_s + data_s
        if self.samples_per_step:
            r["samples_per_s"] = self.samples_per_step / whole
        if self.tokens_per_step:
            r["tokens_per_s"] = self.tokens_per_step / whole
        if self.flops_per_step:
            r["flops_per_s"] = self.flops_per_step / whole
            peak = self.peak_flops
            if peak is None:
                peak = self.peak_flops = measure_peak_flops(self._device())
            r["mfu"] = r["flops_per_s"] / peak
        r["peak_memory_bytes"] = _peak_memory(self._device())
        # DDP's straggler reports that are new since the last step
        found = getattr(self.model, "straggler_reports", None)
        if found is not None:
            if len(found) > self._stragglers_seen:
                r["stragglers"] = found[self._stragglers_seen:]
            self._stragglers_seen = len(found)
        return r

    def _device(self):
        if self.model is None:
            return None
        p = next(iter(self.model.parameters()), None)
        return None if p is None else p.device

    def _emit(self, rec):
        self.records.append(rec)
        step = rec["step"]
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(rec) + "\n")
            self._jsonl.flush()
        if self._writer is not None:
            for k, v in rec.items():
                if k != "step" and isinstance(v, (int, float)):
                    self._writer.add_scalar(f"step/{k}", v, step)
        if self.print_every and self.rank == 0 and \
                (step + 1) % self.print_every == 0:
            print(self.progress_line(rec), file=self.file, flush=True)

    @staticmethod
    def progress_line(rec):
        """``step 20 | 12.3 ms | 5.1k tok/s | MFU 3.2% | data 2% fwd 31% ...``"""
        whole = rec["step_s"] + rec["data_s"]
        parts = [f"step {rec['step'] + 1}", f"{whole * 1e3:.1f} ms"]
        for key, unit in (("tokens_per_s", "tok/s"),
                          ("samples_per_s", "samples/s")):
            if key in rec:
                parts.append(f"{_si(rec[key])} {unit}")
        if "mfu" in rec:
            parts.append(f"MFU {rec['mfu']:.1%}")
        short = {"data_s": "data", "forward_s": "fwd", "backward_s": "bwd",
                 "comm_wait_s": "comm", "optimizer_s": "opt",
                 "other_s": "other"}
        share = " ".join(f"{short[k]} {rec[k] / whole:.0%}" for k in _PHASES
                         if whole > 0)
        parts.append(share)
        parts.append(f"peak {rec['peak_memory_bytes'] / 2 ** 20:.0f} MiB")
        return " | ".join(parts)

    def summary(self, skip=1):
        """Medians over the recorded steps (the first ``skip`` left out:
        they warm up)."""
        recs = self.records[skip:] or self.records
        out = {}
        for k in recs[0] if recs else ():
            vals = sorted(r[k] for r in recs
                          if isinstance(r.get(k), (int, float)))
            if vals and k != "step":
                out[k] = vals[len(vals) // 2]
        return out

    def close(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _si(x):
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.1f}"
