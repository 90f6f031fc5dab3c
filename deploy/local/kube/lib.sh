# shellcheck shell=bash
# Process helpers shared by up.sh (etcd, kube-apiserver) and node-up.sh
# (containerd's neighbours: controller-manager, scheduler, kubelet); sourced,
# not run. The sourcing script sets RUN (pid files) and LOGS (one log per
# process) first.

# alive NAME: pid file present and the pid is a running NAME process (the
# kernel keeps the first 15 characters of a name in /proc/PID/comm).
alive() {
  local pid
  pid=$(cat "$RUN/$1.pid" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "${1:0:15}" ]]
}

# start NAME COMMAND...: detached (own session), output appended to
# $LOGS/NAME.log, pid written by the process itself to $RUN/NAME.pid.
start() {
  local name=$1; shift
  rm -f "$RUN/$name.pid"
  printf '\n==== %s start %s\n' "$(date -Is)" "$name" >> "$LOGS/$name.log"
  # shellcheck disable=SC2016  # $$ and $@ are for the inner bash
  setsid bash -c 'echo $$ > "$1"; shift; exec "$@"' _ "$RUN/$name.pid" "$@" \
    >> "$LOGS/$name.log" 2>&1 < /dev/null 9>&- &   # 9>&-: do not hold the state lock
  for _ in $(seq 50); do [[ -s $RUN/$name.pid ]] && break; sleep 0.1; done
  # The shell writes the pid file before it execs NAME: wait for the exec
  # (or the end of the process), so that `alive`, which checks the name in
  # /proc/PID/comm, does not take the shell for a process that exited.
  local pid
  pid=$(cat "$RUN/$name.pid" 2>/dev/null) || true
  for _ in $(seq 100); do
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == bash ]] || break
    sleep 0.05
  done
}
