#!/usr/bin/env bash
# usage: slurm/local-cluster.sh start|stop|status|dir|--help [DIR] [--purge]
#            [--nodes N] [--rate RATE]
#
# A REAL SLURM cluster (munged + slurmctld + slurmd from Debian's packages)
# on this machine, for tests and CI: no systemd, every file (config, munge
# key and socket, state, spool, logs, pid files) under DIR (default:
# $SLURM_LOCAL_DIR, else /tmp/dtorch-slurm-UID-HASH, one per user and clone:
# two users, or CI jobs in two checkouts, never share or stop each other's
# cluster; `dir` prints it).  One node (this host) by default.
#
#   eval "$(bash slurm/local-cluster.sh start)"   # exports SLURM_CONF
#   sbatch --ntasks=2 slurm/train.sbatch ...
#   bash slurm/local-cluster.sh stop [--purge]
#
# sbatch/srun/squeue find the cluster through SLURM_CONF only: in a shell
# without it (no eval, a new terminal) they fail with SLURM's
# "fetch_config: DNS SRV lookup failed ... Could not establish a
# configuration source".  Run the eval line again there (a start of a
# running cluster only reprints the exports, in ~0.1 s).
#
# --nodes N (N >= 2): N nodes node0..node{N-1}, each a set of Linux
#   namespaces made by slurm/netns-nodes.sh (own network on a link-local
#   bridge, hostname, /dev/shm, PID space; shared file system), with
#   --host-link so slurmctld (and munged) stay on this host; one slurmd per
#   node, with its own spool, log, pid file and TmpFS (DIR/tmp/nodeI).
#   --rate RATE shapes each node's link (tc tbf, e.g. 1gbit).  The
#   namespaces' prefix is $SLURM_LOCAL_NETNS_PREFIX or derived from DIR;
#   stop (or a start with other options) removes them.  A DIR holds one
#   cluster: use another DIR for a second one (its ports follow from DIR).
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
#   SLURM_LOCAL_CTLD_PORT / SLURM_LOCAL_SLURMD_PORT  default: those of
#                           DIR's running cluster, else a pair derived from
#                           DIR in 20000-29999, the next free one if taken
#                           (written into DIR/slurm.conf)
#   SLURM_LOCAL_TIMEOUT     seconds to wait for the node (default 60)
#   SLURM_LOCAL_NO_INSTALL  =1: never run apt-get (fail if SLURM is missing)
#   SLURM_LOCAL_SCHED_PARAMS  SchedulerParameters (default
#                           batch_sched_delay=0,sched_min_interval=0)
#   SLURM_LOCAL_NETNS_PREFIX  --nodes: netns-nodes.sh prefix (default: 'sl'
#                           and a checksum of DIR)
# Must run as root (jobs run as root; SlurmUser=root).  Notes on what works
# and what does not on a small VM: slurm/README.md.
set -euo pipefail

CMD="${1:-}"
shift || true
CLONE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${SLURM_LOCAL_DIR:-/tmp/dtorch-slurm-$(id -u)-$(printf '%s' "$CLONE" | md5sum | cut -c1-8)}"
PURGE=0
NODES=1
RATE=""
ARGS=("$@")
TIMEOUT="${SLURM_LOCAL_TIMEOUT:-60}"

log() { echo "[local-cluster] $*" >&2; }
die() { echo "[local-cluster] ERROR: $*" >&2; exit 1; }
usage() {  # the header comment above, without its '# '
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
}
case "$CMD" in
    start|stop|status|dir) ;;
    -h|--help|help) usage; exit 0;;
    "") usage >&2; die "no command given";;
    *) usage >&2; die "unknown command '$CMD'";;
esac
set -- "${ARGS[@]}"
while [ $# -gt 0 ]; do
    case "$1" in
        --purge) PURGE=1; shift;;
        --nodes) [ $# -ge 2 ] || die "--nodes needs a value"; NODES="$2"; shift 2;;
        --nodes=*) NODES="${1#*=}"; shift;;
        --rate) [ $# -ge 2 ] || die "--rate needs a value"; RATE="$2"; shift 2;;
        --rate=*) RATE="${1#*=}"; shift;;
        -*) die "unknown option '$1'";;
        *) DIR="$1"; shift;;
    esac
done
[[ "$NODES" =~ ^[0-9]+$ ]] && [ "$NODES" -ge 1 ] && [ "$NODES" -le 200 ] \
    || die "--nodes must be an integer in 1..200 (got '$NODES')"
[ -z "$RATE" ] || [ "$NODES" -ge 2 ] \
    || die "--rate shapes the links between namespace nodes: it needs --nodes 2 or more"

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
node_state() {  # node_state [NAME]: e.g. "idle", "down*", "" when controller unreachable
    SLURM_CONF="$CONF" timeout 10 sinfo -h -N -n "${1:-$NODE}" -o '%T' 2>/dev/null | head -n1 || true
}
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
NETNS="$HERE/netns-nodes.sh"
# --nodes: "PREFIX N RATE" of the namespace nodes that DIR's cluster runs on
NODES_FILE="$DIR/nodes"
node_names() {  # the cluster's nodes: this host, or node0.. of NODES_FILE
    local p n r i
    if [ -s "$NODES_FILE" ]; then
        read -r p n r < "$NODES_FILE"
        for ((i = 0; i < n; i++)); do echo "node$i"; done
    else
        echo "$NODE"
    fi
}
cluster_usable() {  # exit 0 when every node is usable; prints "NAME: STATE, ..."
    local name st ok=0 out=()
    for name in $(node_names); do
        st=$(node_state "$name")
        out+=("$name: ${st:-?}")
        case "$st" in idle*|mixed*|alloc*|completing*) ;; *) ok=1;; esac
    done
    (IFS=,; echo "${out[*]}")
    return $ok
}
stop_nodes() {  # SIGKILL to each node's PID 1 ends its slurmd and what is left of the jobs
    local p n r
    [ -s "$NODES_FILE" ] || return 0
    read -r p n r < "$NODES_FILE"
    bash "$NETNS" stop --prefix "$p" >/dev/null 2>&1 \
        || log "netns-nodes.sh stop --prefix $p failed"
    log "stopped nodes node0..node$((n - 1)) (namespaces $p-*)"
    rm -f "$NODES_FILE"
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
    stop_nodes

    if [ "$PURGE" = 1 ]; then
        rm -rf "$DIR"
        log "removed $DIR"
    fi
    return 0
}
if [ "$CMD" = dir ]; then echo "$DIR"; exit 0; fi
if [ "$CMD" = stop ]; then do_stop; exit 0; fi
if [ "$CMD" = status ]; then
    command -v sinfo >/dev/null 2>&1 || die "SLURM is not installed"
    if st=$(cluster_usable); then log "$st"; exit 0; fi
    log "no usable cluster in $DIR ($st)"; exit 1
fi
if [ -t 1 ]; then
    log "note: start prints export lines for your shell; without" \
        "eval \"\$(bash slurm/local-cluster.sh start)\" sbatch/srun fail with" \
        "SLURM's 'DNS SRV lookup failed ... Could not establish a configuration" \
        "source' (SLURM_CONF is not set)"
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
    echo "export SLURM_LOCAL_NODE=$(node_names | head -n1)"   # where batch scripts run
    echo "export SLURM_LOCAL_MUNGE_SOCKET=$MUNGE_SOCKET"
    if [ "$NODES" -gt 1 ]; then
        echo "export SLURM_LOCAL_NODES='$(node_names | tr '\n' ' ' | sed 's/ $//')'"
        echo "export SLURM_LOCAL_NETNS_PREFIX=$PREFIX"
    fi
}


# ------------------------------------------------------------------ ports ---
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
if [ -n "${SLURM_LOCAL_CTLD_PORT:-}" ]; then
    CTLD_PORT="$SLURM_LOCAL_CTLD_PORT"
    SLURMD_PORT="${SLURM_LOCAL_SLURMD_PORT:-$((CTLD_PORT + 1))}"
elif [ -f "$CONF" ] && pid_of "$DIR/run/slurmctld.pid" slurmctld >/dev/null &&
     CTLD_PORT=$(sed -n 's/^SlurmctldPort=//p' "$CONF") &&
     SLURMD_PORT=$(sed -n 's/^SlurmdPort=//p' "$CONF") &&
     [ -n "$CTLD_PORT" ] && [ -n "$SLURMD_PORT" ]; then
    :   # DIR's own running cluster keeps its ports
else
    h=$(printf '%s' "$DIR" | md5sum | cut -c1-6)
    for ((i = 0; i < 100; i++)); do
        CTLD_PORT=$(( 20000 + ((16#$h + i) % 5000) * 2 ))
        SLURMD_PORT="${SLURM_LOCAL_SLURMD_PORT:-$((CTLD_PORT + 1))}"
        port_busy "$CTLD_PORT" || port_busy "$SLURMD_PORT" || break
    done
fi

# ------------------------------------------------------------ slurm.conf ----
CPUS="${SLURM_LOCAL_CPUS:-$(nproc)}"
# 90% of MemTotal (stable across calls, so the idempotency check below works;
# with config_overrides slurmd never drains the node for "Low RealMemory").
mem_total_mb=$(awk '/^MemTotal:/{print int($2/1024)}' /proc/meminfo)
REALMEM=$(( mem_total_mb * 9 / 10 ))
[ "$REALMEM" -ge 100 ] || REALMEM=100

# What differs between one node (this host, on loopback) and --nodes N
# (namespace nodes on a bridge that this host reaches through --host-link).
CTLD_ADDR=127.0.0.1
SPOOL="${DIR}/spool"
SLURMD_PID="${DIR}/run/slurmd.pid"
SLURMD_LOG="${DIR}/log/slurmd.log"
TMPFS_LINE=""
KIND="single node"
NODE_LINES="NodeName=${NODE} NodeAddr=127.0.0.1 NodeHostname=${NODE} CPUs=${CPUS} RealMemory=${REALMEM} State=UNKNOWN"
if [ "$NODES" -gt 1 ]; then
    PREFIX="${SLURM_LOCAL_NETNS_PREFIX:-sl$(printf '%s' "$DIR" | cksum | cut -c1-6)}"
    WANT_NODES="$PREFIX $NODES ${RATE:-none}"
    KIND="$NODES namespace nodes (slurm/netns-nodes.sh prefix $PREFIX)"
    # %n: each slurmd expands it to its node name
    SPOOL="${DIR}/spool/%n"
    SLURMD_PID="${DIR}/run/slurmd-%n.pid"
    SLURMD_LOG="${DIR}/log/slurmd-%n.log"
    # The PMIx plugin makes its per-step directory under TmpFS; the nodes
    # share /tmp, so with the default both slurmstepds of a step create
    # the same /tmp/spmix_appdir_* and the second one fails ("File exists").
    TMPFS_LINE="TmpFS=${DIR}/tmp/%n"$'\n'
fi
set_node_lines() {  # from netns-nodes.sh's "NAME ADDR NETNS PID" lines
    local name addr rest
    NODE_LINES=""
    while IFS=$'\t' read -r name addr rest; do
        [ -n "$name" ] || continue
        [ -z "$NODE_LINES" ] || NODE_LINES+=$'\n'
        NODE_LINES+="NodeName=${name} NodeAddr=${addr} NodeHostname=${name} CPUs=${CPUS} RealMemory=${REALMEM} State=UNKNOWN"
        # netns-nodes.sh --host-link: this host is .254 on the nodes' subnet
        CTLD_ADDR="${addr%.*}.254"
    done <<< "$1"
}

# proctrack/pgid, not linuxproc: linuxproc follows parent links, so a
# task's child that outlives the task (reparented to init) is lost, keeps
# the step's output pipe open and the job hangs in COMPLETING for 60 s.
# pgid finds it by its process group.  (cgroup would too, but needs a
# cgroup.conf and leaves directories behind on this machine.)
# EnforcePartLimits=ALL: sbatch refuses at once what the node can never
# run (more CPUs, nodes or memory than it has: "More processors requested
# than permitted") instead of queueing it forever as PartitionConfig.
make_conf() {
CONF_TEXT=$(cat <<EOF
# generated by dtorch slurm/local-cluster.sh -- ${KIND}, no accounting, no cgroups
ClusterName=localci
SlurmctldHost=${NODE}(${CTLD_ADDR})
SlurmctldPort=${CTLD_PORT}
SlurmdPort=${SLURMD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=${MUNGE_SOCKET}
StateSaveLocation=${DIR}/state
SlurmdSpoolDir=${SPOOL}
SlurmctldPidFile=${DIR}/run/slurmctld.pid
SlurmdPidFile=${SLURMD_PID}
SlurmctldLogFile=${DIR}/log/slurmctld.log
SlurmdLogFile=${SLURMD_LOG}
${TMPFS_LINE}SlurmctldDebug=info
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
${NODE_LINES}
EnforcePartLimits=ALL
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
)
}
CONF_TEXT=""
NODES_UP=0
if [ "$NODES" = 1 ]; then
    make_conf
elif [ -s "$NODES_FILE" ] && [ "$(cat "$NODES_FILE")" = "$WANT_NODES" ] &&
     lines=$(bash "$NETNS" status --prefix "$PREFIX" 2>/dev/null); then
    set_node_lines "$lines"
    make_conf
    NODES_UP=1
fi
slurmds_alive() {  # every node's slurmd runs (its pid file is in the node's PID space)
    local name
    if [ "$NODES" = 1 ]; then
        pid_of "$DIR/run/slurmd.pid" slurmd >/dev/null; return
    fi
    [ "$NODES_UP" = 1 ] || return 1
    for name in $(node_names); do
        bash "$NETNS" exec --prefix "$PREFIX" "$name" bash -c \
            'p=$(tr -dc 0-9 < "$1") && [ "$(cat /proc/$p/comm)" = slurmd ]' \
            check "$DIR/run/slurmd-$name.pid" >/dev/null 2>&1 || return 1
    done
}

# ------------------------------------------------------- already running? ---
if [ "$installed_now" = 0 ] && [ -f "$CONF" ] &&
   [ "$(cat "$CONF")" = "$CONF_TEXT" ] &&
   pid_of "$DIR/run/munged.pid" munged >/dev/null &&
   pid_of "$DIR/run/slurmctld.pid" slurmctld >/dev/null &&
   slurmds_alive; then
    if st=$(cluster_usable); then
        log "already running in $DIR ($st)"
        print_env
        exit 0
    fi
    log "daemons alive but node states are '$st'; restarting"
elif [ -f "$CONF" ] && [ -n "$CONF_TEXT" ] && [ "$(cat "$CONF")" != "$CONF_TEXT" ]; then
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
stop_nodes   # namespace nodes of a previous start (their slurmds with them)

# Refuse to start if the ports are taken by someone else (e.g. a system slurm).
# Namespace nodes' slurmds listen in their own network namespaces.
ports=("$CTLD_PORT")
[ "$NODES" -gt 1 ] || ports+=("$SLURMD_PORT")
for p in "${ports[@]}"; do
    if port_busy "$p"; then
        die "port $p on 127.0.0.1 is already in use (another slurm?). Set SLURM_LOCAL_CTLD_PORT / SLURM_LOCAL_SLURMD_PORT."
    fi
done

# ------------------------------------------------------------ directories ---
# munged insists: socket dir must be o+x (and not group/other writable unless
# sticky); key must be owned by the munged user (root here) and not readable
# by others.  Parent directories must not be group/other-writable without the
# sticky bit (/tmp is fine).
rm -rf "$DIR/state" "$DIR/spool" "$DIR/run" "$DIR/tmp"
mkdir -p "$DIR"/{munge,state,spool,log,run}
chmod 755 "$DIR" "$DIR/munge"
chmod 700 "$DIR/state" "$DIR/spool"

if [ "$NODES" -gt 1 ]; then
    # leftovers of a start that was killed before it wrote NODES_FILE
    if ip netns list | grep -q "^$PREFIX-"; then
        bash "$NETNS" stop --prefix "$PREFIX" >/dev/null 2>&1 || true
    fi
    log "starting $NODES namespace nodes (prefix $PREFIX${RATE:+, links shaped to $RATE})"
    lines=$(bash "$NETNS" start "$NODES" --prefix "$PREFIX" --host-link \
                ${RATE:+--rate "$RATE"}) || die "slurm/netns-nodes.sh start failed"
    echo "$WANT_NODES" > "$NODES_FILE"
    set_node_lines "$lines"
    ip -br addr show dev "$PREFIX-h" 2>/dev/null | grep -q " $CTLD_ADDR/" \
        || die "this host has no address $CTLD_ADDR on $PREFIX-h (netns-nodes.sh --host-link)"
    make_conf
    for name in $(node_names); do
        mkdir -p "$DIR/spool/$name" "$DIR/tmp/$name"
        chmod 700 "$DIR/spool/$name"
        chmod 1777 "$DIR/tmp/$name"
    done
fi
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
if [ "$NODES" = 1 ]; then
    log "starting slurmd (node $NODE)"
    slurmd -f "$CONF" -N "$NODE" </dev/null >>"$DIR/log/slurmd.out" 2>&1 \
        || { tail -20 "$DIR/log/slurmd.log" >&2 || true; die "slurmd failed"; }
else
    for name in $(node_names); do
        log "starting slurmd in $name"
        # A node has a sysfs of its own, without this host's cgroup mounts;
        # slurmd refuses to start without them although it uses no cgroup
        # here (proctrack/pgid, task/none).  What its cgroup/v1 detection
        # looks for: a tmpfs with the named 'systemd' hierarchy in it.
        bash "$NETNS" exec --prefix "$PREFIX" "$name" bash -c '
            set -e
            if ! mountpoint -q /sys/fs/cgroup; then
                mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup
                mkdir /sys/fs/cgroup/systemd
                mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd
            fi
            exec slurmd -f "$1" -N "$2"' slurmd-start "$CONF" "$name" \
            </dev/null >>"$DIR/log/slurmd-$name.out" 2>&1 \
            || { tail -20 "$DIR/log/slurmd-$name.log" >&2 || true; die "slurmd in $name failed"; }
    done
fi

# -------------------------------------------------------- wait for idle -----
deadline=$(( $(date +%s) + TIMEOUT ))
st=""
while :; do
    idle=1
    for name in $(node_names); do
        st=$(node_state "$name")
        case "$st" in
            idle*) ;;
            down*|drain*)
                # e.g. a leftover reason; the node is ours, resume it.
                idle=0
                SLURM_CONF="$CONF" scontrol update nodename="$name" state=resume >/dev/null 2>&1 || true;;
            *) idle=0;;
        esac
    done
    [ "$idle" = 1 ] && break
    if [ "$(date +%s)" -ge "$deadline" ]; then
        log "nodes not idle after ${TIMEOUT}s ($(cluster_usable)); logs follow"
        tail -20 "$DIR/log/slurmctld.log" "$DIR"/log/slurmd*.log >&2 || true
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
log "cluster up in $(elapsed)s: $(node_names | tr '\n' ' ')$st, CPUs=$CPUS per node, conf $CONF"
print_env
