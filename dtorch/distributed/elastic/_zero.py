"""ZeRO-1 under ``ElasticJob``: a buddy replica of each rank's shard.

Each rank owns a chunk of the parameters' elements and of the optimizer
state (``ZeroRedundancyOptimizer``); a lost rank would take its chunk of
the state with it. After every optimizer step (the replica is refreshed
every step: a copy from K steps ago could only be used by rolling the
whole job back K steps) each rank keeps a host copy of its pieces -- the
parameter elements and the state, in global element coordinates -- sends
it to the next rank of the ring and receives the previous rank's; a tiny
all-reduce (the ack) ends the step. A rank that counts the step done has
passed the ack, which every member reached only with its buddy's copy in
hand: so when the members re-form at the furthest member's step ``v``,
every element at ``v`` is held by a survivor (its own copy, or the buddy's
copy of a lost rank), unless a rank and its buddy died together. The
members all-gather what they hold at ``v``, rebuild the full parameters
and state (overwriting elements a failed step had already updated), and
re-shard over the new world size; a joiner contributes nothing and gets
its shard the same way. The last two versions are kept (the rank that
failed in an ack still needs ``v``): about 4x the shard in host memory.
"""
import pickle

import numpy as np

from collectives.elastic_store import ElasticStop

from ...tensor import Tensor
from ..optim.zero_redundancy_optimizer import _elementwise, _Unit

__all__ = ["ZeroBuddy"]

_TAG_LEN, _TAG_DATA = 27001, 27002


class ZeroBuddy:
    """The buddy replicas of one rank (module docstring)."""

    def __init__(self, optimizer):
        self.opt = optimizer
        self.held = {}      # version -> [(index, lo, hi, elements, state)]

    def _params(self):
        return [p for g in self.opt.param_groups for p in g["params"]]

    def step_done(self, group, version):
        """After the optimizer's step ``version``: keep this rank's shard,
        swap with the ring's neighbours, ack."""
        self.opt._check_reshardable()       # ZeRO-2 is refused at once
        mine = self.opt._shard_snapshot()
        self.held[version] = list(mine)
        for v in [v for v in self.held if v < version - 1]:
            del self.held[v]
        w, r = group.size, group.rank
        if w == 1:
            return
        data = np.frombuffer(pickle.dumps(mine, protocol=5), np.uint8)
        n, m = np.array([data.size], np.int64), np.zeros(1, np.int64)
        works = [group.isend(n, (r + 1) % w, _TAG_LEN),
                 group.isend(data, (r + 1) % w, _TAG_DATA)]
        group.recv(m, (r - 1) % w, _TAG_LEN)
        buf = np.empty(int(m[0]), np.uint8)
        group.recv(buf, (r - 1) % w, _TAG_DATA)
        for work in works:
            work.wait()
        self.held[version] += pickle.loads(buf.tobytes())
        group.all_reduce(np.ones(1, np.int64), "sum")      # the ack

    def formed(self, group, version, recover):
        """A new membership: rebuild the state at ``version`` from what
        the members hold (``recover``) or take the parameters as they are
        (the first round: no state yet), re-shard, and keep the new
        layout's own and buddy pieces."""
        params = self._params()
        if recover:
            held = self.held.get(version, [])
            got = group.all_gather_object(held) if group.size > 1 \
                else [held]
            pieces = [x for g in got for x in g]
        else:
            # the first round: the optimizer as built (or loaded) before
            # the group existed, laid out over one rank: all of it
            pieces = self.opt._shard_snapshot()
        flat, state = _merge(params, pieces, version)
        if recover:
            for p, f in zip(params, flat):
                p._data[...] = p.device.send(f.reshape(p._data.shape))
                p._bump_version()
        self.opt._reshard(group, _state_dict(self.opt, params, flat, state)
                          if state else None)
        left = (group.rank - 1) % group.size
        index = {id(p): i for i, p in enumerate(params)}
        buddy = [] if group.size == 1 else [
            (index[id(p)], lo, hi, flat[index[id(p)]][lo:hi].copy(),
             {k: v[lo:hi].copy() if _whole(v, p) else v
              for k, v in state.get(index[id(p)], {}).items()})
            for u in self.opt._units
            for p, lo, hi in _Unit(u.params, group.size, left).owned()]
        self.held = {version: self.opt._shard_snapshot() + buddy}


def _whole(v, p):
    """A per-element state array of the whole (flat) parameter p."""
    return isinstance(v, np.ndarray) and v.ndim == 1 \
        and v.shape[0] == p.numel() and p.dim() > 0


def _merge(params, pieces, version):
    """The full flat parameters and {index: {key: flat array or value}}
    from pieces; every element must be there."""
    flat = [np.empty(p.numel(), p._data.dtype) for p in params]
    seen = [np.zeros(p.numel(), bool) for p in params]
    state = {}
    for idx, lo, hi, elems, vals in pieces:
        flat[idx][lo:hi] = elems
        seen[idx][lo:hi] = True
        st = state.setdefault(idx, {}) if vals else {}
        for k, v in vals.items():
            if _elementwise(v, hi - lo):
                st.setdefault(k, np.zeros(params[idx].numel(), v.dtype))
                st[k][lo:hi] = v
            else:
                st[k] = v
    lost = [i for i, s in enumerate(seen) if not s.all()]
    if lost:
        n = sum(int((~seen[i]).sum()) for i in lost)
        raise ElasticStop(
            f"the ZeRO optimizer's state at step {version} is lost: {n} "
            f"elements of parameter(s) {lost[:5]} were held only by ranks "
            f"that died (a rank and the next rank of the ring, its buddy "
            f"replica, died together); restart from a checkpoint")
    return flat, state


def _state_dict(opt, params, flat, state):
    """An unsharded optimizer state dict (what ``load_state_dict`` of
    ``ZeroRedundancyOptimizer`` takes) from merged arrays."""
    full = {}
    for idx, st in state.items():
        p = params[idx]
        full[idx] = {k: Tensor._wrap(p.device.send(v.reshape(p.shape)))
                     if _whole(v, p) else
                     (Tensor._wrap(v) if isinstance(v, np.ndarray) else v)
                     for k, v in st.items()}
    groups, start = [], 0
    for g in opt.param_groups:
        groups.append(dict({k: v for k, v in g.items() if k != "params"},
                           params=list(range(start,
                                             start + len(g["params"])))))
        start += len(g["params"])
    return {"state": full, "param_groups": groups}
