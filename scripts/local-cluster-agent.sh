#!/bin/sh
# OpenMPI's remote agent for the local cluster (scripts/local-cluster.sh; OMPI_MCA_plm_rsh_agent):
# called as ssh would be, `AGENT [OPTIONS] HOST COMMAND...`, it skips ssh-style options, enters
# HOST's network namespace with a host name of its own (a UTS namespace) and runs COMMAND as ssh's
# remote side does (its words joined, through a shell).
#
# It plays ssh's part to the end: it stays the launcher's child while COMMAND runs, passes on the
# signals it gets, and exits with COMMAND's status (or, when COMMAND's session was killed by a signal
# it did not pass on, with a line naming HOST and 255, as ssh when the remote side's session dies).
# Like ssh with ServerAliveInterval and ServerAliveCountMax, it gives up on a host it cannot reach:
# when HOST's link has been down for 2 s (4 looks, 0.5 s apart) it kills COMMAND's session (as sshd
# ends the session of a client it lost: the daemon and its ranks) and exits 255, which mpirun takes
# for a lost daemon and ends the job. That must come before any rank's own --comm-timeout ends it:
# once mpirun is ending a job it ignores its agents, and waits for the silent host's daemon until TCP
# gives up (many minutes; OpenMPI's keepalives do not fire while it has unacknowledged data for the
# host).
# A host whose link is down when the agent is called is refused at once, as ssh's connection would
# fail (pipesgdrun --min-np probes the hosts so). PIPESGD_AGENT_ALIVE_INTERVAL /
# PIPESGD_AGENT_ALIVE_COUNT override 0.5 and 4.
while [ $# -gt 0 ]; do
  case $1 in
    -[1246AaCfGgKkMNnqsTtVvXxYy]*) shift ;;  # ssh's options without a value
    -[BbcDEeFIiJLlmOopQRSWw]) shift 2 ;;     # ssh's options with a value
    -*) shift ;;
    *) break ;;
  esac
done
if [ $# -lt 2 ]; then
  echo "local-cluster-agent: usage: local-cluster-agent.sh HOST COMMAND..." >&2
  exit 255
fi
host=$1
shift
case $host in
  h[0-9]*) ;;
  *) echo "local-cluster-agent: '$host' is not a host of the local cluster (h1, h2, ...)" >&2; exit 255 ;;
esac
if ! ip netns list 2>/dev/null | awk '{ print $1 }' | grep -qx "pipesgd-$host"; then
  echo "local-cluster-agent: no host '$host' (scripts/local-cluster.sh up --hosts N makes h1..hN)" >&2
  exit 255
fi
interval=${PIPESGD_AGENT_ALIVE_INTERVAL:-0.5}
count=${PIPESGD_AGENT_ALIVE_COUNT:-4}
link=/sys/class/net/pipesgd-$host/operstate
# As ssh fails to connect to a host it cannot reach: nothing starts on a host whose link is down.
if [ "$(cat "$link" 2>/dev/null)" != up ]; then
  echo "local-cluster-agent: cannot reach host $host (its link is down)" >&2
  exit 255
fi

# shellcheck disable=SC2016  # expanded by the inner shell
# A session of its own (setsid): what COMMAND starts (OpenMPI's daemon, the ranks) can be ended with it.
ip netns exec "pipesgd-$host" unshare --uts setsid sh -c 'hostname "$1" && shift && exec sh -c "$*"' sh "$host" "$@" &
child=$!
passed_on=
for signal in HUP INT TERM USR1 USR2; do
  # shellcheck disable=SC2064  # the signal's name now, the child's id now
  trap "passed_on=$signal; kill -$signal $child 2>/dev/null" "$signal"
done
missed=0
while kill -0 "$child" 2>/dev/null; do
  if [ "$(cat "$link" 2>/dev/null)" = up ]; then
    missed=0
  else
    missed=$((missed + 1))
    if [ "$missed" -ge "$count" ]; then
      echo "local-cluster-agent: lost host $host (its link is down: $missed looks, $interval s apart)" >&2
      # As sshd ends a session whose client is gone: every process of it.
      pkill -KILL -s "$child" 2>/dev/null || kill -KILL "$child" 2>/dev/null
      exit 255
    fi
  fi
  sleep "$interval" &
  wait $! 2>/dev/null
done
wait "$child"
status=$?
# A session killed under it (the host's processes ended, not by a signal it passed on): as ssh says
# "Connection to HOST closed by remote host." and exits 255, so mpirun's report of a lost agent
# (OpenMPI's "ORTE was unable to reliably start one or more daemons", which names no host) comes
# with a line that does.
if [ "$status" -gt 128 ] && [ -z "$passed_on" ]; then
  echo "local-cluster-agent: connection to host $host closed (its session was killed by signal $((status - 128)))" >&2
  exit 255
fi
exit "$status"
