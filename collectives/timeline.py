"""Per-rank timelines: ``DTORCH_TIMELINE=DIR`` (Horovod's timeline, for dtorch).

Every rank writes ``DIR/rank<R>.json``, a Chrome trace (the "trace event
format" of chrome://tracing and Perfetto) of what it did: collectives (op,
bytes, dtype, group, peers; recorded here, by `ProcessGroup._run`), and
whatever the layers above add through `Timeline.complete` / `instant` (dtorch
records its autograd ops, backward nodes and DDP buckets). ``merge`` joins the
ranks' files into one trace, one process per rank::

    DTORCH_TIMELINE=/tmp/tl dtorch-launch --nproc-per-node 2 train.py
    python -m dtorch.utils.timeline merge /tmp/tl -o /tmp/tl/merged.json

Clocks: each rank stamps events with its own ``time.perf_counter_ns`` and, at
the group's first collective, measures its offset against world rank 0's
clock by ping-pong (the sample of smallest round trip, as NTP; the error is at
most half that round trip, written to the file as ``clock_error_us``); all
timestamps are then in rank 0's clock, microseconds from that moment. Ranks on
different hosts need no synchronised system clocks.

Wait vs transfer: an event's start is when its rank entered the collective;
``merge`` matches each collective across ranks (group, sequence number) and
splits every rank's slice into ``wait`` (until the last rank arrived) and
``transfer`` (the rest), because one rank alone cannot tell the two apart.

Cost: with ``DTORCH_TIMELINE`` unset a group keeps ``_timeline = None`` and a
collective pays one attribute test; nothing is imported, opened or hooked.
Recording appends a tuple per event; the file is written in pieces of
``FLUSH_EVERY`` events and completed at exit (or ``close_all()``). A run that
dies leaves a trace without its closing bracket, which both viewers and
``merge`` accept.
"""
from __future__ import annotations
import atexit
import json
import os
import socket
import sys
import threading
import time

import numpy as np

from .env import env_str

ENV = 'DTORCH_TIMELINE'
FLUSH_EVERY = 20000      # events kept in memory before a write
_SYNC_TAG = 0x7D71       # p2p tag of the clock exchange (below MPI's 32767)
_SYNC_ROUNDS = 8

_now = time.perf_counter_ns
_lock = threading.Lock()
_open = {}               # (dir, world rank, world size) -> Timeline
_atexit = [False]


def requested() -> str | None:
    """The directory DTORCH_TIMELINE names, or None (timeline off)."""
    return env_str(ENV, None)


def for_group(group) -> Timeline | None:
    """The timeline a new *world* group records into: None when the
    variable is unset or the group is not a world (sub-groups get their
    parent's in `ProcessGroup.new_group`). Creating one opens nothing."""
    d = requested()
    if d is None or group.name != 'world':
        return None
    # one per (directory, global rank): every world-named group of the
    # rank (an NCCL group and its bootstrap) writes the same file
    key = (os.path.abspath(d), group.ranks[group.rank])
    with _lock:
        tl = _open.get(key)
        if tl is None or tl.closed:
            tl = _open[key] = Timeline(key[0], key[1], group.size)
        return tl


def close_all() -> list[str]:
    """Write and close every open timeline of this process (also run at
    exit); returns the files written."""
    with _lock:
        tls = list(_open.values())
        _open.clear()
    return [tl.close() for tl in tls if not tl.closed]


class Timeline:
    """One rank's events, in its own clock, and the file they go to."""

    def __init__(self, directory, rank, size):
        self.dir, self.rank, self.size = directory, rank, size
        self.path = os.path.join(directory, f"rank{rank}.json")
        self.offset_ns = 0       # this rank's clock minus rank 0's
        self.base_ns = 0         # rank 0's clock at the sync: ts = 0
        self.error_ns = None     # half the best round trip of the sync
        self.synced = False
        self.closed = False
        self.started_by = None   # the group that synchronised the clocks
        self._events = []        # (ph, name, cat, tid, t0, t1, args)
        self._threads = {}       # tid -> thread name
        self._tracks = {}        # pseudo-thread name -> tid
        self._wlock = threading.Lock()
        self._file = None
        self._first = True

    # ---- set-up (collective: every rank of the world calls it once)
    def start(self, group) -> None:
        """Measure the clock offset against world rank 0 over `group` (a
        world group), then allow writing. Idempotent."""
        if self.synced:
            return
        self.synced = True
        self.started_by = group
        if group.size > 1:
            self.offset_ns, self.base_ns, self.error_ns = _sync_clock(group)
        else:
            self.base_ns, self.error_ns = _now(), 0
        os.makedirs(self.dir, exist_ok=True)
        with _lock:
            if not _atexit[0]:
                _atexit[0] = True
                atexit.register(close_all)

    # ---- recording (any thread)
    def tid(self) -> int:
        t = threading.current_thread()
        tid = t.native_id or threading.get_ident()
        if tid not in self._threads:
            self._threads[tid] = t.name
        return tid

    def track(self, name: str) -> int:
        """A named pseudo-thread (row) for events that overlap on no real
        thread, e.g. DDP's buckets."""
        tid = self._tracks.get(name)
        if tid is None:
            # above any real thread id (Linux's pid_max is at most 2^22)
            tid = self._tracks[name] = (1 << 30) + len(self._tracks)
        return tid

    def complete(self, name, cat, t0, t1, args=None, tid=None):
        """A range [t0, t1] (perf_counter_ns of this process); args: a
        dict, or a list of shapes (an op's inputs)."""
        ev = ('X', name, cat, self.tid() if tid is None else tid, t0, t1,
              args)
        self._events.append(ev)
        if len(self._events) >= FLUSH_EVERY:
            self.flush()

    def instant(self, name, cat, t, args=None, tid=None):
        self._events.append(('i', name, cat,
                             self.tid() if tid is None else tid, t, None,
                             args))

    def collective(self, group, name, arr, detail, peers):
        """Start recording a collective; returns the token `end` takes."""
        nbytes, dtype = _nbytes(arr)
        args = {'op': name, 'bytes': nbytes, 'group': group.name,
                'peers': peers}
        if dtype is not None:
            args['dtype'] = dtype
        if detail:
            args['detail'] = detail
        return [name, self.tid(), _now(), 0, args]

    def started(self, tok, seq, async_op):
        tok[3] = _now()
        tok[4]['seq'] = seq
        if async_op:
            tok[4]['async'] = True

    def end(self, tok):
        t1 = _now()
        name, tid, t0, ts, args = tok
        args['start_us'] = round((ts - t0) / 1e3, 3)
        self.complete(name, 'collective', t0, t1, args, tid)

    # ---- output
    def _json(self, ev):
        ph, name, cat, tid, t0, t1, args = ev
        shift = self.offset_ns + self.base_ns
        e = {'ph': ph, 'name': name, 'cat': cat, 'pid': self.rank,
             'tid': tid, 'ts': round((t0 - shift) / 1e3, 3)}
        if ph == 'X':
            e['dur'] = round((t1 - t0) / 1e3, 3)
        else:
            e['s'] = 't'
        if type(args) is list:          # an op's input shapes
            e['args'] = {'shapes': [list(s) for s in args]}
        elif args:
            e['args'] = {k: _plain(v) for k, v in args.items()}
        return json.dumps(e, separators=(',', ':'))

    def flush(self, force=False) -> None:
        """Write the events recorded so far; before the clock sync only
        when forced (at close: the clocks then stay unaligned)."""
        if not (self.synced or force):
            return
        with self._wlock:
            evs, self._events = self._events, []
            if self._file is None:
                os.makedirs(self.dir, exist_ok=True)
                self._file = open(self.path, 'w')
                self._file.write('{"traceEvents":[\n')
            if evs:
                body = ',\n'.join(self._json(e) for e in evs)
                self._file.write(body if self._first else ',\n' + body)
                self._first = False
            self._file.flush()

    def close(self) -> str:
        """Complete the file: metadata (process and thread names, clock
        information) and the closing brackets. Returns its path."""
        if self.closed:
            return self.path
        self.flush(force=True)
        with self._wlock:
            self.closed = True
            meta = [{'ph': 'M', 'name': 'process_name', 'pid': self.rank,
                     'tid': 0, 'args': {'name': f"rank {self.rank}"}},
                    {'ph': 'M', 'name': 'process_sort_index',
                     'pid': self.rank, 'tid': 0,
                     'args': {'sort_index': self.rank}}]
            names = dict(self._threads)
            names.update({tid: n for n, tid in self._tracks.items()})
            for tid, n in names.items():
                meta.append({'ph': 'M', 'name': 'thread_name',
                             'pid': self.rank, 'tid': tid,
                             'args': {'name': n}})
            f = self._file
            for m in meta:
                f.write(('\n' if self._first else ',\n') + json.dumps(m))
                self._first = False
            info = {'rank': self.rank, 'world_size': self.size,
                    'host': socket.gethostname(), 'pid': os.getpid(),
                    'clock_synced': self.synced and self.size > 1,
                    'clock_offset_us': self.offset_ns / 1e3,
                    'clock_error_us': (None if self.error_ns is None
                                       else self.error_ns / 1e3)}
            f.write('\n],"displayTimeUnit":"ms","dtorchTimeline":'
                    + json.dumps(info) + '}\n')
            f.close()
            self._file = None
        return self.path


def _nbytes(arr):
    if arr is None:
        return 0, None
    if isinstance(arr, (list, tuple)):
        return (sum(int(a.nbytes) for a in arr),
                str(arr[0].dtype) if arr else None)
    return int(arr.nbytes), str(arr.dtype)


def _plain(v):
    """JSON-safe argument values (shapes are tuples of ints)."""
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, (np.integer, np.floating)):
        return v.item()
    return v


def _sync_clock(group):
    """(offset, base, error) in ns: this rank's perf_counter minus world
    rank 0's, rank 0's clock at the exchange, and half the best round trip.
    Rank 0 exchanges `_SYNC_ROUNDS` ping-pongs with each rank in turn; a
    rank's reply carries its clock on arrival, so offset ~ t1 - (t0 + t2)/2
    from the round with the smallest t2 - t0. Unrecorded point-to-point
    messages on a private tag, so no sequence number moves."""
    deadline = time.monotonic() + group.timeout
    done = group._complete
    buf = np.zeros(3, np.int64)
    if group.rank == 0:
        base = _now()
        for r in range(1, group.size):
            best = None
            for _ in range(_SYNC_ROUNDS):
                t0 = _now()
                buf[:] = (t0, 0, 0)
                done(group._start_send(buf, r, _SYNC_TAG, deadline),
                     deadline)
                done(group._start_recv(buf, r, _SYNC_TAG, deadline),
                     deadline)
                t2 = _now()
                rtt = t2 - t0
                if best is None or rtt < best[0]:
                    best = (rtt, int(buf[0]) - (t0 + t2) // 2)
            buf[:] = (best[1], base, best[0] // 2)
            done(group._start_send(buf, r, _SYNC_TAG, deadline), deadline)
        return 0, base, 0
    for _ in range(_SYNC_ROUNDS):
        done(group._start_recv(buf, 0, _SYNC_TAG, deadline), deadline)
        buf[0] = _now()
        done(group._start_send(buf, 0, _SYNC_TAG, deadline), deadline)
    done(group._start_recv(buf, 0, _SYNC_TAG, deadline), deadline)
    return int(buf[0]), int(buf[1]), int(buf[2])


# ------------------------------------------------------------------ merge --

def load(path: str) -> dict:
    """A rank's trace; a file cut short by a crash (no closing brackets)
    is completed with what it holds."""
    with open(path) as f:
        text = f.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        body = text.rstrip().rstrip(',')
        # drop a half-written last event, then close the array
        for cut in (body, body[:body.rfind('\n')].rstrip().rstrip(',')):
            try:
                return json.loads(cut + '\n]}')
            except json.JSONDecodeError:
                continue
        raise ValueError(f"{path} is not a dtorch timeline (Chrome trace "
                         f"JSON)") from None


# collectives that no rank can leave before every rank entered (a rooted
# one - broadcast, reduce, gather, scatter - may let the root go early)
SYMMETRIC = ('all_reduce', 'all_reduce_coalesced', 'all_gather',
             'reduce_scatter', 'all_to_all', 'barrier', 'all_gather_object')


def split_wait(events: list[dict]) -> int:
    """Add ``wait_us``/``transfer_us`` to every symmetric collective event
    (and a ``wait`` child slice) by matching (group, seq) across ranks:
    wait lasts until the last rank entered. Returns the number of
    collectives matched on more than one rank."""
    by_key = {}
    for e in events:
        a = e.get('args') or {}
        if (e.get('cat') == 'collective' and a.get('seq', 0) > 0
                and e.get('name') in SYMMETRIC):
            by_key.setdefault((a['group'], a['seq']), []).append(e)
    extra, matched = [], 0
    for evs in by_key.values():
        last = max(e['ts'] for e in evs)
        if len(evs) > 1:
            matched += 1
        for e in evs:
            wait = min(max(0.0, last - e['ts']), e['dur'])
            e['args']['wait_us'] = round(wait, 3)
            e['args']['transfer_us'] = round(e['dur'] - wait, 3)
            if wait > 0:
                extra.append({'ph': 'X', 'name': 'wait', 'cat': 'wait',
                              'pid': e['pid'], 'tid': e['tid'],
                              'ts': e['ts'], 'dur': round(wait, 3)})
    events.extend(extra)
    return matched


def merge(paths: list[str], out: str) -> dict:
    """Join rank traces into one (one process per rank, timestamps already
    in rank 0's clock); returns a summary."""
    if not paths:
        raise FileNotFoundError("no rank*.json timeline files to merge")
    events, infos = [], []
    for p in paths:
        doc = load(p)
        info = doc.get('dtorchTimeline', {})
        infos.append(info)
        events.extend(doc.get('traceEvents', []))
    ranks = sorted({i.get('rank') for i in infos if 'rank' in i})
    matched = split_wait(events)
    doc = {'traceEvents': events, 'displayTimeUnit': 'ms',
           'dtorchTimeline': {'ranks': ranks, 'files': len(paths),
                              'clock_error_us': max(
                                  (i.get('clock_error_us') or 0
                                   for i in infos), default=0),
                              'collectives_matched': matched}}
    tmp = f"{out}.tmp{os.getpid()}"
    with open(tmp, 'w') as f:
        json.dump(doc, f)
    os.replace(tmp, out)
    return doc['dtorchTimeline']


def rank_files(directory: str) -> list[str]:
    import glob

    def key(p):
        stem = os.path.basename(p)[4:-5]
        return int(stem) if stem.isdigit() else 1 << 30
    return sorted(glob.glob(os.path.join(directory, 'rank*.json')), key=key)


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(
        prog='python -m dtorch.utils.timeline',
        description='dtorch timelines (DTORCH_TIMELINE=DIR): merge the '
                    'ranks\' traces into one file for chrome://tracing or '
                    'https://ui.perfetto.dev')
    sub = ap.add_subparsers(dest='cmd', required=True)
    m = sub.add_parser('merge', help='merge DIR/rank*.json into one trace')
    m.add_argument('dir')
    m.add_argument('-o', '--output', default=None,
                   help='output file (default DIR/merged.json)')
    a = ap.parse_args(argv)
    if not os.path.isdir(a.dir):
        ap.error(f"{a.dir} is not a directory")
    out = a.output or os.path.join(a.dir, 'merged.json')
    paths = [p for p in rank_files(a.dir)
             if os.path.abspath(p) != os.path.abspath(out)]
    try:
        s = merge(paths, out)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{out}: ranks {s['ranks']} from {s['files']} files, "
          f"{s['collectives_matched']} collectives matched across ranks, "
          f"clock error <= {s['clock_error_us']:.1f} us")
    return 0


if __name__ == '__main__':
    sys.exit(main())
