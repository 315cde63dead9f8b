# Emulated multi-host networks for scripts/test-netns.sh (sourced; needs root).
#
# Topology: NET_HOSTS "host" namespaces ${NET_PREFIX}h<i>, each with one veth "eth0"
# (10.213.<i>.2/24, default route via 10.213.<i>.1), the other end "r<i>" in one
# router namespace ${NET_PREFIX}rt (10.213.<i>.1/24, IPv4 forwarding on) -- so every
# byte between two hosts crosses two veths and the router's FORWARD path, where the
# faults are injected. A loopback namespace ${NET_PREFIX}lo (lo only) holds the
# reference runs. Only addresses, routes, qdiscs and iptables rules INSIDE these
# namespaces are touched; the host's own interfaces, routes and firewall are not.
# net_teardown deletes everything (call it from a trap on EXIT).
#
# Shaping (one at a time, net_clear_shaping removes it):
#   net_delay MS JITTER_MS   netem on the router's interfaces where the kernel has it,
#                            else tests/net/nfq_shaper behind an NFQUEUE rule in the
#                            router's FORWARD chain
#   net_loss PERCENT         netem loss, else nfq_shaper --loss
#   net_bandwidth RATE       tbf on both ends of every link (host egress and router egress)
# Each sets NET_MECHANISM to a sentence naming what it used.
# Faults: net_partition HOST (its link down), net_reconnect HOST, net_kill_host HOST
# (SIGKILL to every process in its namespace).
# shellcheck shell=bash

NET_HOSTS=${NET_HOSTS:-4}
NET_PREFIX=${NET_PREFIX:-fm$$}
NET_SHAPER=${NET_SHAPER:-}         # path of nfq_shaper (needed where netem is missing)
NET_WORK=${NET_WORK:-/tmp}         # where the shaper's output goes
NET_NAMESPACES=()
NET_SHAPER_PID=
NET_SHAPER_REPORT=
NET_MECHANISM=
NET_HAVE_NETEM=

net_host() { echo "${NET_PREFIX}h$1"; }
net_router() { echo "${NET_PREFIX}rt"; }
net_loopback() { echo "${NET_PREFIX}lo"; }
net_address() { echo "10.213.$1.2"; }

# net_unavailable: says why network namespaces cannot be made here (nothing when they can).
net_unavailable() {
  local probe=${NET_PREFIX}probe
  if ip netns add "$probe" 2>"$NET_WORK/netns-error"; then
    ip netns del "$probe"
  else
    echo "cannot create a network namespace: $(tr -d '\n' <"$NET_WORK/netns-error")"
  fi
}

# net_setup: creates the namespaces and links (run it under set -e).
net_setup() {
  local router i host
  router=$(net_router)
  ip netns add "$router"
  NET_NAMESPACES+=("$router")
  ip netns exec "$router" sysctl -qw net.ipv4.ip_forward=1
  ip -n "$router" link set lo up
  for ((i = 0; i < NET_HOSTS; i++)); do
    host=$(net_host "$i")
    ip netns add "$host"
    NET_NAMESPACES+=("$host")
    # Unique names while both ends are in the root namespace, plain ones inside.
    ip link add "${NET_PREFIX}a$i" type veth peer name "${NET_PREFIX}b$i"
    ip link set "${NET_PREFIX}a$i" netns "$host"
    ip link set "${NET_PREFIX}b$i" netns "$router"
    ip -n "$host" link set "${NET_PREFIX}a$i" name eth0
    ip -n "$router" link set "${NET_PREFIX}b$i" name "r$i"
    ip -n "$host" addr add "$(net_address "$i")/24" dev eth0
    ip -n "$router" addr add "10.213.$i.1/24" dev "r$i"
    ip -n "$host" link set lo up
    ip -n "$host" link set eth0 up
    ip -n "$router" link set "r$i" up
    ip -n "$host" route add default via "10.213.$i.1"
  done
  ip netns add "$(net_loopback)"
  NET_NAMESPACES+=("$(net_loopback)")
  ip -n "$(net_loopback)" link set lo up
  # Whether this kernel has netem (CONFIG_NET_SCH_NETEM): try it once on r0.
  if ip netns exec "$router" tc qdisc add dev r0 root netem delay 1ms 2>"$NET_WORK/netem-error"; then
    ip netns exec "$router" tc qdisc del dev r0 root
    NET_HAVE_NETEM=1
  fi
}

# net_netem_status: one line saying whether netem is used, and why not.
net_netem_status() {
  if [ -n "$NET_HAVE_NETEM" ]; then
    echo "netem qdisc: available, used for delay and loss"
  else
    echo "netem qdisc: NOT available in this kernel ($(tr -d '\n' <"$NET_WORK/netem-error")):" \
         "delay and loss are emulated by nfq_shaper (NFQUEUE)"
  fi
}

net_teardown() {
  local ns
  net_clear_shaping >/dev/null 2>&1 || true
  for ns in "${NET_NAMESPACES[@]}"; do
    # Our rank processes still in it (a failed run), then the namespace and its veths.
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  NET_NAMESPACES=()
}

# net_router_qdisc VERB ARGS...: "tc qdisc VERB dev r<i> ARGS..." in the router, every link.
net_router_qdisc() {
  local i verb=$1
  shift
  for ((i = 0; i < NET_HOSTS; i++)); do ip netns exec "$(net_router)" tc qdisc "$verb" dev "r$i" "$@"; done
}

# net_start_shaper ARGS...: nfq_shaper on queue 0 in the router, then the rule.
net_start_shaper() {
  [ -n "$NET_SHAPER" ] && [ -x "$NET_SHAPER" ] ||
    { echo "nfq_shaper was not built (libnetfilter-queue-dev missing at configure time)" >&2; return 1; }
  command -v iptables >/dev/null || { echo "iptables is not installed" >&2; return 1; }
  : >"$NET_WORK/shaper.out"
  ip netns exec "$(net_router)" "$NET_SHAPER" --queue 0 "$@" >"$NET_WORK/shaper.out" 2>&1 &
  NET_SHAPER_PID=$!
  local waited
  for ((waited = 0; waited < 100; waited++)); do
    grep -q '^ready' "$NET_WORK/shaper.out" && break
    kill -0 "$NET_SHAPER_PID" 2>/dev/null || break
    sleep 0.05
  done
  grep -q '^ready' "$NET_WORK/shaper.out" ||
    { echo "nfq_shaper did not start: $(cat "$NET_WORK/shaper.out")" >&2; return 1; }
  ip netns exec "$(net_router)" iptables -A FORWARD -j NFQUEUE --queue-num 0
}

# net_stop_shaper: removes the rule, stops the shaper; its last line (the counts) goes to
# NET_SHAPER_REPORT (empty when no shaper ran).
net_stop_shaper() {
  NET_SHAPER_REPORT=
  [ -n "$NET_SHAPER_PID" ] || return 0
  ip netns exec "$(net_router)" iptables -F FORWARD 2>/dev/null || true
  kill -TERM "$NET_SHAPER_PID" 2>/dev/null || true
  local waited
  for ((waited = 0; waited < 100; waited++)); do
    kill -0 "$NET_SHAPER_PID" 2>/dev/null || break
    sleep 0.05
  done
  kill -KILL "$NET_SHAPER_PID" 2>/dev/null || true
  wait "$NET_SHAPER_PID" 2>/dev/null || true
  NET_SHAPER_PID=
  NET_SHAPER_REPORT=$(grep '^nfq_shaper:' "$NET_WORK/shaper.out" || true)
}

net_delay() {
  if [ -n "$NET_HAVE_NETEM" ]; then
    net_router_qdisc add root netem delay "${1}ms" "${2}ms"
    NET_MECHANISM="netem delay ${1}ms ${2}ms on the router's 4 egress interfaces"
  else
    net_start_shaper --delay-ms "$1" --jitter-ms "$2" --seed 16
    NET_MECHANISM="nfq_shaper ${1} ms +- ${2} ms (uniform, order kept per flow), NFQUEUE in the router's FORWARD chain"
  fi
}

net_loss() {
  if [ -n "$NET_HAVE_NETEM" ]; then
    net_router_qdisc add root netem loss "${1}%"
    NET_MECHANISM="netem loss ${1}% on the router's 4 egress interfaces"
  else
    net_start_shaper --loss "$(awk -v p="$1" 'BEGIN { print p / 100 }')" --seed 16
    NET_MECHANISM="nfq_shaper loss ${1}% (no delay), NFQUEUE in the router's FORWARD chain"
  fi
}

# Both directions of every link: tbf on the router's egress and on each host's.
net_bandwidth() {
  local i
  net_router_qdisc add root tbf rate "$1" burst 64kb latency 100ms
  for ((i = 0; i < NET_HOSTS; i++)); do
    ip netns exec "$(net_host "$i")" tc qdisc add dev eth0 root tbf rate "$1" burst 64kb latency 100ms
  done
  NET_MECHANISM="tbf rate $1 on both ends of every host's link"
}

# net_shaping_drops: packets the shaping dropped (netem's or the shaper's count).
net_shaping_drops() {
  if [ -n "$NET_HAVE_NETEM" ]; then
    local i
    for ((i = 0; i < NET_HOSTS; i++)); do ip netns exec "$(net_router)" tc -s qdisc show dev "r$i"; done |
      awk '/dropped/ { sub(",", "", $7); n += $7 } END { print n + 0 }'
  else
    sed -n 's/.* \([0-9]*\) dropped .*/\1/p' "$NET_WORK/shaper.out" | tail -n 1
  fi
}

net_clear_shaping() {
  local i
  net_stop_shaper
  net_router_qdisc del root 2>/dev/null || true
  for ((i = 0; i < NET_HOSTS; i++)); do
    ip netns exec "$(net_host "$i")" tc qdisc del dev eth0 root 2>/dev/null || true
  done
  NET_MECHANISM=
}

net_partition() { ip -n "$(net_host "$1")" link set eth0 down; }
net_reconnect() {
  ip -n "$(net_host "$1")" link set eth0 up
  ip -n "$(net_host "$1")" route replace default via "10.213.$1.1"
}
net_kill_host() { ip netns pids "$(net_host "$1")" | xargs -r kill -KILL; }
