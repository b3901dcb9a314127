"""Pipeline schedules: in which order a stage runs the forward (F) and
backward (B) steps of a batch's micro-batches.

GPipe: every F, then every B. A stage holds all ``m`` micro-batches'
activations at the peak; the bubble (time a stage idles while the pipeline
fills and drains) is (p-1)/(m+p-1) of a step for p stages.

1F1B (PipeDream-Flush, Megatron's default): stage s first runs p-s-1
forwards, then alternates one forward and one backward, then drains the
remaining backwards. Same bubble as GPipe, but a stage never holds more
than p-s micro-batches (at most p), whatever ``m``.

Interleaved 1F1B (``ScheduleInterleaved1F1B``, several stages per rank):
bubble (p-1)/(v m + p - 1) with v stages per rank.

``step(*args, target=y, losses=[])`` runs one batch: ``args`` on the first
stage (cut into ``n_microbatches`` equal micro-batches along dim 0),
``target`` on the last, nothing on the others. The last stage computes
``loss_fn(output, target)`` per micro-batch and appends them to ``losses``.
With ``scale_grads`` (default) each micro-batch's loss is scaled by 1/m
before backward, so the gradients equal those of the whole batch under a
mean-reduced loss (the unsplit model's); the losses reported are unscaled.
"""
import dtorch


class PipelineScheduleSingle:
    """What the one-stage-per-rank schedules share."""

    def __init__(self, stage, n_microbatches, loss_fn=None,
                 args_chunk_spec=None, kwargs_chunk_spec=None,
                 output_merge_spec=None, scale_grads=True):
        n = int(n_microbatches)
        if n < 1:
            raise ValueError(f"n_microbatches must be >= 1, got "
                             f"{n_microbatches}")
        if args_chunk_spec is not None or kwargs_chunk_spec is not None \
                or output_merge_spec is not None:
            raise NotImplementedError(
                "chunk and merge specs: dtorch splits every tensor argument "
                "and the target along dim 0 and merges outputs along dim 0")
        self._stage = stage
        self._n_microbatches = n
        self._loss_fn = loss_fn
        self._has_backward = loss_fn is not None
        self.scale_grads = scale_grads
        self._num_stages = stage.num_stages

    # --------------------------------------------------------- splitting --
    def _split(self, t, what):
        if not isinstance(t, dtorch.Tensor):
            return [t] * self._n_microbatches
        m = self._n_microbatches
        if t.dim() == 0:
            raise ValueError(f"{what} is a 0-dim tensor: there is no batch "
                             f"dim to cut into {m} micro-batches")
        b = t.shape[0]
        if b % m:
            raise ValueError(
                f"{what}: batch size {b} (dim 0 of shape {list(t.shape)}) "
                f"is not divisible by n_microbatches={m}; use a batch "
                f"size that is a multiple of {m}")
        k = b // m
        return [t[i * k:(i + 1) * k] for i in range(m)]

    def _split_inputs(self, args, kwargs, target):
        st, m = self._stage, self._n_microbatches
        if st.is_first:
            if not args:
                raise ValueError(f"step() on the first stage (stage 0) "
                                 f"needs the batch as its arguments")
            cols = [self._split(a, f"step() argument {i}")
                    for i, a in enumerate(args)]
            arg_mbs = [tuple(c[j] for c in cols) for j in range(m)]
            kcols = {k: self._split(v, f"step() keyword {k!r}")
                     for k, v in kwargs.items()}
            kw_mbs = [{k: c[j] for k, c in kcols.items()} for j in range(m)]
        else:
            if args or kwargs:
                raise ValueError(
                    f"step() on stage {st.stage_index} takes no batch "
                    f"arguments: its input comes from stage "
                    f"{st.stage_index - 1}")
            arg_mbs, kw_mbs = [()] * m, [{}] * m
        tgt = None
        if self._has_backward and st.is_last:
            if target is None:
                raise ValueError(f"step() on the last stage (stage "
                                 f"{st.stage_index}) needs target= for "
                                 f"the loss")
            tgt = self._split(target, "target")
        return arg_mbs, kw_mbs, tgt

    # ------------------------------------------------------------- steps --
    def _forward(self, i, arg_mbs, kw_mbs, targets):
        st = self._stage
        out = st.forward_one_chunk(i, arg_mbs[i], kw_mbs[i],
                                   grad=self._has_backward)
        loss = None
        if st.is_last:
            if self._keep_outputs:
                st.output_chunks.append(_detach(out))
            if self._has_backward:
                with st._annotate("loss", i):
                    loss = self._loss_fn(out, targets[i].to(st.device))
                self._losses.append(loss)
        return loss

    def _backward(self, i):
        st = self._stage
        loss = None
        if st.is_last:
            loss = self._losses[i]
            if self.scale_grads and self._n_microbatches > 1:
                loss = loss * (1.0 / self._n_microbatches)
        st.backward_one_chunk(i, loss=loss,
                              last_backward=i == self._n_microbatches - 1)

    def step(self, *args, target=None, losses=None, return_outputs=True,
             **kwargs):
        """One batch through the pipeline; on the last stage returns the
        outputs of the micro-batches concatenated along dim 0 (None with
        ``return_outputs=False``, which keeps none of them)."""
        if losses is not None and not isinstance(losses, list):
            raise TypeError(f"losses must be a list, got "
                            f"{type(losses).__name__}")
        if self._has_backward and not dtorch.is_grad_enabled():
            raise RuntimeError("step() runs backward: call it with "
                               "gradients enabled (not under no_grad), or "
                               "use eval()")
        st = self._stage
        st.clear_runtime_states()
        self._keep_outputs = return_outputs
        self._losses = []
        arg_mbs, kw_mbs, targets = self._split_inputs(args, kwargs, target)
        try:
            if self._has_backward:
                self._step_microbatches(arg_mbs, kw_mbs, targets)
            else:
                for i in range(self._n_microbatches):
                    self._forward(i, arg_mbs, kw_mbs, targets)
        finally:
            st._live.clear()
        st.finish_step(self._has_backward)
        if st.is_last and losses is not None:
            losses.extend(x.detach() for x in self._losses)
        if st.is_last and return_outputs:
            outs = st.output_chunks
            if all(isinstance(o, dtorch.Tensor) for o in outs):
                return dtorch.cat(outs, 0)
            return outs
        return None

    def eval(self, *args, target=None, losses=None, **kwargs):
        """Forward only (no graph kept), the loss computed when ``target``
        is given on the last stage."""
        saved = self._has_backward
        self._has_backward = False
        try:
            with dtorch.no_grad():
                out = self.step(*args, **kwargs)
        finally:
            self._has_backward = saved
        st = self._stage
        if st.is_last and target is not None and self._loss_fn is not None:
            tg = self._split(target, "target")
            ls = [self._loss_fn(o, t.to(st.device))
                  for o, t in zip(st.output_chunks, tg)]
            if losses is not None:
                losses.extend(ls)
        return out


class ScheduleGPipe(PipelineScheduleSingle):
    """Every micro-batch forward, then every micro-batch backward."""

    def _step_microbatches(self, arg_mbs, kw_mbs, targets):
        m = self._n_microbatches
        for i in range(m):
            self._forward(i, arg_mbs, kw_mbs, targets)
        for i in range(m):
            self._backward(i)


class Schedule1F1B(PipelineScheduleSingle):
    """Warm-up forwards, then one forward / one backward, then the
    remaining backwards: at most num_stages - stage_index micro-batches
    alive on a stage."""

    def _step_microbatches(self, arg_mbs, kw_mbs, targets):
        m = self._n_microbatches
        s, p = self._stage.stage_index, self._num_stages
        warmup = min(p - s - 1, m)
        for i in range(warmup):
            self._forward(i, arg_mbs, kw_mbs, targets)
        for i in range(warmup, m):
            self._forward(i, arg_mbs, kw_mbs, targets)
            self._backward(i - warmup)
        for i in range(m - warmup, m):
            self._backward(i)


def _detach(out):
    if isinstance(out, dtorch.Tensor):
        return out.detach()
    if isinstance(out, (tuple, list)):
        return type(out)(_detach(o) for o in out)
    return out


class PipelineScheduleMulti:
    """What schedules with several stages per rank share: ``stages`` are
    this rank's (stage i runs on rank i % ranks); ``step`` takes the batch
    on the rank of stage 0 and ``target=`` on the rank of the last stage."""

    def __init__(self, stages, n_microbatches, loss_fn=None,
                 scale_grads=True):
        stages = sorted(stages, key=lambda s: s.stage_index)
        if not stages:
            raise ValueError("a schedule needs this rank's stages")
        self._stages = stages
        self._n_microbatches = int(n_microbatches)
        if self._n_microbatches < 1:
            raise ValueError(f"n_microbatches must be >= 1, got "
                             f"{n_microbatches}")
        self._loss_fn = loss_fn
        self._has_backward = loss_fn is not None
        self.scale_grads = scale_grads
        self._num_stages = stages[0].num_stages
        # one single-stage helper per stage: splitting, loss, backward
        self._one = {s.stage_index: PipelineScheduleSingle(
            s, n_microbatches, loss_fn, scale_grads=scale_grads)
            for s in stages}

    def step(self, *args, target=None, losses=None, return_outputs=True,
             **kwargs):
        if self._has_backward and not dtorch.is_grad_enabled():
            raise RuntimeError("step() runs backward: call it with "
                               "gradients enabled (not under no_grad)")
        plans = {}
        for i, one in self._one.items():
            st = one._stage
            st.clear_runtime_states()
            one._keep_outputs = return_outputs
            one._losses = []
            plans[i] = one._split_inputs(args if st.is_first else (),
                                         kwargs if st.is_first else {},
                                         target)
        try:
            for kind, stage_index, mb in self._order():
                one = self._one[stage_index]
                if kind == "F":
                    one._forward(mb, *plans[stage_index])
                else:
                    one._backward(mb)
        finally:
            for one in self._one.values():
                one._stage._live.clear()
        for one in self._one.values():
            one._stage.finish_step(self._has_backward)
        last = self._one.get(self._num_stages - 1)
        if last is None:
            return None
        if losses is not None:
            losses.extend(x.detach() for x in last._losses)
        if return_outputs:
            return dtorch.cat(last._stage.output_chunks, 0)
        return None


class ScheduleInterleaved1F1B(PipelineScheduleMulti):
    """Interleaved 1F1B (Megatron's virtual pipeline): each of the p ranks
    runs v stages (rank r: stages r, r + p, ..., so stage i on rank
    i % p); micro-batches go through in groups of p. The bubble shrinks to
    (p-1)/(v m + p - 1) of a step, for a longer warm-up (rank r holds up
    to 2 (p - r - 1) + (v - 1) p + 1 micro-batches over its v stages).
    ``n_microbatches`` must be a multiple of p. Stages of one rank exchange
    messages with another rank under distinct tags: a backend that matches
    by order only (nccl) needs the single-stage schedules."""

    def __init__(self, stages, n_microbatches, loss_fn=None,
                 scale_grads=True):
        super().__init__(stages, n_microbatches, loss_fn, scale_grads)
        p = self._num_stages // len(self._stages)
        if self._num_stages % len(self._stages):
            raise ValueError("every rank must run the same number of "
                             "stages")
        if self._n_microbatches % p:
            raise ValueError(
                f"ScheduleInterleaved1F1B: n_microbatches="
                f"{self._n_microbatches} is not a multiple of the "
                f"{p} pipeline ranks")
        self._p, self._v = p, len(self._stages)
        self._rank = self._stages[0].stage_index % p
        if any(s.stage_index % p != self._rank for s in self._stages):
            raise ValueError(f"this rank's stages "
                             f"{[s.stage_index for s in self._stages]} "
                             f"are not all on rank {self._rank} (stage i "
                             f"runs on rank i % {p})")

    def _order(self):
        p, v, m, r = self._p, self._v, self._n_microbatches, self._rank
        total = m * v

        def which(k, forward):
            group = k % (p * v) // p          # the chunk, in this group
            chunk = group if forward else v - 1 - group
            return chunk * p + r, (k // (p * v)) * p + k % p
        warmup = min((p - r - 1) * 2 + (v - 1) * p, total)
        order = [("F",) + which(k, True) for k in range(warmup)]
        for i in range(total - warmup):
            order.append(("F",) + which(warmup + i, True))
            order.append(("B",) + which(i, False))
        order += [("B",) + which(k, False)
                  for k in range(total - warmup, total)]
        return order
