#!/usr/bin/env bash
# usage: slurm/local-cluster.sh start|stop|status|--help [DIR] [--purge]
#
# A REAL single-node SLURM cluster (munged + slurmctld + slurmd from
# Debian's packages) on this machine, for tests and CI: no systemd, every
# file (config, munge key and socket, state, spool, logs, pid files) under
# DIR (default: $SLURM_LOCAL_DIR or /tmp/dtorch-slurm).
#
#   eval "$(bash slurm/local-cluster.sh start)"   # exports SLURM_CONF
#   sbatch --ntasks=2 slurm/train.sbatch ...
#   bash slurm/local-cluster.sh stop [--purge]
#
# start: installs the packages with apt-get when missing (saying so first;
#   ~25 packages with their dependencies), writes
#   DIR/slurm.conf, starts the daemons, waits until the node is idle and
#   prints `export SLURM_CONF=...` lines on stdout (all else on stderr, and
#   the daemons' stdio is redirected, so $(...) does not hang).  Idempotent:
#   if the cluster in DIR is up with the same config, it only reprints the
#   environment; if the config changed or a daemon died, it restarts.
# stop: cancels the remaining jobs, then TERMs the three daemons whose pids
#   are in DIR/run/*.pid (only if the process name matches).  --purge also
#   removes DIR.
# status: exit 0 if the node answers and is usable.
#
# Knobs (environment):
#   SLURM_LOCAL_CPUS        CPUs declared for the node (default: nproc).  May
#                           exceed nproc (SlurmdParameters=config_overrides).
#   SLURM_LOCAL_PMIX        =1 (default): also install libpmix2 + libpmix-dev,
#                           which `srun --mpi=pmix` needs for Open MPI 5
#                           ranks; =0 to skip (~10 s less apt time).
#   SLURM_LOCAL_WARMUP      =1: run one trivial batch job before returning
#                           (slurmctld's first scheduling pass takes ~3 s).
#   SLURM_LOCAL_KILL_ON_BAD_EXIT =1: KillOnBadExit=1 cluster-wide.
#   SLURM_LOCAL_CTLD_PORT / SLURM_LOCAL_SLURMD_PORT  default 6817 / 6818
#   SLURM_LOCAL_TIMEOUT     seconds to wait for the node (default 60)
#   SLURM_LOCAL_NO_INSTALL  =1: never run apt-get (fail if SLURM is missing)
#   SLURM_LOCAL_SCHED_PARAMS  SchedulerParameters (default
#                           batch_sched_delay=0,sched_min_interval=0)
# Must run as root (jobs run as root; SlurmUser=root).  Notes on what works
# and what does not on a small VM: slurm/README.md.
set -euo pipefail

CMD="${1:-}"
shift || true
DIR="${SLURM_LOCAL_DIR:-/tmp/dtorch-slurm}"
PURGE=0
for a in "$@"; do
    case "$a" in
        --purge) PURGE=1;;
        *) DIR="$a";;
    esac
done
CTLD_PORT="${SLURM_LOCAL_CTLD_PORT:-6817}"
SLURMD_PORT="${SLURM_LOCAL_SLURMD_PORT:-6818}"
TIMEOUT="${SLURM_LOCAL_TIMEOUT:-60}"

log() { echo "[local-cluster] $*" >&2; }
die() { echo "[local-cluster] ERROR: $*" >&2; exit 1; }
usage() {  # the header comment above, without its '# '
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
}
case "$CMD" in
    start|stop|status) ;;
    -h|--help|help) usage; exit 0;;
    "") usage >&2; die "no command given";;
    *) usage >&2; die "unknown command '$CMD'";;
esac

t0=$(date +%s.%N)
elapsed() { awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}'; }

# --------------------------------------------------------------- helpers ---
alive() {  # alive PID: process exists and is not a zombie (PID 1 here reaps
           # orphans only after ~1 s, so a killed daemon lingers as Z)
    local st
    st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
    [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}
pid_of() {  # pid_of PIDFILE NAME: print pid if PIDFILE holds a live process named NAME*
    local f="$1" name="$2" pid comm
    [ -s "$f" ] || return 1
    pid=$(tr -dc '0-9' < "$f")
    [ -n "$pid" ] && alive "$pid" || return 1
    comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
    # /proc/PID/comm is truncated to 15 chars; slurmctld/slurmd/munged fit.
    case "$comm" in "$name"*) echo "$pid";; *) return 1;; esac
}

CONF="$DIR/slurm.conf"
MUNGE_SOCKET="$DIR/munge/munge.socket.2"
NODE="$(hostname -s 2>/dev/null || true)"
[ -n "$NODE" ] || NODE=localhost
node_state() {  # prints e.g. "idle", "down*", "" when controller unreachable
    SLURM_CONF="$CONF" timeout 10 sinfo -h -N -n "$NODE" -o '%T' 2>/dev/null | head -n1 || true
}

# ------------------------------------------------------------------- stop ---
do_stop() {
    set +e
    # Cancel remaining jobs so their processes are ended by slurmd (not orphaned).
    if [ -f "$CONF" ] && pid_of "$DIR/run/slurmctld.pid" slurmctld >/dev/null; then
        jobs=$(SLURM_CONF="$CONF" timeout 10 squeue -h -o '%i' 2>/dev/null || true)
        if [ -n "$jobs" ]; then
            log "cancelling jobs: $(echo $jobs)"
            SLURM_CONF="$CONF" timeout 10 scancel $jobs 2>/dev/null || true
            for _ in $(seq 50); do
                [ -z "$(SLURM_CONF="$CONF" timeout 5 squeue -h -o '%i' 2>/dev/null)" ] && break
                sleep 0.2
            done
        fi
    fi

    # Signal all three at once (munged alone takes ~2 s to exit), then wait.
    declare -A pids=()
    for name in slurmd slurmctld munged; do
        if pid=$(pid_of "$DIR/run/$name.pid" "$name"); then
            pids[$name]=$pid
            kill -TERM "$pid" 2>/dev/null || true
        fi
    done
    for _ in $(seq 100); do
        any=0
        for name in "${!pids[@]}"; do alive "${pids[$name]}" && any=1; done
        [ "$any" = 0 ] && break
        sleep 0.1
    done
    for name in "${!pids[@]}"; do
        if alive "${pids[$name]}"; then
            log "$name (${pids[$name]}) did not exit after 10s; SIGKILL"
            kill -KILL "${pids[$name]}" 2>/dev/null || true
        else
            log "stopped $name (${pids[$name]})"
        fi
    done
    rm -f "$DIR"/run/{slurmd,slurmctld,munged}.pid

    if [ "$PURGE" = 1 ]; then
        rm -rf "$DIR"
        log "removed $DIR"
    fi
    return 0
}
if [ "$CMD" = stop ]; then do_stop; exit 0; fi
if [ "$CMD" = status ]; then
    command -v sinfo >/dev/null 2>&1 || die "SLURM is not installed"
    st=$(node_state)
    case "$st" in
        idle*|mixed*|alloc*|completing*) log "node $NODE: $st"; exit 0;;
    esac
    log "no usable cluster in $DIR (node state '$st')"; exit 1
fi

# ------------------------------------------------------------------ start ---
[ "$(id -u)" = 0 ] || die "must run as root"

# ---------------------------------------------------------------- install ---
# the path mpi_pmix.so dlopen()s (Debian multiarch: x86_64, aarch64)
PMIX_LIB=/usr/lib/$(uname -m)-linux-gnu/pmix2/lib/libpmix.so
pkgs=()
for b in slurmctld slurmd sinfo srun sbatch munged munge; do
    command -v "$b" >/dev/null 2>&1 || { pkgs=(slurmctld slurmd slurm-client munge); break; }
done
if [ "${SLURM_LOCAL_PMIX:-1}" = 1 ] && [ ! -e "$PMIX_LIB" ]; then
    # libpmix2 alone is not enough: Slurm dlopen()s the unversioned libpmix.so,
    # which only libpmix-dev ships.
    pkgs+=(libpmix2 libpmix-dev)
fi
installed_now=0
if [ "${#pkgs[@]}" -gt 0 ]; then
    [ "${SLURM_LOCAL_NO_INSTALL:-0}" = 1 ] && die "missing: ${pkgs[*]} and SLURM_LOCAL_NO_INSTALL=1"
    log "installing ${pkgs[*]} and their dependencies (~25 Debian" \
        "packages) with apt-get; SLURM_LOCAL_NO_INSTALL=1 refuses ..."
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q --no-install-recommends "${pkgs[@]}" >&2
    installed_now=1
    log "install done after $(elapsed)s"
fi


print_env() {
    echo "export SLURM_CONF=$CONF"
    echo "export SLURM_LOCAL_DIR=$DIR"
    echo "export SLURM_LOCAL_NODE=$NODE"
    echo "export SLURM_LOCAL_MUNGE_SOCKET=$MUNGE_SOCKET"
}


# ------------------------------------------------------------ slurm.conf ----
CPUS="${SLURM_LOCAL_CPUS:-$(nproc)}"
# 90% of MemTotal (stable across calls, so the idempotency check below works;
# with config_overrides slurmd never drains the node for "Low RealMemory").
mem_total_mb=$(awk '/^MemTotal:/{print int($2/1024)}' /proc/meminfo)
REALMEM=$(( mem_total_mb * 9 / 10 ))
[ "$REALMEM" -ge 100 ] || REALMEM=100

# proctrack/pgid, not linuxproc: linuxproc follows parent links, so a
# task's child that outlives the task (reparented to init) is lost, keeps
# the step's output pipe open and the job hangs in COMPLETING for 60 s.
# pgid finds it by its process group.  (cgroup would too, but needs a
# cgroup.conf and leaves directories behind on this machine.)
# EnforcePartLimits=ALL: sbatch refuses at once what the node can never
# run (more CPUs, nodes or memory than it has: "More processors requested
# than permitted") instead of queueing it forever as PartitionConfig.
CONF_TEXT=$(cat <<EOF
# generated by dtorch slurm/local-cluster.sh -- single node, no accounting, no cgroups
ClusterName=localci
SlurmctldHost=${NODE}(127.0.0.1)
SlurmctldPort=${CTLD_PORT}
SlurmdPort=${SLURMD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=${MUNGE_SOCKET}
StateSaveLocation=${DIR}/state
SlurmdSpoolDir=${DIR}/spool
SlurmctldPidFile=${DIR}/run/slurmctld.pid
SlurmdPidFile=${DIR}/run/slurmd.pid
SlurmctldLogFile=${DIR}/log/slurmctld.log
SlurmdLogFile=${DIR}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SchedulerParameters=${SLURM_LOCAL_SCHED_PARAMS:-batch_sched_delay=0,sched_min_interval=0}
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=2
KillOnBadExit=${SLURM_LOCAL_KILL_ON_BAD_EXIT:-0}
InactiveLimit=0
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=${NODE} NodeAddr=127.0.0.1 NodeHostname=${NODE} CPUs=${CPUS} RealMemory=${REALMEM} State=UNKNOWN
EnforcePartLimits=ALL
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
)

# ------------------------------------------------------- already running? ---
if [ "$installed_now" = 0 ] && [ -f "$CONF" ] &&
   [ "$(cat "$CONF")" = "$CONF_TEXT" ] &&
   pid_of "$DIR/run/munged.pid" munged >/dev/null &&
   pid_of "$DIR/run/slurmctld.pid" slurmctld >/dev/null &&
   pid_of "$DIR/run/slurmd.pid" slurmd >/dev/null; then
    st=$(node_state)
    case "$st" in
        idle*|mixed*|alloc*|completing*)
            log "already running in $DIR (node $NODE: $st)"
            print_env
            exit 0;;
    esac
    log "daemons alive but node state is '$st'; restarting"
elif [ -f "$CONF" ] && [ "$(cat "$CONF")" != "$CONF_TEXT" ]; then
    log "configuration in $DIR changed; restarting"
fi

# Stop whatever we left in DIR before (only our own pids, checked by name).
stale=()
for name in slurmd slurmctld munged; do
    if pid=$(pid_of "$DIR/run/$name.pid" "$name"); then
        log "stopping stale $name (pid $pid)"
        kill -TERM "$pid" 2>/dev/null || true
        stale+=("$name:$pid")
    fi
done
if [ "${#stale[@]}" -gt 0 ]; then
    for _ in $(seq 50); do
        any=0; for e in "${stale[@]}"; do alive "${e#*:}" && any=1; done
        [ "$any" = 0 ] && break; sleep 0.1
    done
    for e in "${stale[@]}"; do
        # re-check name so a recycled pid is never hit
        pid_of "$DIR/run/${e%%:*}.pid" "${e%%:*}" >/dev/null && kill -KILL "${e#*:}" 2>/dev/null || true
    done
fi

# Refuse to start if the ports are taken by someone else (e.g. a system slurm).
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for p in "$CTLD_PORT" "$SLURMD_PORT"; do
    if port_busy "$p"; then
        die "port $p on 127.0.0.1 is already in use (another slurm?). Set SLURM_LOCAL_CTLD_PORT / SLURM_LOCAL_SLURMD_PORT."
    fi
done

# ------------------------------------------------------------ directories ---
# munged insists: socket dir must be o+x (and not group/other writable unless
# sticky); key must be owned by the munged user (root here) and not readable
# by others.  Parent directories must not be group/other-writable without the
# sticky bit (/tmp is fine).
rm -rf "$DIR/state" "$DIR/spool" "$DIR/run"
mkdir -p "$DIR"/{munge,state,spool,log,run}
chmod 755 "$DIR" "$DIR/munge"
chmod 700 "$DIR/state" "$DIR/spool"
if [ ! -s "$DIR/munge/munge.key" ]; then
    dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
fi
chown root:root "$DIR/munge/munge.key"
chmod 400 "$DIR/munge/munge.key"

printf '%s\n' "$CONF_TEXT" > "$CONF"

# ---------------------------------------------------------------- daemons ---
log "starting munged"
munged --socket="$MUNGE_SOCKET" --key-file="$DIR/munge/munge.key" \
       --log-file="$DIR/log/munged.log" --pid-file="$DIR/run/munged.pid" \
       --seed-file="$DIR/munge/munged.seed" </dev/null >>"$DIR/log/munged.out" 2>&1 \
    || { cat "$DIR/log/munged.log" >&2 || true; die "munged failed"; }
munge -S "$MUNGE_SOCKET" -n | unmunge -S "$MUNGE_SOCKET" >/dev/null \
    || die "munge self-test failed (see $DIR/log/munged.log)"

export SLURM_CONF="$CONF"
log "starting slurmctld"
# -c: start from clean state (no old jobs); -i: ignore unreadable state files.
slurmctld -c -i -f "$CONF" </dev/null >>"$DIR/log/slurmctld.out" 2>&1 \
    || { tail -20 "$DIR/log/slurmctld.log" >&2 || true; die "slurmctld failed"; }
for _ in $(seq $(( TIMEOUT * 10 ))); do
    SLURM_CONF="$CONF" timeout 5 scontrol ping 2>/dev/null | grep -q 'UP' && break
    sleep 0.1
done
log "starting slurmd (node $NODE)"
slurmd -f "$CONF" -N "$NODE" </dev/null >>"$DIR/log/slurmd.out" 2>&1 \
    || { tail -20 "$DIR/log/slurmd.log" >&2 || true; die "slurmd failed"; }

# -------------------------------------------------------- wait for idle -----
deadline=$(( $(date +%s) + TIMEOUT ))
st=""
while :; do
    st=$(node_state)
    case "$st" in
        idle*) break;;
        down*|drain*)
            # e.g. a leftover reason; the node is ours, resume it.
            SLURM_CONF="$CONF" scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true;;
    esac
    if [ "$(date +%s)" -ge "$deadline" ]; then
        log "node $NODE not idle after ${TIMEOUT}s (state '$st'); logs follow"
        tail -20 "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log" >&2 || true
        exit 1
    fi
    sleep 0.2
done
if [ "${SLURM_LOCAL_WARMUP:-0}" = 1 ]; then
    wj=$(SLURM_CONF="$CONF" sbatch --parsable -J warmup -n 1 -o /dev/null --wrap true) || die "warm-up sbatch failed"
    for _ in $(seq $(( TIMEOUT * 10 ))); do
        [ -z "$(SLURM_CONF="$CONF" squeue -h -j "$wj" -o %T 2>/dev/null)" ] && break
        sleep 0.1
    done
    log "warm-up job $wj done"
fi
log "cluster up in $(elapsed)s: node $NODE $st, CPUs=$CPUS, conf $CONF"
print_env
