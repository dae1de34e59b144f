#!/usr/bin/env bash
# A real small cluster on this machine: N hosts as network namespaces, each with its own network
# stack, address, host name and shaped link, on one bridge. OpenMPI launches into them through its
# remote-agent setting (scripts/local-cluster-agent.sh), so `mpirun -H h1:1,h2:1 ...` and
# `pipesgdrun -np 2 -H h1:1,h2:1 ...` run unchanged across real TCP links.
#
#   scripts/local-cluster.sh up [--hosts N] [--rate R]   make (or resize, or reshape) the cluster
#   scripts/local-cluster.sh down                         remove everything `up` made, and only that
#   scripts/local-cluster.sh status                       what is up (exit 1 when nothing is)
#   eval "$(scripts/local-cluster.sh env)"                OpenMPI's settings for launching into the hosts
#   scripts/local-cluster.sh exec HOST COMMAND...         run a command on a host (its name, its network)
#   scripts/local-cluster.sh link HOST down|up            cut or restore a host's link (a partition)
#   scripts/local-cluster.sh rate HOST R                  reshape one host's link (a straggler)
#   scripts/local-cluster.sh kill HOST                    SIGKILL every process of a host (a dead host)
#
# Hosts are h1..hN at 10.88.0.11.., the bridge pipesgd-br0 at 10.88.0.1 (the launching side: mpirun
# runs in this namespace). A host's link is shaped both ways with tbf at R (1gbit, 10gbit, any tc
# rate); the kernel adds no delay (no netem here), so latency is the stack's own. The hosts have
# no route but the bridge's subnet: no traffic leaves this machine's own namespaces. Host names go to
# /etc/hosts between marker lines; the namespaces are pipesgd-h1.., the host-side links pipesgd-h1..
# (in the root namespace). Needs root (and a kernel that permits network namespaces).
set -euo pipefail

readonly SUBNET=10.88.0
readonly BRIDGE=pipesgd-br0
readonly NS_PREFIX=pipesgd-
readonly STATE_DIR=/run/pipesgd-local-cluster
readonly HOSTS_BEGIN="# pipesgd local-cluster begin (scripts/local-cluster.sh down removes this block)"
readonly HOSTS_END="# pipesgd local-cluster end"
readonly MAX_HOSTS=32
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly AGENT=$HERE/local-cluster-agent.sh

die() { echo "local-cluster: $*" >&2; exit 2; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }

host_address() { echo "$SUBNET.$((10 + $1))"; }
namespace_of() { echo "$NS_PREFIX$1"; }

require_root() {
  [ "$(id -u)" -eq 0 ] || die "must run as root (it makes network namespaces, links and /etc/hosts entries)"
  command -v ip >/dev/null || die "ip (iproute2) not found"
  command -v tc >/dev/null || die "tc (iproute2) not found"
  command -v unshare >/dev/null || die "unshare (util-linux) not found"
}

# The hosts that exist now (namespaces named pipesgd-h<N>), in order.
current_hosts() {
  ip netns list 2>/dev/null | awk '{ print $1 }' | sed -n "s/^${NS_PREFIX}\(h[0-9][0-9]*\)\$/\1/p" | sort -V
}

valid_rate() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?([kmgt]?bit|[kmgt]?bps)$ ]]; }

# tbf's bucket: 10 ms of traffic at the rate, at least 64 KiB. Sustained transfers then run at the
# rate (a 1 ms bucket, or a peak rate, halved the ring allreduce's throughput here: 42 ms an mlp
# D-Sync iteration at 1gbit instead of 23), but after an idle spell up to one bucket (1.25 MB at
# 1gbit) leaves at the stack's speed, faster than a real link would carry it.
burst_for() {
  local rate=$1 number unit bits
  number=$(sed 's/[a-z]*$//' <<<"$rate")
  unit=$(sed 's/^[0-9.]*//' <<<"$rate")
  case $unit in
    bit) bits=1 ;; kbit) bits=1e3 ;; mbit) bits=1e6 ;; gbit) bits=1e9 ;; tbit) bits=1e12 ;;
    bps) bits=8 ;; kbps) bits=8e3 ;; mbps) bits=8e6 ;; gbps) bits=8e9 ;; tbps) bits=8e12 ;;
  esac
  awk -v n="$number" -v b="$bits" 'BEGIN { x = n * b / 8 / 100; if (x < 65536) x = 65536; printf "%d", x }'
}

shape() {  # shape HOST RATE: both directions of HOST's link
  local host=$1 rate=$2 burst
  burst=$(burst_for "$rate")
  tc qdisc replace dev "$NS_PREFIX$host" root tbf rate "$rate" burst "$burst" latency 400ms
  ip netns exec "$(namespace_of "$host")" tc qdisc replace dev eth0 root tbf rate "$rate" burst "$burst" latency 400ms
}

# The /etc/hosts block for hosts h1..hN (replaces any previous block).
write_hosts_file() {
  local count=$1 tmp i
  tmp=$(mktemp /etc/.hosts.pipesgd.XXXXXX)
  awk -v b="$HOSTS_BEGIN" -v e="$HOSTS_END" '$0 == b { skip = 1 } !skip { print } $0 == e { skip = 0 }' /etc/hosts >"$tmp"
  if [ "$count" -gt 0 ]; then
    {
      echo "$HOSTS_BEGIN"
      for ((i = 1; i <= count; i++)); do echo "$(host_address "$i") h$i"; done
      echo "$HOSTS_END"
    } >>"$tmp"
  fi
  chmod 644 "$tmp"
  # /etc/hosts may be a bind mount (containers): overwrite its contents rather than rename over it.
  cat "$tmp" >/etc/hosts
  rm -f "$tmp"
}

make_host() {  # make_host INDEX RATE
  local i=$1 rate=$2 host ns
  host=h$i
  ns=$(namespace_of "$host")
  ip netns add "$ns" || die "cannot create network namespace $ns (are network namespaces permitted here?)"
  ip link add "$NS_PREFIX$host" type veth peer name "eth0" netns "$ns"
  ip link set "$NS_PREFIX$host" master "$BRIDGE"
  ip link set "$NS_PREFIX$host" up
  ip netns exec "$ns" ip addr add "$(host_address "$i")/24" dev eth0
  ip netns exec "$ns" ip link set eth0 up
  ip netns exec "$ns" ip link set lo up
  shape "$host" "$rate"
}

remove_host() {
  local host=$1
  # A host's processes die with it (the namespace would otherwise live on while they run).
  kill_host "$host" quiet
  ip link del "$NS_PREFIX$host" 2>/dev/null || true
  ip netns del "$(namespace_of "$host")" 2>/dev/null || true
}

kill_host() {  # kill_host HOST [quiet]: SIGKILL every process in HOST's namespace; prints how many
  local host=$1 pids
  pids=$(ip netns pids "$(namespace_of "$host")" 2>/dev/null || true)
  if [ -n "$pids" ]; then
    # shellcheck disable=SC2086  # one id per word
    kill -KILL $pids 2>/dev/null || true
  fi
  [ "${2:-}" = quiet ] || echo "killed $(wc -w <<<"$pids") process(es) on $host"
}

check_subnet_free() {
  local users
  users=$(ip -4 -o addr show | awk -v s="$SUBNET." -v b="$BRIDGE" 'index($4, s) == 1 && $2 != b { print $2 }')
  [ -z "$users" ] || die "subnet $SUBNET.0/24 is already used by interface(s) $users of this machine; not touching it"
}

cmd_up() {
  local hosts=2 rate=1gbit
  while [ $# -gt 0 ]; do
    case $1 in
      --hosts) [ $# -ge 2 ] || die "--hosts needs a value"; hosts=$2; shift 2 ;;
      --hosts=*) hosts=${1#--hosts=}; shift ;;
      --rate) [ $# -ge 2 ] || die "--rate needs a value"; rate=$2; shift 2 ;;
      --rate=*) rate=${1#--rate=}; shift ;;
      *) die "up: unknown argument '$1' (usage: up [--hosts N] [--rate R])" ;;
    esac
  done
  [[ $hosts =~ ^[0-9]+$ ]] && [ "$hosts" -ge 1 ] && [ "$hosts" -le $MAX_HOSTS ] ||
    die "--hosts must be a whole number from 1 to $MAX_HOSTS, not '$hosts'"
  valid_rate "$rate" || die "--rate must be a tc rate such as 1gbit, 10gbit or 500mbit, not '$rate'"
  require_root
  # Namespaces permitted at all? (Refuse before making anything.)
  if ! ip netns list >/dev/null 2>&1 || ! unshare --net true 2>/dev/null; then
    die "network namespaces are not permitted here (unshare --net failed)"
  fi
  check_subnet_free
  mkdir -p "$STATE_DIR"
  exec 9>"$STATE_DIR/lock"
  flock -w 60 9 || die "another local-cluster.sh is changing the cluster (lock $STATE_DIR/lock)"
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
    ip addr add "$SUBNET.1/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
  fi
  local i host made=0 reshaped=0 removed=0
  for ((i = 1; i <= hosts; i++)); do
    host=h$i
    if ip netns list | awk '{ print $1 }' | grep -qx "$(namespace_of "$host")"; then
      shape "$host" "$rate"
      reshaped=$((reshaped + 1))
    else
      make_host "$i" "$rate"
      made=$((made + 1))
    fi
  done
  for host in $(current_hosts); do
    if [ "${host#h}" -gt "$hosts" ]; then
      remove_host "$host"
      removed=$((removed + 1))
    fi
  done
  write_hosts_file "$hosts"
  echo "$hosts $rate" >"$STATE_DIR/cluster"
  echo "local cluster up: $hosts host(s) h1..h$hosts on $BRIDGE ($SUBNET.0/24), links $rate" \
       "($made made, $reshaped kept, $removed removed)"
  echo "launch into it: eval \"\$($0 env)\"; mpirun -H h1:1,h2:1 ..."
}

cmd_down() {
  [ $# -eq 0 ] || die "down takes no arguments"
  require_root
  mkdir -p "$STATE_DIR"
  exec 9>"$STATE_DIR/lock"
  flock -w 60 9 || die "another local-cluster.sh is changing the cluster (lock $STATE_DIR/lock)"
  local host count=0
  for host in $(current_hosts); do
    remove_host "$host"
    count=$((count + 1))
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  write_hosts_file 0
  rm -f "$STATE_DIR/cluster"
  echo "local cluster down: $count host(s) removed"
}

cmd_status() {
  [ $# -eq 0 ] || die "status takes no arguments"
  local hosts
  hosts=$(current_hosts)
  if [ -z "$hosts" ]; then
    echo "local cluster: down"
    return 1
  fi
  local host rate procs
  echo "local cluster: $(wc -w <<<"$hosts") host(s) on $BRIDGE ($SUBNET.0/24)"
  for host in $hosts; do
    rate=$(tc qdisc show dev "$NS_PREFIX$host" 2>/dev/null | sed -n 's/.* rate \([^ ]*\) .*/\1/p' | head -1)
    procs=$(ip netns pids "$(namespace_of "$host")" 2>/dev/null | wc -l)
    printf '  %-4s %s  link %s, %s  %s process(es)\n' "$host" "$(host_address "${host#h}")" \
      "$(cat "/sys/class/net/$NS_PREFIX$host/operstate" 2>/dev/null || echo missing)" "${rate:-unshaped}" "$procs"
  done
}

# OpenMPI's settings: its remote agent enters the hosts and stays attached to each host's daemon (as
# an ssh session would, instead of the daemon detaching), so that the agent's keepalive can report a
# host that cannot be reached (local-cluster-agent.sh); its daemons and ranks talk over the bridge's
# subnet only (TCP between hosts, shared memory within one); and mpirun's own TCP keepalives notice a
# silent daemon within about 10 s (5 s idle, then 5 probes 1 s apart) instead of OpenMPI's default 8
# minutes. A daemon whose first connection back to mpirun fails tries again 1 s later, up to 10 times
# (as ssh's ConnectionAttempts would), instead of OpenMPI's default of no second attempt
# (oob_tcp_retry_delay 0): with that default one failed connect, on a loaded machine right after a
# partition healed, ended a launch with "ORTE was unable to reliably start one or more daemons".
cmd_env() {
  [ $# -eq 0 ] || die "env takes no arguments"
  cat <<EOF
export OMPI_MCA_plm_rsh_agent=$AGENT
export OMPI_MCA_plm_rsh_no_tree_spawn=1
export OMPI_MCA_orte_leave_session_attached=1
export OMPI_MCA_oob_tcp_if_include=$SUBNET.0/24
export OMPI_MCA_btl_tcp_if_include=$SUBNET.0/24
export OMPI_MCA_btl=tcp,vader,self
export OMPI_MCA_oob_tcp_keepalive_time=5
export OMPI_MCA_oob_tcp_keepalive_intvl=1
export OMPI_MCA_oob_tcp_keepalive_probes=5
export OMPI_MCA_oob_tcp_retry_delay=1
export OMPI_MCA_oob_tcp_max_recon_attempts=10
EOF
}

existing_host() {
  [[ ${1:-} =~ ^h[0-9]+$ ]] && ip netns list 2>/dev/null | awk '{ print $1 }' | grep -qx "$(namespace_of "$1")" ||
    die "no host '${1:-}' in the local cluster (status lists them)"
}

cmd_exec() {
  [ $# -ge 2 ] || die "usage: exec HOST COMMAND..."
  existing_host "$1"
  exec "$AGENT" "$1" "$(printf '%q ' "${@:2}")"
}

cmd_link() {
  [ $# -eq 2 ] && { [ "$2" = down ] || [ "$2" = up ]; } || die "usage: link HOST down|up"
  require_root
  existing_host "$1"
  ip link set "$NS_PREFIX$1" "$2"
  echo "$1: link $2"
}

cmd_rate() {
  [ $# -eq 2 ] || die "usage: rate HOST R"
  valid_rate "$2" || die "rate must be a tc rate such as 1gbit or 1mbit, not '$2'"
  require_root
  existing_host "$1"
  shape "$1" "$2"
  echo "$1: link shaped to $2"
}

cmd_kill() {
  [ $# -eq 1 ] || die "usage: kill HOST"
  require_root
  existing_host "$1"
  kill_host "$1"
}

[ $# -ge 1 ] || { usage >&2; exit 2; }
command=$1
shift
case $command in
  up) cmd_up "$@" ;;
  down) cmd_down "$@" ;;
  status) cmd_status "$@" ;;
  env) cmd_env "$@" ;;
  exec) cmd_exec "$@" ;;
  link) cmd_link "$@" ;;
  rate) cmd_rate "$@" ;;
  kill) cmd_kill "$@" ;;
  -h|--help|help) usage ;;
  *) die "unknown command '$command' (up, down, status, env, exec, link, rate, kill; --help)" ;;
esac
