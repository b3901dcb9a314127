"""Sharded state under ``ElasticJob``: a buddy replica of each rank's shard
(ZeRO-1's optimizer shards, FSDP's flat-parameter shards).

Both shard the same thing: flat parameters (a ZeRO parameter flattened, an
FSDP unit's flat parameter) and their optimizer state, each rank owning a
range of every flat parameter's elements. ``ShardBuddy`` works on that
alone -- pieces ``(index, lo, hi, elements, state)`` in global element
coordinates -- and a *layout* (``_ZeroLayout``, ``_FSDPLayout``) says
which pieces a rank owns on a world size, snapshots its own, and installs
the rebuilt full arrays in the new shards.

After every optimizer step (the replica is refreshed every step: a copy
from K steps ago could only be used by rolling the whole job back K steps)
each rank keeps a host copy of its pieces, sends it to the next rank of
the ring and receives the previous rank's (the ring interleaves the
hosts' ranks, so a buddy is on another node wherever the counts allow and
a lost node does not take a shard with its replica: ``_ring``); a tiny all-reduce (the ack)
ends the step. A rank that counts the step done has passed the ack, which
every member reached only with its buddy's copy in hand: so when the
members re-form at the furthest member's step ``v``, every element at
``v`` is held by a survivor (its own copy, or the buddy's copy of a lost
rank), unless a rank and its buddy died together. The members all-gather
what they hold at ``v``, rebuild the full flat parameters and state
(overwriting elements a failed step had already updated), and re-shard
over the new world size; a joiner contributes nothing and gets its shard
the same way. The last two versions are kept (the rank that failed in an
ack still needs ``v``): about 4x the shard in host memory.
"""
import pickle
import socket

import numpy as np

from collectives.elastic_store import ElasticStop

from ...tensor import Tensor
from ..optim.zero_redundancy_optimizer import _elementwise, _host, _Unit

__all__ = ["ShardBuddy", "zero_buddy", "fsdp_buddy"]

_TAG_LEN, _TAG_DATA = 27001, 27002


class ShardBuddy:
    """The buddy replicas of one rank (module docstring) over a layout."""

    def __init__(self, layout):
        self.layout = layout
        self.held = {}      # version -> [(index, lo, hi, elements, state)]
        self.ring = None    # the ranks in ring order (``_ring``)

    def _next_prev(self, group):
        w, r = group.size, group.rank
        ring = self.ring if self.ring and len(self.ring) == w \
            else list(range(w))
        p = ring.index(r)
        return ring[(p + 1) % w], ring[(p - 1) % w]

    def step_done(self, group, version):
        """After the optimizer's step ``version``: keep this rank's shard,
        swap with the ring's neighbours, ack."""
        self.layout.check()
        mine = self.layout.snapshot()
        self.held[version] = list(mine)
        for v in [v for v in self.held if v < version - 1]:
            del self.held[v]
        if group.size == 1:
            return
        nxt, prev = self._next_prev(group)
        data = np.frombuffer(pickle.dumps(mine, protocol=5), np.uint8)
        n, m = np.array([data.size], np.int64), np.zeros(1, np.int64)
        works = [group.isend(n, nxt, _TAG_LEN),
                 group.isend(data, nxt, _TAG_DATA)]
        group.recv(m, prev, _TAG_LEN)
        buf = np.empty(int(m[0]), np.uint8)
        group.recv(buf, prev, _TAG_DATA)
        for work in works:
            work.wait()
        self.held[version] += pickle.loads(buf.tobytes())
        group.all_reduce(np.ones(1, np.int64), "sum")      # the ack

    def formed(self, group, version, recover):
        """A new membership: rebuild the state at ``version`` from what
        the members hold (``recover``) or from the shards as they are (the
        first round), re-shard, and keep the new layout's own and buddy
        pieces."""
        lay = self.layout
        if recover:
            held = self.held.get(version, [])
            got = group.all_gather_object(held) if group.size > 1 \
                else [held]
            pieces = [x for g in got for x in g]
        else:
            pieces = lay.first_pieces(group)
        flat, state = _merge(lay.specs(), pieces, version, lay.what)
        lay.install(group, flat, state, recover)
        self.ring = _ring(group)
        left = self._next_prev(group)[1]
        shapes = [s for s, _ in lay.specs()]
        buddy = [] if group.size == 1 else [
            (i, lo, hi, flat[i][lo:hi].copy(),
             {k: v[lo:hi].copy() if _whole(v, shapes[i]) else v
              for k, v in state.get(i, {}).items()})
            for i, lo, hi in lay.owned(group.size, left)]
        self.held = {version: lay.snapshot() + buddy}


def _ring(group):
    """The ranks in buddy-ring order: the hosts' ranks interleaved (first
    rank of each host, then the second of each, ...), so that a rank's
    buddy is on another host wherever the counts allow and a whole node
    lost takes no shard together with its replica."""
    if group.size == 1:
        return [0]
    hosts = group.all_gather_object(socket.gethostname())
    order, seen = {}, {}
    for r, h in enumerate(hosts):
        order.setdefault(h, len(order))
        seen[h] = seen.get(h, -1) + 1
        hosts[r] = (seen[h], order[h], r)
    return [r for _, _, r in sorted(hosts)]


class _ZeroLayout:
    """ZeRO-1 (``ZeroRedundancyOptimizer``): the flat parameters are the
    optimizer's parameters; its units cut them (``_Unit``)."""

    what = "the ZeRO optimizer's state"

    def __init__(self, optimizer):
        self.opt = optimizer

    def _params(self):
        return [p for g in self.opt.param_groups for p in g["params"]]

    def check(self):
        self.opt._check_reshardable()       # ZeRO-2 is refused at once

    def specs(self):
        return [(tuple(p.shape), p._data.dtype) for p in self._params()]

    def snapshot(self):
        return self.opt._shard_snapshot()

    def first_pieces(self, group):
        # the optimizer as built (or loaded) before the group existed,
        # laid out over one rank: all of it
        return self.opt._shard_snapshot()

    def owned(self, world, rank):
        index = {id(p): i for i, p in enumerate(self._params())}
        return [(index[id(p)], lo, hi) for u in self.opt._units
                for p, lo, hi in _Unit(u.params, world, rank).owned()]

    def install(self, group, flat, state, recover):
        params = self._params()
        if recover:
            for p, f in zip(params, flat):
                p._data[...] = p.device.send(f.reshape(p._data.shape))
                p._bump_version()
        self.opt._reshard(group, _state_dict(self.opt, params, flat, state)
                          if state else None)


class _FSDPLayout:
    """FSDP: the flat parameters are the units' (unpadded) flat arrays,
    rank r owning elements [r * chunk, (r + 1) * chunk); the optimizer
    (over the root's parameters: the units' ``_flat_param``) keeps a state
    array of ``chunk`` elements per unit."""

    what = "the state of the FSDP shards (parameters and optimizer)"

    def __init__(self, root, optimizer):
        self.root, self.opt = root, optimizer
        self.units = [u for u in root._units() if u._flat_param is not None]

    def check(self):
        pass

    def specs(self):
        return [((u._numel,), u._flat_param._data.dtype) for u in self.units]

    def owned(self, world, rank):
        for i, u in enumerate(self.units):
            chunk = -(-u._numel // world)
            lo = min(rank * chunk, u._numel)
            hi = min(lo + chunk, u._numel)
            if lo < hi:
                yield i, lo, hi

    def snapshot(self):
        out = []
        for i, lo, hi in self.owned(self.root.world_size, self.root.rank):
            u = self.units[i]
            fp = u._flat_param
            st = {k: _host(v._data) if isinstance(v, Tensor) else v
                  for k, v in (self.opt.state.get(fp) or {}).items()}
            out.append((i, lo, hi, _host(fp._data[:hi - lo]),
                        {k: v[:hi - lo] if _elementwise(v, u._chunk) else v
                         for k, v in st.items()}))
        return out

    def first_pieces(self, group):
        # FSDP shards at wrapping: every rank holds its chunk only
        mine = self.snapshot()
        got = group.all_gather_object(mine) if group.size > 1 else [mine]
        return [x for g in got for x in g]

    def install(self, group, flat, state, recover):
        self.root._relayout(group, flat)
        for i, u in enumerate(self.units):
            fp = u._flat_param
            if i not in state:
                self.opt.state.pop(fp, None)
                continue
            r, n = self.root.rank, fp._data.shape[0]

            def chunk(v):
                out, part = np.zeros(n, v.dtype), v[r * n:(r + 1) * n]
                out[:part.size] = part
                return Tensor._wrap(fp.device.send(out))
            self.opt.state[fp] = {
                k: chunk(v) if _whole(v, (u._numel,)) else
                (Tensor._wrap(v) if isinstance(v, np.ndarray) else v)
                for k, v in state[i].items()}


def zero_buddy(optimizer):
    return ShardBuddy(_ZeroLayout(optimizer))


def fsdp_buddy(root, optimizer):
    return ShardBuddy(_FSDPLayout(root, optimizer))


def _whole(v, shape):
    """A per-element state array of the whole flat parameter of shape."""
    return isinstance(v, np.ndarray) and v.ndim == 1 and len(shape) > 0 \
        and v.shape[0] == int(np.prod(shape))


def _merge(specs, pieces, version, what="the ZeRO optimizer's state"):
    """The full flat parameters and {index: {key: flat array or value}}
    from pieces; ``specs``: (shape, dtype) of each flat parameter; every
    element must be there."""
    sizes = [int(np.prod(s)) for s, _ in specs]
    flat = [np.empty(n, dt) for n, (_, dt) in zip(sizes, specs)]
    seen = [np.zeros(n, bool) for n in sizes]
    state = {}
    for idx, lo, hi, elems, vals in pieces:
        flat[idx][lo:hi] = elems
        seen[idx][lo:hi] = True
        st = state.setdefault(idx, {}) if vals else {}
        for k, v in vals.items():
            if _elementwise(v, hi - lo):
                st.setdefault(k, np.zeros(sizes[idx], v.dtype))
                st[k][lo:hi] = v
            else:
                st[k] = v
    lost = [i for i, s in enumerate(seen) if not s.all()]
    if lost:
        n = sum(int((~seen[i]).sum()) for i in lost)
        raise ElasticStop(
            f"{what} at step {version} is lost: {n} "
            f"elements of parameter(s) {lost[:5]} were held only by ranks "
            f"that died (a rank and the next rank of the ring, its buddy "
            f"replica, died together; the ring alternates hosts, so a "
            f"lost node holding more than half of the ranks cannot avoid "
            f"it); restart from a checkpoint")
    return flat, state


def _state_dict(opt, params, flat, state):
    """An unsharded optimizer state dict (what ``load_state_dict`` of
    ``ZeroRedundancyOptimizer`` takes) from merged arrays."""
    full = {}
    for idx, st in state.items():
        p = params[idx]
        full[idx] = {k: Tensor._wrap(p.device.send(v.reshape(p.shape)))
                     if _whole(v, p.shape) else
                     (Tensor._wrap(v) if isinstance(v, np.ndarray) else v)
                     for k, v in st.items()}
    groups, start = [], 0
    for g in opt.param_groups:
        groups.append(dict({k: v for k, v in g.items() if k != "params"},
                           params=list(range(start,
                                             start + len(g["params"])))))
        start += len(g["params"])
    return {"state": full, "param_groups": groups}
