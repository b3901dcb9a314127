"""Elastic membership through the rendezvous store (issue 27).

The store of an elastic job is not served by a rank: ``dtorch-launch
--elastic`` runs it in an *agent* process of its own (``python -m
collectives.elastic_store host``), which outlives any rank, so every rank,
rank 0 included, may die. The launchers of other nodes and of joiners talk
to it through a client agent (``... client``). Both read commands on stdin
and answer on stdout, one line each, so that ``launch/`` never imports this
package (DESIGN.md, "Layers").

The membership is a sequence of *rounds*. Round 0 is the launch: members
are uids ``0 .. W0-1``. A member is a process with a uid that never changes
(its first RANK, or the number a joiner's launcher draws). A new round is
formed when a collective fails (a rank died) or when a joiner waits:

1. each live member checks in (``el/here/<m>/<uid>``: the steps it has
   completed); the first to ``add('el/lead/<m>')`` leads the round;
2. the leader waits until every member of the previous round has checked in
   or was reported dead by its launcher (``el/dead/<uid>``, written within a
   poll of the process's exit), at most ``DTORCH_ELASTIC_TIMEOUT`` s (then
   the missing ones count as lost: a node whose launcher died too); it adds
   the joiners that fit under MAX and writes the decision
   ``el/round/<m>``: the members in their new rank order (survivors in
   their old order, then joiners), the lost and joined uids, the member
   whose state the others take (the one with most completed steps), or the
   reason the job stops (fewer than MIN left);
3. every member reads the decision and forms the round's process group
   (``TCPGroup`` named ``elastic.<m>``, whose keys do not collide with an
   earlier round's). If that fails (a member died while the group formed),
   the next round starts from step 1.

This module holds only that protocol; what a rank does with a decision
(DDP, the sampler, the state) is ``dtorch.distributed.elastic``.
"""
from __future__ import annotations
import json
import os
import sys
import threading
import time

from .env import env_number, env_str
from .errors import CollectiveTimeoutError
from .store import TCPStore, _close_clients

_P = 'el/'


def key(*parts) -> str:
    return _P + '/'.join(str(p) for p in parts)


def _loads(raw):
    return json.loads(raw.decode())


class ElasticStop(RuntimeError):
    """The job cannot go on (fewer than MIN ranks left, or this process was
    left out of the membership); the message says why."""


class Membership:
    """One process's side of the protocol (module docstring).

    ``store``: a TCPStore client of the agent's store; ``uid``: this
    process's member id."""

    def __init__(self, store: TCPStore, uid: int,
                 timeout: float | None = None) -> None:
        self.store, self.uid = store, int(uid)
        store.tie(key('gone', self.uid))
        self.timeout = timeout or env_number('DTORCH_ELASTIC_TIMEOUT', 30.0)
        self.min, self.max = _loads(store.get(key('minmax')))
        self.decision = None

    # ---- what a member reads
    @property
    def round(self):
        return self.decision['round']

    @property
    def members(self):
        return self.decision['members']

    def initial(self) -> dict:
        """Round 0 (the launch), for a process started with the job."""
        self.decision = _loads(self.store.get(key('round', 0)))
        return self._mine(self.decision)

    def join(self, info: str = '') -> dict:
        """Register as a joiner and wait for a round that admits this
        process; ElasticStop if it is refused or the job stopped."""
        self.store.set(key('join', self.uid), info or str(os.getpid()))
        self.store.add(key('join_seq'), 1)
        m = int(self.store.get(key('latest'))) + 1
        while True:
            refused = self.store.try_get(key('refused', self.uid))
            if refused is not None:
                raise ElasticStop(refused.decode())
            if self.store.try_get(key('finished')) is not None:
                raise ElasticStop("the elastic job finished before this "
                                  "process was admitted")
            raw = self.store.try_get(key('round', m))
            if raw is None:
                time.sleep(0.02)
                continue
            dec = _loads(raw)
            if dec.get('stop'):
                raise ElasticStop(dec['stop'])
            if self.uid in dec['members']:
                self.decision = dec
                return dec
            m += 1

    def joins_waiting(self) -> int:
        """How many joins were ever requested (compare with the decision's
        ``join_seq``: more means a joiner waits)."""
        raw = self.store.try_get(key('join_seq'))
        return int(raw) if raw is not None else 0

    def reform(self, done: int) -> dict:
        """Check in for the next round with ``done`` completed steps, lead
        it if first, and return its decision (this process is a member of
        it; ElasticStop otherwise or when the job stops)."""
        m = self.round + 1
        self.store.set(key('here', m, self.uid), json.dumps({'done': done}))
        if self.store.add(key('lead', m), 1) == 1:
            self._lead(m)
        dec = _loads(self.store.get(key('round', m),
                                    timeout=self.timeout + 60))
        self.decision = dec
        return self._mine(dec)

    def _mine(self, dec):
        if dec.get('stop'):
            raise ElasticStop(dec['stop'])
        if self.uid not in dec['members']:
            raise ElasticStop(
                f"member {self.uid} was left out of membership round "
                f"{dec['round']} (it did not check in within "
                f"{self.timeout:.0f} s, DTORCH_ELASTIC_TIMEOUT)")
        return dec

    # ---- the leader
    def _dead(self, uid):
        raw = self.store.try_get(key('dead', uid))
        return None if raw is None else raw.decode()

    def _gone(self, uid, since):
        """The reason `uid` is lost, if it is: its launcher's report, or
        (0.5 s after the store saw its connection close, time for a live
        launcher to report) the closed connection itself: its node or
        launcher went with it."""
        why = self._dead(uid)
        if why is not None:
            return why
        if self.store.try_get(key('gone', uid)) is None:
            return None
        first = since.setdefault(uid, time.monotonic())
        if time.monotonic() - first < 0.5:
            return None
        return ("its connection to the store closed (its launcher did not "
                "report it: node lost?)")

    def _lead(self, m):
        prev = self.decision['members']
        here, dead, since = {}, {}, {}
        end = time.monotonic() + self.timeout
        while True:
            for u in prev:
                if u in here or u in dead:
                    continue
                why = self._gone(u, since)
                if why is not None:
                    dead[u] = why
                    continue
                raw = self.store.try_get(key('here', m, u))
                if raw is not None:
                    here[u] = _loads(raw)
            if len(here) + len(dead) == len(prev):
                break
            if time.monotonic() > end:
                for u in prev:
                    if u not in here and u not in dead:
                        dead[u] = (f"did not check in within "
                                   f"{self.timeout:.0f} s")
                        self.store.set(key('dead', u), dead[u])
                break
            time.sleep(0.005)
        # a member that checked in and died at once: its launcher's report
        # (within a poll of 20 ms) wins, it cannot form the group
        time.sleep(0.05)
        for u in list(here):
            why = self._dead(u)
            if why is None and self.store.try_get(key('gone', u)):
                why = "its connection to the store closed"
            if why is not None:
                dead[u] = why
                del here[u]
        survivors = [u for u in prev if u in here]
        join_seq = self.joins_waiting()
        joined = []
        for u in range(int(self.store.get(key('first_joiner'))),
                       int(self.store.get(key('uid_next')))):
            if u in prev or self.store.try_get(key('join', u)) is None \
                    or self._dead(u) is not None \
                    or self.store.try_get(key('gone', u)) is not None \
                    or self.store.try_get(key('refused', u)) is not None:
                continue
            if len(survivors) + len(joined) >= self.max:
                self.store.set(key('refused', u), (
                    f"join refused: the job already has {self.max} ranks, "
                    f"the maximum of --elastic {self.min}:{self.max}"))
                continue
            joined.append(u)
        members = survivors + joined
        lost = [{'uid': u, 'rank': prev.index(u), 'why': dead[u]}
                for u in prev if u in dead]
        stop = None
        if len(members) < self.min:
            what = ", ".join(f"rank {x['rank']} ({x['why']})" for x in lost)
            stop = (f"only {len(members)} rank(s) left after losing "
                    f"{what or 'none'}: below the minimum {self.min} of "
                    f"--elastic {self.min}:{self.max}; the job stops")
        source = max(survivors, key=lambda u: here[u]['done']) \
            if survivors else None
        dec = {'round': m, 'members': members, 'lost': lost,
               'joined': joined, 'source': source, 'stop': stop,
               'join_seq': join_seq, 'prev_world': len(prev),
               'done': here[source]['done'] if source is not None else 0}
        self.store.set(key('round', m), json.dumps(dec))
        self.store.set(key('latest'), str(m))


# ---------------------------------------------------------------- agent

def host_init(store, world, lo, hi):
    """The keys of a new elastic job of ``world`` ranks (uids 0..world-1)."""
    store.set(key('first_joiner'), str(world))
    store.set(key('uid_next'), str(world))
    store.add(key('seats'), world)
    store.set(key('round', 0), json.dumps(
        {'round': 0, 'members': list(range(world)), 'lost': [],
         'joined': [], 'source': None, 'stop': None, 'join_seq': 0,
         'prev_world': world, 'done': 0}))
    store.set(key('latest'), '0')
    # last: a client that sees it sees all of the above
    store.set(key('minmax'), json.dumps([lo, hi]))


def describe_round(dec):
    """The launcher's line for a decided round."""
    lost = ", ".join(f"rank {x['rank']} (member {x['uid']}: {x['why']})"
                     for x in dec['lost'])
    parts = []
    if lost:
        parts.append(f"lost {lost}")
    if dec['joined']:
        parts.append(f"{len(dec['joined'])} joined (member(s) "
                     f"{', '.join(map(str, dec['joined']))})")
    what = "; ".join(parts) or "re-formed"
    if dec['stop']:
        return f"elastic round {dec['round']}: {what}; {dec['stop']}"
    return (f"elastic round {dec['round']}: {what}; new world size "
            f"{len(dec['members'])} (was {dec['prev_world']})")


def _watch_rounds(store, out, lock, m):
    while True:
        try:
            # short waits: a closed connection is noticed by the server
            # within one (it may then stop serving)
            raw = store.get(key('round', m), timeout=0.5)
        except CollectiveTimeoutError:
            continue
        except Exception:          # the store closed: the agent ends
            return
        dec = _loads(raw)
        dec['text'] = describe_round(dec)
        with lock:
            out.write(f"round {json.dumps(dec)}\n")
            out.flush()
        m += 1


def agent_main(argv=None):
    """``python -m collectives.elastic_store host HOST PORT WORLD MIN MAX``
    or ``... client HOST PORT``: the token comes from DTORCH_RDZV_TOKEN.
    Each round decided while it runs is written as ``round JSON``.
    Commands on stdin: ``dead UID TEXT``, ``seats N`` (answers ``seats
    TOTAL``), ``uid`` (answers ``uid N``); end of input stops the agent
    (the host's store closes)."""
    argv = sys.argv[1:] if argv is None else argv
    mode, host, port = argv[0], argv[1], int(argv[2])
    token = env_str('DTORCH_RDZV_TOKEN', '') or None
    out, lock = sys.stdout, threading.Lock()
    try:
        store = TCPStore(host, port, token, is_server=(mode == 'host'),
                         timeout=env_number('DTORCH_ELASTIC_CONNECT', 60.0))
    except Exception as e:
        out.write(f"error {e}\n")
        out.flush()
        return 1
    if mode == 'host':
        host_init(store, int(argv[3]), int(argv[4]), int(argv[5]))
    else:
        store.get(key('minmax'))      # the host agent has set the job up
    # the rounds decided from now on, for the launcher to print
    first = int(store.get(key('latest'))) + 1
    threading.Thread(target=_watch_rounds,
                     args=(store.clone(), out, lock, first),
                     daemon=True).start()
    with lock:
        out.write(f"ready {store.port}\n")
        out.flush()
    for line in sys.stdin:
        cmd, _, rest = line.strip().partition(' ')
        if cmd == 'dead':
            uid, _, why = rest.partition(' ')
            store.set(key('dead', uid), why or 'exited')
            store.add(key('seats'), -1)
            continue
        if cmd == 'seats':
            answer = f"seats {store.add(key('seats'), int(rest))}"
        elif cmd == 'uid':
            answer = f"uid {store.add(key('uid_next'), 1) - 1}"
        elif cmd == 'minmax':
            answer = "minmax " + " ".join(
                map(str, _loads(store.get(key('minmax')))))
        else:
            answer = f"error unknown command {cmd!r}"
        with lock:
            out.write(answer + "\n")
            out.flush()
    if store.server is not None:
        # the launcher's own ranks are done; ranks of other launchers
        # (joiners, other nodes) may still use the store: serve them until
        # they close their connections
        store._close_client()
        _close_clients(store.port)
        store.server.drain(env_number('DTORCH_ELASTIC_DRAIN', 7 * 86400.0))
        store.server.close()
    return 0


if __name__ == '__main__':
    sys.exit(agent_main())
