"""``PipelineStage``: one stage of a pipeline, the piece of the model that
runs on this rank, and how its activations and gradients reach the
neighbouring stages (PyTorch's ``torch.distributed.pipelining`` names).

Stage i runs on rank i of the pipeline group (``group``, default the
world); it receives its input from rank i-1 and sends its output to rank
i+1, and in backward the gradients travel the other way. A schedule
(``ScheduleGPipe``, ``Schedule1F1B``) decides the order of the forward and
backward micro-batch steps; the stage does each one.
"""
import contextlib

import dtorch
from dtorch.autograd import backward as _autograd_backward

from ... import distributed as dist
from . import _p2p


class PipelineStage:
    """One pipeline stage built by the user.

    Args:
        submodule: the stage's part of the model (an ``nn.Module``; may be
            a ``DistributedDataParallel`` over the data-parallel group, and
            may hold tensor-parallel layers).
        stage_index: this stage's place, 0 .. num_stages-1.
        num_stages: how many stages the pipeline has.
        device: where the stage computes ("cpu", "cuda:0", a
            ``dtorch.device``); received tensors are put there.
        input_args, output_args: example micro-batch inputs / outputs of
            this stage (optional). Shapes travel with every activation, so
            they are not needed; when given, what arrives is checked
            against ``input_args``.
        group: the pipeline process group (default: the world); stage i
            runs on its rank i, so it has ``num_stages`` ranks.
        tied_parameters: ``[(parameter, stage indices)]``: parameters that
            several stages hold copies of (a weight-tied embedding and
            head); their gradients are summed over those stages after
            backward. ``Pipe.build_stage`` fills it in.
    """

    def __init__(self, submodule, stage_index, num_stages, device,
                 input_args=None, output_args=None, group=None,
                 tied_parameters=None):
        num_stages, stage_index = int(num_stages), int(stage_index)
        if num_stages < 1:
            raise ValueError(f"num_stages must be >= 1, got {num_stages}")
        if not 0 <= stage_index < num_stages:
            raise ValueError(f"stage_index {stage_index} is out of range "
                             f"for {num_stages} stages")
        self.submod = submodule
        self.stage_index, self.num_stages = stage_index, num_stages
        self.device = dtorch.device(device)
        self.group = group
        self.is_first = stage_index == 0
        self.is_last = stage_index == num_stages - 1
        self._ranks, self._size = None, 1
        if num_stages > 1:
            size = dist.get_world_size(group)
            if num_stages % size or size == 1:
                raise ValueError(
                    f"PipelineStage: the pipeline group has {size} ranks "
                    f"and the pipeline {num_stages} stages; stage i runs "
                    f"on rank i % {size}, so the stages must spread evenly "
                    f"over at least 2 ranks")
            me = dist.get_rank(group)
            if me != stage_index % size:
                raise ValueError(
                    f"PipelineStage: stage {stage_index} built on rank "
                    f"{me} of the pipeline group; stage i runs on rank "
                    f"i % {size}")
            self._ranks = dist.get_process_group_ranks(group)
            self._size = size
        self.global_rank = (self._ranks[stage_index % self._size]
                            if self._ranks else
                            dist.get_rank() if dist.is_initialized() else 0)
        self._inputs_spec = _spec(input_args)
        self._outputs_spec = _spec(output_args)
        self.tied_parameters = list(tied_parameters or [])
        self._sender = _p2p.Sender()
        self.clear_runtime_states()

    # ----------------------------------------------------------- helpers --
    def _peer(self, index):
        """The global rank that runs stage ``index``."""
        return self._ranks[index % self._size]

    def _where(self, what, mb=None):
        of = "" if mb is None else f" of micro-batch {mb}"
        return (f"pipeline stage {self.stage_index} of {self.num_stages} "
                f"(global rank {self.global_rank}), {what}{of}")

    def clear_runtime_states(self):
        """Forget the micro-batches of the previous step."""
        self._live = {}          # mb -> (inputs needing grad, outputs)
        self.output_chunks = []
        self.peak_live = 0       # most micro-batches held for backward

    @contextlib.contextmanager
    def _annotate(self, what, mb):
        """Name the stage and rank on any error raised inside: the job dies
        with the culprit said, whichever rank prints it."""
        try:
            yield
        except BaseException as e:
            note = f"(in {self._where(what, mb)})"
            if note not in getattr(e, "__notes__", ()):
                if hasattr(e, "add_note"):
                    e.add_note(note)
                else:
                    e.__notes__ = list(getattr(e, "__notes__", [])) + [note]
            raise

    # ----------------------------------------------------------- forward --
    def _recv_inputs(self, mb):
        src = self._peer(self.stage_index - 1)
        h = _p2p.recv((_p2p.HEADER_LEN,), dtorch.int64, self.device, src,
                      self.group, _p2p.tag(_p2p.META, self.stage_index))
        metas = _p2p.decode_header(h)
        if self._inputs_spec is not None:
            got = [(tuple(s), d) for s, d, _ in metas]
            if got != self._inputs_spec:
                raise RuntimeError(
                    f"{self._where('forward', mb)}: received inputs "
                    f"{got}, but input_args says {self._inputs_spec}")
        xs = []
        for shape, dtype, rg in metas:
            x = _p2p.recv(shape, dtype, self.device, src, self.group,
                          _p2p.tag(_p2p.ACT, self.stage_index))
            xs.append(x.requires_grad_(True) if rg else x)
        return xs

    def forward_one_chunk(self, mb, args=(), kwargs=None, grad=True):
        """Run micro-batch ``mb`` through this stage: its input from the
        previous stage (or ``args`` on the first), its output sent on (or
        returned on the last). With ``grad`` what backward needs is kept
        until ``backward_one_chunk(mb)``."""
        with self._annotate("forward", mb):
            if self.is_first:
                xs = [a.to(self.device) if isinstance(a, dtorch.Tensor)
                      else a for a in args]
            else:
                xs = self._recv_inputs(mb)
            with dtorch.set_grad_enabled(grad):
                out = self.submod(*xs, **(kwargs or {}))
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
            if self._outputs_spec is not None:
                got = [(tuple(o.shape), o.dtype) for o in outs]
                if got != self._outputs_spec:
                    raise RuntimeError(
                        f"{self._where('forward', mb)}: outputs {got}, but "
                        f"output_args says {self._outputs_spec}")
            if not self.is_last:
                dst = self._peer(self.stage_index + 1)
                hdr = _p2p.encode_header(outs, self._where("forward", mb),
                                         self.device)
                nxt = self.stage_index + 1
                self._sender.send(hdr, dst, self.group,
                                  _p2p.tag(_p2p.META, nxt))
                for o in outs:
                    self._sender.send(o, dst, self.group,
                                      _p2p.tag(_p2p.ACT, nxt))
            if grad:
                ins = [x for x in xs if isinstance(x, dtorch.Tensor)
                       and x.requires_grad and not self.is_first]
                self._live[mb] = (ins, outs)
                self.peak_live = max(self.peak_live, len(self._live))
            return out

    # ---------------------------------------------------------- backward --
    def backward_one_chunk(self, mb, loss=None, last_backward=False):
        """Backward of micro-batch ``mb``: from ``loss`` on the last stage,
        else from the gradient the next stage sends; the gradient of this
        stage's input goes to the previous stage. Under DDP, gradients are
        reduced over the data-parallel group only in the ``last_backward``
        (the others accumulate under ``no_sync``)."""
        with self._annotate("backward", mb):
            if mb not in self._live:
                raise RuntimeError(f"{self._where('backward', mb)}: no "
                                   f"forward of this micro-batch to go "
                                   f"back through")
            ins, outs = self._live.pop(mb)
            if self.is_last:
                if loss is None:
                    raise RuntimeError(f"{self._where('backward', mb)}: "
                                       f"the last stage needs the loss")
                tensors, grads = [loss], None
            else:
                src = self._peer(self.stage_index + 1)
                tensors, grads = [], []
                for o in outs:
                    if isinstance(o, dtorch.Tensor) and o.requires_grad:
                        g = _p2p.recv(tuple(o.shape), o.dtype, self.device,
                                      src, self.group,
                                      _p2p.tag(_p2p.GRAD, self.stage_index))
                        tensors.append(o)
                        grads.append(g)
            sync = getattr(self.submod, "no_sync", None)
            ctx = (sync() if sync is not None and not last_backward
                   else contextlib.nullcontext())
            with ctx:
                if tensors:
                    _autograd_backward(tensors, grads)
            if not self.is_first:
                dst = self._peer(self.stage_index - 1)
                for x in ins:
                    g = x.grad if x.grad is not None else \
                        dtorch.zeros_like(x)
                    self._sender.send(g, dst, self.group, _p2p.tag(
                        _p2p.GRAD, self.stage_index - 1))
            self._sender.reap()

    # ------------------------------------------------------- end of step --
    def finish_step(self, with_backward):
        """Wait for the sends still in flight; sum the gradients of
        parameters tied across stages."""
        with self._annotate("end of step", None):
            self._sender.wait_all()
            if with_backward:
                self._sync_tied()

    def _sync_tied(self):
        for p, holders in self.tied_parameters:
            holders = sorted(int(h) for h in holders)
            others = [h for h in holders if h != self.stage_index]
            if not others:
                continue
            if any(self._peer(h) == self.global_rank for h in others):
                raise NotImplementedError(
                    f"{self._where('end of step')}: a tied parameter held "
                    f"by stages {holders}, two of them on this rank; tie "
                    f"only stages on different ranks")
            mine = p.grad if p.grad is not None else dtorch.zeros_like(p)
            mine = mine.detach().contiguous()
            for h in others:
                self._sender.send(mine, self._peer(h), self.group,
                                  _p2p.tag(_p2p.TIED, h))
            parts = {self.stage_index: mine}
            for h in others:
                parts[h] = _p2p.recv(tuple(p.shape), p.dtype, self.device,
                                     self._peer(h), self.group,
                                     _p2p.tag(_p2p.TIED, self.stage_index))
            # the same order on every holder: bitwise equal copies
            total = parts[holders[0]].clone()
            for h in holders[1:]:
                total = total + parts[h]
            with dtorch.no_grad():
                if p.grad is None:
                    p.grad = total
                else:
                    p.grad.copy_(total)
            self._sender.wait_all()


def _spec(example):
    if example is None:
        return None
    ex = list(example) if isinstance(example, (tuple, list)) else [example]
    return [(tuple(t.shape), t.dtype) for t in ex]
