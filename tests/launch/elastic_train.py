"""A small elastic training script for tests/launch/test_elastic.py.

A 2-layer MLP on synthetic data through dtorch.distributed.elastic. Each
rank appends to LOG (``--log``) one JSON line per step it starts (its
membership round, epoch, step, pid and sample ids) and one per step it
completes; the test reads them to check that every sample of an epoch was
trained on exactly once. ``--kill UID:STEP[,UID:STEP]``: member UID
SIGKILLs itself at the start of global step STEP (its first attempt);
``--die-in-reform UID``: member UID exits while checking in for a new
round (a death during the re-formation). ``--deterministic``: use_
deterministic_algorithms(True). ``--zero``: ZeroRedundancyOptimizer
(ZeRO-1) over Adam; ``--fsdp``: the job wraps the model in FSDP (Adam over
its flat parameters; ``--fsdp-units``: each Linear a unit);
``--kill-in-buddy UID:STEP``: member UID SIGKILLs itself in step STEP
after the optimizer step (its shard updated), before swapping buddy
replicas. The final parameters go to OUT.npz (``--out``, rank 0).
"""
import argparse
import json
import os
import signal
import sys

import numpy as np

import dtorch as torch
from dtorch import nn
from dtorch.distributed import elastic


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--samples", type=int, default=96)
    ap.add_argument("--batch-size", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--log", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--kill", default="")
    ap.add_argument("--slow", type=float, default=0.0,
                    help="seconds of sleep per step (gives joiners time)")
    ap.add_argument("--die-in-reform", type=int, default=-1)
    ap.add_argument("--kill-after-join", default="",
                    help="these uids SIGKILL themselves together at the "
                         "second step of the first round with a joiner")
    ap.add_argument("--hold", default="",
                    help="STEP:joinN (wait there until N joiners "
                         "registered) or STEP:PATH (until PATH exists), at "
                         "most 60 s; several, comma-separated")
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--zero", action="store_true")
    ap.add_argument("--fsdp", action="store_true")
    ap.add_argument("--fsdp-units", action="store_true",
                    help="with --fsdp: each Linear a unit of its own")
    ap.add_argument("--kill-in-buddy", default="")
    ap.add_argument("--kill-at-end", type=int, default=-1,
                    help="this uid SIGKILLs itself after training, before "
                         "job.close() (while the others evaluate)")
    args = ap.parse_args()
    if args.deterministic:
        torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    g = np.random.default_rng(0)
    n = args.samples
    x = torch.from_numpy(g.standard_normal((n, 8)).astype(np.float32))
    y = torch.from_numpy((g.standard_normal(n) > 0).astype(np.int64))
    model = nn.Sequential(nn.Linear(8, args.hidden), nn.Tanh(),
                          nn.Linear(args.hidden, 2))
    if args.zero:
        from dtorch.distributed.optim import ZeroRedundancyOptimizer
        if not elastic.is_elastic():
            torch.distributed.init_process_group()
        opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam,
                                      lr=0.01)
    elif args.fsdp:      # the job builds it over the FSDP flat parameters
        opt = lambda params: torch.optim.Adam(params, lr=0.01)  # noqa: E731
    else:
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
    vs = {"virtual_shards": 12} if args.deterministic else {}
    fsdp = dict(vs)
    if args.fsdp_units:
        from dtorch.distributed.fsdp.wrap import ModuleWrapPolicy
        fsdp["auto_wrap_policy"] = ModuleWrapPolicy({nn.Linear})
    job = elastic.ElasticJob(model, opt,
                             torch.utils.data.TensorDataset(x, y),
                             batch_size=args.batch_size,
                             ddp_kwargs=None if args.fsdp else vs,
                             fsdp=fsdp if args.fsdp else None)
    opt = job.optimizer
    uid = getattr(job, "uid", 0)
    kills = {int(a): int(b) for a, b in
             (k.split(":") for k in args.kill.split(",") if k)}
    after_join = {int(u) for u in args.kill_after_join.split(",") if u}
    holds = dict((int(a), b) for a, b in
                 (h.split(":", 1) for h in args.hold.split(",") if h))

    def hold(what):
        import time
        end = time.monotonic() + 60
        while time.monotonic() < end:
            if what.startswith("join"):
                if job.members.joins_waiting() >= int(what[4:] or 1):
                    return
            elif os.path.exists(what):
                return
            time.sleep(0.05)
    if args.die_in_reform == uid:
        def dying(done):     # check in, then die before the group forms
            job.members.store.set(
                f"el/here/{job.members.round + 1}/{uid}",
                json.dumps({"done": done}))
            os._exit(7)
        job.members.reform = dying
    if args.kill_in_buddy:
        k_uid, k_step = map(int, args.kill_in_buddy.split(":"))
        swap = job._buddy.step_done if k_uid == uid else None

        def dying_swap(group, version):     # version: the step's done + 1
            if version == k_step + 1:
                os.kill(os.getpid(), signal.SIGKILL)
            return swap(group, version)
        if swap is not None:
            job._buddy.step_done = dying_swap
    log = open(args.log, "a", buffering=1) if args.log else None

    def note(**kw):
        if log:
            log.write(json.dumps(dict(kw, uid=uid, pid=os.getpid())) + "\n")

    note(event="start", joined=os.environ.get("DTORCH_ELASTIC_JOIN") == "1")
    for epoch in job.epochs(args.epochs):
        for step in job.steps():
            if kills.get(uid) == job.done:
                os.kill(os.getpid(), signal.SIGKILL)
            dec = job.members.decision if job.elastic else {}
            if uid in after_join and dec.get("joined") and \
                    job.done == dec["done"] + 1:
                os.kill(os.getpid(), signal.SIGKILL)
            if job.done in holds:
                hold(holds[job.done])
            rnd = job.members.round if job.elastic else 0
            at = job.done
            note(event="begin", round=rnd, epoch=epoch, step=at,
                 world=job.world_size, ids=[int(i) for i in step.indices])
            with step:
                if args.slow:
                    import time
                    time.sleep(args.slow)
                xb, yb = step.batch
                opt.zero_grad()
                out = job.model(xb)
                loss = nn.functional.cross_entropy(out, yb)
                loss.backward()
                opt.step()
            if step.error is None:
                note(event="done", round=rnd, epoch=epoch, step=at)
    # FSDP's state_dict gathers the full parameters: every rank calls it
    sd = (job.model if args.fsdp else model).state_dict()
    if job.rank == 0 and args.out:
        np.savez(args.out, **{k: v.numpy() for k, v in sd.items()})
    if args.kill_at_end == uid:
        os.kill(os.getpid(), signal.SIGKILL)
    note(event="end", world=job.world_size, rank=job.rank)
    job.close()


if __name__ == "__main__":
    sys.exit(main())
