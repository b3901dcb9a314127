"""`python -m launch.reaper GRACE`: stop a launcher's ranks when the
launcher dies without doing it itself (SIGKILL, OOM killer, a crash).

The launcher starts one reaper in a session of its own and keeps the
write end of its stdin; each line is `+SID` (a rank's session started) or
`-SID` (that session is stopped and about to be reaped: forget it, its id
may be reused).  The kernel closes the pipe when the launcher dies, however
it dies; the reaper then sends SIGTERM to every process left in the
sessions it knows, SIGKILL after GRACE seconds, and exits.  After a normal
exit the sessions are already empty and the reaper just exits.

The ranks' parent-death signal (SIGTERM, see procs.spawn) reaches only
the rank processes; this covers their children and ranks that ignore
SIGTERM."""

import signal
import sys

from launch import procs


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    grace = float(argv[0]) if argv else 5.0
    # A Ctrl-C or hang-up meant for the launcher is not for us: we act
    # only once the launcher is gone.
    for s in (signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    sessions = set()
    for line in sys.stdin:
        line = line.strip()
        if line[:1] == "+":
            sessions.add(int(line[1:]))
        elif line[:1] == "-":
            sessions.discard(int(line[1:]))
    left = procs.members(sessions)
    if left:
        n = len(left)
        print(f"dtorch-launch (reaper): the launcher is gone; stopping "
              f"{n} process{'es' if n > 1 else ''} of its ranks",
              file=sys.stderr, flush=True)
        procs.stop_groups(sessions, signal.SIGTERM, grace)


if __name__ == "__main__":
    main()
