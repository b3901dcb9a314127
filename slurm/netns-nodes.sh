#!/usr/bin/env bash
# usage: slurm/netns-nodes.sh COMMAND [options]
#
# N "nodes" on this machine, each a set of Linux namespaces that looks like
# another host to the programs inside it:
#   - its own network namespace: loopback plus eth0, a veth link to a
#     bridge (br0) in a switch namespace (PREFIX-sw); addresses in
#     169.254.S.0/24 (link-local) on those links only, so nothing can
#     leave the machine.  With --rate, each link is shaped to RATE in both
#     directions (tc tbf on eth0 and on the switch port): a NIC of RATE;
#   - its own UTS namespace: hostname nodeI, and /etc/hosts (bind-mounted)
#     resolves node0..node{N-1} to their addresses;
#   - its own mount namespace with a private tmpfs on /dev/shm and a sysfs
#     of its own network namespace (/sys/class/net/eth0/statistics);
#   - its own PID namespace with its own /proc: a process of one node cannot
#     open another node's /proc/PID/fd/N, which same-host shared-memory
#     tests rely on.
# The namespaces persist between commands: one holder process per node
# (PID 1 of the node, a bash loop that reaps orphans) keeps them; every
# `exec` enters them with nsenter, so several execs into one node share
# hostname, /dev/shm and process table.  /tmp, /work, /run and the rest of
# the file system stay shared (like a cluster's shared file system).
#
# Commands:
#   start N [--rate RATE] [--prefix P] [--host-link] [--shm-size SIZE]
#       Make nodes node0..node{N-1}.  Prints one line per node on stdout:
#           NAME<TAB>ADDRESS<TAB>NETNS<TAB>HOLDER_PID
#       (everything else goes to stderr).  Fails if P is already started.
#       RATE: a tc rate in bit/s units: 100mbit, 1gbit, 10gbit, 500kbit...
#       --host-link: also a veth from this (root) namespace to the switch,
#       address 169.254.S.254 on interface P-h, so host daemons (e.g.
#       slurmctld) can reach the nodes; unshaped.
#       --shm-size: size of each node's /dev/shm tmpfs (default 1g).
#   rate RATE|none [--prefix P]
#       Reshape every link of running nodes to RATE (both directions), or
#       remove the shaping (none).  Processes in the nodes keep running.
#   stop [--prefix P]
#       Kill the holders it started (which takes every process of the
#       nodes with them: PID 1 of a PID namespace), delete the namespaces,
#       links and the state directory.  Idempotent; also cleans up after
#       a partial start.
#   exec [--prefix P] NODE CMD [ARGS...]
#       Run CMD inside NODE (node0, 0 or the hostname), in the current
#       directory, with the current environment; exits with CMD's status.
#       The pid of `exec` is nsenter's; CMD is its child (in the node's PID
#       namespace) and gets SIGKILL if nsenter dies, so killing the pid you
#       started kills CMD.  To signal CMD itself, signal the child
#       (/proc/PID/task/PID/children).
#   status [--prefix P]
#       The node lines as `start` prints them; exit 0 when every holder is
#       alive, 1 when not started or broken.
#   --help
#
# P (default: $NETNS_NODES_PREFIX or "dtn"; letters, digits, '-' '_',
# at most 10 characters) names everything made: network namespaces
# P-node0.. and P-sw, state in /run/dtorch-netns/P, root-namespace link
# P-h.  Use a distinct P per concurrent user (tests do).  The subnet's
# third octet S is derived from P (20..219), so host links of several
# prefixes do not clash.  Requires root, ip, tc, unshare, nsenter, setpriv.
# Measured facts about this machine: ../shared/notes/namespaces.md (tbf and
# htb exist, netem does not: latency cannot be injected).
set -euo pipefail

STATE_ROOT=/run/dtorch-netns
PREFIX="${NETNS_NODES_PREFIX:-dtn}"
RATE=""
HOST_LINK=0
SHM_SIZE=1g
MARK=dtorch-netns-holder

log() { echo "[netns-nodes] $*" >&2; }
die() { echo "[netns-nodes] ERROR: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

CMD="${1:-}"
shift || true
case "$CMD" in
    -h|--help|help) usage; exit 0;;
    start|stop|exec|status|rate) ;;
    "") usage >&2; exit 2;;
    *) die "unknown command '$CMD' (start, stop, exec, status, rate, --help)";;
esac

POS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --rate) [ $# -ge 2 ] || die "--rate needs a value"; RATE="$2"; shift 2;;
        --rate=*) RATE="${1#*=}"; shift;;
        --prefix) [ $# -ge 2 ] || die "--prefix needs a value"; PREFIX="$2"; shift 2;;
        --prefix=*) PREFIX="${1#*=}"; shift;;
        --host-link) HOST_LINK=1; shift;;
        --shm-size) [ $# -ge 2 ] || die "--shm-size needs a value"; SHM_SIZE="$2"; shift 2;;
        --shm-size=*) SHM_SIZE="${1#*=}"; shift;;
        -h|--help) usage; exit 0;;
        --) shift; POS+=("$@"); break;;
        -*) if [ "$CMD" = exec ] && [ ${#POS[@]} -ge 1 ]; then POS+=("$@"); break; fi
            die "unknown option '$1'";;
        *) POS+=("$1"); shift
           # exec: everything after NODE belongs to the command
           if [ "$CMD" = exec ]; then POS+=("$@"); break; fi;;
    esac
done

[[ "$PREFIX" =~ ^[A-Za-z0-9_-]{1,10}$ ]] \
    || die "--prefix '$PREFIX': use 1-10 letters, digits, '-' or '_'"
STATE="$STATE_ROOT/$PREFIX"
SW="$PREFIX-sw"
HLINK="$PREFIX-h"
# third octet from the prefix: distinct prefixes rarely share a subnet
OCTET=$(( 20 + $(printf '%s' "$PREFIX" | cksum | cut -d' ' -f1) % 200 ))
NET="169.254.$OCTET"

need_root_tools() {
    [ "$(id -u)" = 0 ] || die "must run as root (namespaces, links, tc)"
    local t
    for t in ip tc unshare nsenter setpriv; do
        command -v "$t" >/dev/null || die "'$t' is not installed"
    done
}

# rate in bit/s from a tc-style rate (bit, kbit, mbit, gbit, tbit)
rate_bits() {
    local r="${1,,}" num unit
    [[ "$r" =~ ^([0-9]+)(bit|kbit|mbit|gbit|tbit)$ ]] \
        || die "--rate '$1': use an integer with bit, kbit, mbit, gbit or tbit (e.g. 1gbit)"
    num="${BASH_REMATCH[1]}"; unit="${BASH_REMATCH[2]}"
    case "$unit" in
        bit) echo "$num";; kbit) echo $((num * 1000));;
        mbit) echo $((num * 1000000));; gbit) echo $((num * 1000000000));;
        tbit) echo $((num * 1000000000000));;
    esac
}

shape() {  # shape NETNS DEV: tbf at RATE on DEV's egress
    local bits burst
    bits=$(rate_bits "$RATE")
    # burst: 2 ms at RATE, at least 128 KiB so that a 64 KiB GSO packet of
    # the veth always fits (tbf drops or splits what exceeds it)
    burst=$(( bits / 8 / 500 ))
    [ "$burst" -ge 131072 ] || burst=131072
    tc -n "$1" qdisc replace dev "$2" root tbf rate "$RATE" \
        burst "$burst" latency 20ms
}

no_ipv6() {  # no IPv6 link-local addresses on the links made in netns $1
    ip netns exec "$1" sh -c 'for f in all default; do
        echo 1 > /proc/sys/net/ipv6/conf/$f/disable_ipv6; done' 2>/dev/null || true
}

holder_alive() {  # holder_alive PID: is PID our holder for this prefix?
    local pid="$1" cmd
    [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
    cmd=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null) || return 1
    [[ "$cmd" =~ ^$MARK-$PREFIX-node[0-9]+\  ]]
}

node_lines() {  # NAME ADDR NETNS PID for each node in the state dir
    local n i pid
    n=$(cat "$STATE/nnodes")
    for ((i = 0; i < n; i++)); do
        pid=$(cat "$STATE/node$i.pid" 2>/dev/null || true)
        printf 'node%d\t%s.%d\t%s-node%d\t%s\n' "$i" "$NET" $((i + 1)) \
            "$PREFIX" "$i" "${pid:--}"
    done
}

start_holder() {  # start_holder I: PID 1 of node I's PID/UTS/mount ns
    local i="$1" ready="$STATE/node$i.ready" u pid t
    # nsenter --net joins the network namespace only, so unshare's
    # parent stays in our mount namespace; the child (PID 1 of the new
    # PID namespace) sets the node up, then execs the reaping loop whose
    # argv[0] marks it as ours.
    setsid nsenter --net="/run/netns/$PREFIX-node$i" \
        unshare --uts --mount --pid --fork --mount-proc \
        --propagation private -- bash -c '
            set -e
            hostname "node$1"
            mount -t tmpfs -o "size=$2,mode=1777" tmpfs /dev/shm
            umount -l /sys
            mount -t sysfs sysfs /sys
            mount --bind "$3/hosts" /etc/hosts
            ip link set lo up
            touch "$4"
            # PID 1: reap orphans (bash waits on SIGCHLD), sleep otherwise
            exec -a "$5" bash -c "trap : CHLD; while :; do sleep 3600 & wait; done"
        ' node-setup "$i" "$SHM_SIZE" "$STATE" "$ready" \
            "$MARK-$PREFIX-node$i" \
        </dev/null >>"$STATE/node$i.log" 2>&1 &
    u=$!
    for ((t = 0; t < 200; t++)); do
        if [ -e "$ready" ]; then
            pid=$(tr -d ' \n' < "/proc/$u/task/$u/children" 2>/dev/null || true)
            if holder_alive "$pid"; then
                echo "$pid" > "$STATE/node$i.pid"
                return 0
            fi
        fi
        kill -0 "$u" 2>/dev/null || break
        sleep 0.05
    done
    die "node$i did not start (log: $STATE/node$i.log: $(tail -3 "$STATE/node$i.log" 2>/dev/null | tr '\n' ' '))"
}

cmd_start() {
    need_root_tools
    [ ${#POS[@]} -eq 1 ] || die "usage: start N [--rate RATE] [--prefix P]"
    local n="${POS[0]}" i ns
    [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] \
        || die "N must be an integer in 1..200 (got '$n')"
    [ -z "$RATE" ] || rate_bits "$RATE" >/dev/null
    if [ -e "$STATE" ] || ip netns list | grep -qE "^$PREFIX-(sw|node[0-9]+)( |\$)"; then
        die "prefix '$PREFIX' is in use: run 'stop --prefix $PREFIX' first"
    fi
    mkdir -p "$STATE"
    # on any failure (or signal) from here on: undo what was made
    trap 'if [ -z "${STARTED:-}" ]; then
              log "start failed; cleaning up"; cmd_stop >/dev/null 2>&1 || true
          fi' EXIT
    trap 'exit 130' INT TERM HUP
    echo "$n" > "$STATE/nnodes"
    echo "${RATE:-none}" > "$STATE/rate"
    { cat /etc/hosts
      echo "# netns-nodes $PREFIX"
      for ((i = 0; i < n; i++)); do echo "$NET.$((i + 1)) node$i"; done
      [ "$HOST_LINK" = 0 ] || echo "$NET.254 $PREFIX-host"
    } > "$STATE/hosts"

    ip netns add "$SW"
    no_ipv6 "$SW"
    ip -n "$SW" link set lo up
    ip -n "$SW" link add br0 type bridge
    ip -n "$SW" link set br0 up
    for ((i = 0; i < n; i++)); do
        ns="$PREFIX-node$i"
        ip netns add "$ns"
        no_ipv6 "$ns"
        ip link add eth0 netns "$ns" type veth peer name "p$i" netns "$SW"
        ip -n "$SW" link set "p$i" master br0
        ip -n "$SW" link set "p$i" up
        ip -n "$ns" addr add "$NET.$((i + 1))/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
        if [ -n "$RATE" ]; then
            shape "$ns" eth0
            shape "$SW" "p$i"
        fi
    done
    if [ "$HOST_LINK" = 1 ]; then
        ip link add "$HLINK" type veth peer name hl netns "$SW"
        ip -n "$SW" link set hl master br0
        ip -n "$SW" link set hl up
        echo 1 > "/proc/sys/net/ipv6/conf/$HLINK/disable_ipv6" 2>/dev/null || true
        ip addr add "$NET.254/24" dev "$HLINK"
        ip link set "$HLINK" up
    fi
    for ((i = 0; i < n; i++)); do start_holder "$i"; done
    STARTED=1
    log "started $n node(s), prefix $PREFIX, subnet $NET.0/24, rate ${RATE:-unshaped}"
    node_lines
}

cmd_stop() {
    need_root_tools
    local f pid t ns
    if [ -d "$STATE" ]; then
        for f in "$STATE"/node*.pid; do
            [ -e "$f" ] || continue
            pid=$(cat "$f" 2>/dev/null || true)
            # SIGKILL to PID 1 of a PID namespace kills all its processes
            if holder_alive "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
        done
        for f in "$STATE"/node*.pid; do
            [ -e "$f" ] || continue
            pid=$(cat "$f" 2>/dev/null || true)
            for ((t = 0; t < 100; t++)); do
                holder_alive "$pid" || break
                sleep 0.05
            done
        done
    fi
    # holders whose pid was never written (a start killed half-way)
    for f in /proc/[0-9]*/cmdline; do
        pid="${f#/proc/}"; pid="${pid%/cmdline}"
        if holder_alive "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
    done
    ip link del "$HLINK" 2>/dev/null || true
    for ns in $(ip netns list | awk '{print $1}' | grep -E "^$PREFIX-(sw|node[0-9]+)\$" || true); do
        ip netns del "$ns" 2>/dev/null || log "could not delete netns $ns"
    done
    rm -rf "$STATE"
    log "stopped prefix $PREFIX"
}

cmd_rate() {
    need_root_tools
    [ ${#POS[@]} -eq 1 ] || die "usage: rate RATE|none [--prefix P]"
    [ -e "$STATE/nnodes" ] || die "prefix '$PREFIX' is not started"
    local n i
    RATE="${POS[0]}"
    [ "$RATE" = none ] || rate_bits "$RATE" >/dev/null
    n=$(cat "$STATE/nnodes")
    for ((i = 0; i < n; i++)); do
        if [ "$RATE" = none ]; then
            tc -n "$PREFIX-node$i" qdisc del dev eth0 root 2>/dev/null || true
            tc -n "$SW" qdisc del dev "p$i" root 2>/dev/null || true
        else
            shape "$PREFIX-node$i" eth0
            shape "$SW" "p$i"
        fi
    done
    echo "$RATE" > "$STATE/rate"
    log "prefix $PREFIX: links shaped to $RATE"
}

node_index() {
    local node="$1" n
    n=$(cat "$STATE/nnodes")
    node="${node#node}"
    [[ "$node" =~ ^[0-9]+$ ]] && [ "$node" -lt "$n" ] \
        || die "no node '$1' (prefix $PREFIX has node0..node$((n - 1)))"
    echo "$node"
}

cmd_exec() {
    need_root_tools
    [ ${#POS[@]} -ge 2 ] || die "usage: exec [--prefix P] NODE CMD [ARGS...]"
    [ -e "$STATE/nnodes" ] || die "prefix '$PREFIX' is not started"
    local i pid
    i=$(node_index "${POS[0]}")
    pid=$(cat "$STATE/node$i.pid" 2>/dev/null || true)
    holder_alive "$pid" || die "node$i of prefix '$PREFIX' is down (holder pid ${pid:-?} gone); stop and start again"
    # nsenter forks into the PID namespace; setpriv makes the command die
    # with nsenter, so killing this pid kills the command
    exec nsenter -t "$pid" --net --uts --mount --pid --wd="$PWD" -- \
        setpriv --pdeathsig KILL -- "${POS[@]:1}"
}

cmd_status() {
    need_root_tools
    [ -e "$STATE/nnodes" ] || { log "prefix '$PREFIX' is not started"; exit 1; }
    local ok=0 i n pid
    n=$(cat "$STATE/nnodes")
    for ((i = 0; i < n; i++)); do
        pid=$(cat "$STATE/node$i.pid" 2>/dev/null || true)
        holder_alive "$pid" || { log "node$i is down"; ok=1; }
    done
    log "prefix $PREFIX: $n node(s), subnet $NET.0/24, rate $(cat "$STATE/rate")"
    node_lines
    return $ok
}

"cmd_$CMD"
