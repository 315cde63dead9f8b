#!/usr/bin/env bash
# Multi-host runs over emulated networks with injected faults (root; what CI runs as).
#
# Four network namespaces ("hosts") joined through a router namespace by veth pairs
# (tests/net/netns.sh), one rank per host (build/tests/net/net_rank) over UCX TCP
# (UCX_TLS=tcp,self, UCX_NET_DEVICES=eth0), so every byte crosses a real network stack.
#   reference  the same 4 ranks in one namespace on loopback
#   plain      the hosts, nothing injected
#   (a) delay  20 ms +- 5 ms per packet     (netem, or tests/net/nfq_shaper where the kernel lacks it)
#   (b) loss   1% of the packets            (netem, or nfq_shaper)
#   (c) rate   100 Mbit/s on every link     (tbf)
# Each runs all_reduce, ring_shift, the ring contrastive loss (forward + backward) and a few
# cyclic DELAY1 training steps; each rank checks its results against its own reference and
# prints a hash of them, which must be bitwise the loopback run's. Probes prove the shaping
# is real (latency under (a), bandwidth under (c), drops under (b)), and bench/ring_rank's
# measurement gives the ring loss step time and the fraction of transfer hidden behind compute.
#   (d) partition  a host's link goes down while an operation runs
#   (e) kill       every process of a host is SIGKILLed while an operation runs
# For each operation: every surviving rank must fail within its timeout (3 s + slack) with a
# message naming the operation and the peer it waited for (the lost rank, or a rank that itself
# waits for it: at least one survivor must name the lost rank), then destroy its handles and
# communicator cleanly; the partitioned rank too; no hang (every rank has a hard deadline). Namespaces and rules are removed on exit, even on failure.
#
# Usage: bash scripts/test-netns.sh [BUILD_DIR]   (default build/, a Release build)
# Exit: 0 passed, 1 failed, 77 skipped (no root / no network namespaces here: "SKIPPED: why").
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
source "$FLATMEM_ROOT/tests/net/netns.sh"

fail() { echo "test-netns: FAIL: $*" >&2; exit 1; }
skip() { echo "test-netns: SKIPPED: $*"; exit 77; }

build=$(cd "${1:-$FLATMEM_ROOT/build}" 2>/dev/null && pwd) || fail "no build folder ${1:-build}"
net_rank=$build/tests/net/net_rank
NET_SHAPER=$build/tests/net/nfq_shaper
[ -x "$net_rank" ] || fail "$net_rank is missing (a build with UCX: cmake --build $build)"
[ "$(id -u)" = 0 ] || skip "needs root for network namespaces"
command -v ip >/dev/null && command -v tc >/dev/null || fail "iproute2 (ip, tc) is not installed"

hosts=$NET_HOSTS
timeout_ms=3000          # the communicators' timeout in the fault runs
slack=2.0                # seconds allowed beyond it (scheduling on 2 busy cores)
check_deadline=120       # hard limit of one rank in a check run, seconds
fault_deadline=60        # ... in a fault run
# Ring loss measurements (global batch, d, timed steps): transfer-bound, and compute-bound on loopback.
# shellcheck disable=SC2054
measures=(2048,256,2 8192,128,2)
NET_WORK=$(mktemp -d /tmp/flatmem-netns.XXXXXX)
port=29500               # a new coordinator port per run (no TIME_WAIT clashes)
pids=()

cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  net_teardown
  rm -rf "$NET_WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step "network: $hosts hosts behind a router (namespaces ${NET_PREFIX}*)"
why=$(net_unavailable)
[ -z "$why" ] || skip "$why"
net_setup
echo "hosts: $(for ((i = 0; i < hosts; i++)); do printf '%s=%s ' "$(net_host "$i")" "$(net_address "$i")"; done)"
net_netem_status

# launch RUN RANK NS DEVICE COORDINATOR TIMEOUT_MS DEADLINE ARGS...: one rank in the background.
launch() {
  local run=$1 rank=$2 ns=$3 device=$4 coordinator=$5 timeout=$6 deadline=$7
  shift 7
  # In a subshell of its own (which outlives a killed host and exits 137 then), so that
  # bash prints no "Killed" notice: the exit codes are checked instead.
  (
    ip netns exec "$ns" env UCX_TLS=tcp,self UCX_NET_DEVICES="$device" UCX_WARN_UNUSED_ENV_VARS=n \
      FLATMEM_COORDINATOR="$coordinator" FLATMEM_RANK="$rank" FLATMEM_WORLD_SIZE="$hosts" \
      FLATMEM_COMM_TIMEOUT_MS="$timeout" timeout -s KILL "$deadline" "$net_rank" "$@" \
      >"$NET_WORK/$run.$rank" 2>&1 || exit $?
  ) 2>/dev/null &
  pids+=($!)
}

# launch_all RUN WHERE TIMEOUT_MS DEADLINE ARGS...: every rank, WHERE = hosts | loopback.
launch_all() {
  local run=$1 where=$2 timeout=$3 deadline=$4 r
  shift 4
  port=$((port + 1))
  pids=()
  for ((r = 0; r < hosts; r++)); do
    if [ "$where" = loopback ]; then
      launch "$run" "$r" "$(net_loopback)" lo "127.0.0.1:$port" "$timeout" "$deadline" "$@"
    else
      launch "$run" "$r" "$(net_host "$r")" eth0 "$(net_address 0):$port" "$timeout" "$deadline" "$@"
    fi
  done
}

# wait_all: each rank's exit status into codes[].
wait_all() {
  local r
  codes=()
  for ((r = 0; r < hosts; r++)); do
    codes[r]=0
    wait "${pids[r]}" || codes[r]=$?
  done
  pids=()
}

# field RUN KEY: KEY's values (key=value) over the ranks' outputs, one per line.
field() { sed -n "s/.* $2=\([^ ]*\).*/\1/p" "$NET_WORK/$1".*; }
min_of() { sort -g | head -n 1; }
max_of() { sort -g | tail -n 1; }

# run_checks RUN WHERE WHAT ARGS...: net_rank check on every rank; all must pass their own
# checks; their hashes, sorted, go to $NET_WORK/RUN.hashes.
run_checks() {
  local run=$1 where=$2 what=$3 r
  shift 3
  launch_all "$run" "$where" 20000 "$check_deadline" check "$@"
  wait_all
  for ((r = 0; r < hosts; r++)); do
    [ "${codes[r]}" = 0 ] || { cat "$NET_WORK/$run".*; fail "$what: rank $r exited ${codes[r]}"; }
  done
  grep -h ' hash ' "$NET_WORK/$run".* | sort >"$NET_WORK/$run.hashes"
  [ "$(wc -l <"$NET_WORK/$run.hashes")" = $((4 * hosts)) ] || fail "$what: missing hashes"
}

rows=()
# check RUN WHAT: a check run on the current network; results must equal the reference's.
check() {
  local run=$1 what=$2 started=$SECONDS spec measure_args=()
  step "$what"
  echo "MECHANISM: ${NET_MECHANISM:-none}"
  for spec in "${measures[@]}"; do measure_args+=(--measure "$spec"); done
  if [ "$run" = reference ]; then
    run_checks "$run" loopback "$what" "${measure_args[@]}"
  else
    run_checks "$run" hosts "$what" "${measure_args[@]}"
    diff "$NET_WORK/reference.hashes" "$NET_WORK/$run.hashes" >/dev/null || {
      diff "$NET_WORK/reference.hashes" "$NET_WORK/$run.hashes" || true
      fail "$what: results differ from the loopback run (the hashes above)"
    }
    echo "results: bitwise the loopback run's ($(wc -l <"$NET_WORK/$run.hashes") hashes: 4 operations x $hosts ranks)"
  fi
  local latency bandwidth
  latency=$(field "$run" small_all_reduce_ms | min_of)
  bandwidth=$(field "$run" shift_1MiB_ms | min_of)
  echo "probes (fastest rank): 1-element all-reduce $latency ms, 1 MiB ring shift $bandwidth ms; took $((SECONDS - started)) s"
  local measured
  while read -r measured; do
    rows+=("$what|$NET_MECHANISM|$latency|$bandwidth|$measured")
  done < <(grep -h ring_measure "$NET_WORK/$run".*)
}

# expect CONDITION MESSAGE: awk condition on the probes; fails the run when false.
expect() { awk "BEGIN { exit !($1) }" || fail "$2"; }

NET_MECHANISM="loopback: the 4 ranks in one namespace, UCX_NET_DEVICES=lo"
check reference "reference: loopback"
NET_MECHANISM="none: veth + router only"
check plain "hosts, nothing injected"
NET_MECHANISM=

# The comparison must be able to fail: other inputs (seed 2) must change every hash.
step "control: the same run with other inputs (--seed 2) must differ in every hash"
run_checks control hosts control --seed 2
unchanged=$(comm -12 "$NET_WORK/reference.hashes" "$NET_WORK/control.hashes" | wc -l)
[ "$unchanged" = 0 ] || fail "control: $unchanged hashes did not change with the inputs"
echo "control: all $(wc -l <"$NET_WORK/control.hashes") hashes differ from the loopback run's, as they must"

net_delay 20 5
check delay "(a) 20 ms +- 5 ms delay"
net_stop_shaper
[ -z "$NET_SHAPER_REPORT" ] || echo "$NET_SHAPER_REPORT"
# A 1-element all-reduce is one direct exchange (every rank sends to every rank at once):
# at least one delayed hop of 15 ms. The 1 MiB ring shift is checked to be shaped too.
expect "$(field delay small_all_reduce_ms | min_of) >= 15" \
  "(a): the all-reduce took less than one delayed hop: the delay was not applied"
net_clear_shaping

net_loss 1
check loss "(b) 1% packet loss"
net_stop_shaper
[ -z "$NET_SHAPER_REPORT" ] || echo "$NET_SHAPER_REPORT"
drops=$(net_shaping_drops)
expect "${drops:-0} > 0" "(b): no packet was dropped: the loss was not applied"
echo "packets dropped: $drops"
if [ -n "$NET_SHAPER_REPORT" ]; then  # its fraction: 1% of >= 10^4 packets, 3 sigma at most 0.3%
  dropped_pct=$(sed -n 's/.* dropped (\([0-9.]*\)%).*/\1/p' <<<"$NET_SHAPER_REPORT")
  expect "${dropped_pct:-0} >= 0.7 && ${dropped_pct:-0} <= 1.3" "(b): the shaper dropped ${dropped_pct}%, not about 1%"
fi
net_clear_shaping

net_bandwidth 100mbit
check rate "(c) 100 Mbit/s links"
# 1 MiB at 100 Mbit/s takes 84 ms; tbf's 64 kB burst lets through at most ~6% more at once.
expect "$(field rate shift_1MiB_ms | min_of) >= 75" \
  "(c): a 1 MiB ring shift took less than 75 ms: the bandwidth cap was not applied"
net_clear_shaping

# fault KIND VICTIM OP: (d) partition / (e) kill the victim's host while OP runs.
fault() {
  local kind=$1 victim=$2 op=$3 run="$1-$3" r waited started=$SECONDS
  launch_all "$run" hosts "$timeout_ms" "$fault_deadline" fault "$op" --seconds 40
  for ((waited = 0; waited < 300; waited++)); do
    [ "$(cat "$NET_WORK/$run".* | grep -c ' running ')" = "$hosts" ] && break
    sleep 0.1
  done
  [ "$(cat "$NET_WORK/$run".* | grep -c ' running ')" = "$hosts" ] ||
    { cat "$NET_WORK/$run".*; fail "$kind $op: the ranks did not all start"; }
  sleep 0.5
  local injected
  injected=$(date +%s.%N)
  if [ "$kind" = partition ]; then net_partition "$victim"; else net_kill_host "$victim"; fi
  wait_all
  [ "$kind" = partition ] && net_reconnect "$victim"
  # The operation as the library names it in its messages.
  local names
  case $op in
    all_reduce) names='all_reduce' ;;
    ring_shift) names='ring_shift' ;;
    ring_loss) names='contrastive (forward|backward)' ;;
    cyclic) names='cyclic' ;;
  esac
  local worst=0 naming=0 line at message
  for ((r = 0; r < hosts; r++)); do
    if [ "$kind" = kill ] && [ "$r" = "$victim" ]; then
      [ "${codes[r]}" = 137 ] || fail "$kind $op: the killed rank exited ${codes[r]}"
      continue
    fi
    line=$(grep "^rank $r FAILED" "$NET_WORK/$run.$r" || true)
    [ "${codes[r]}" = 3 ] && [ -n "$line" ] ||
      { cat "$NET_WORK/$run".*; fail "$kind $op: rank $r exited ${codes[r]} (137: killed at its deadline: a hang)"; }
    grep -q "^rank $r destroyed .*comm_destroy=FLATMEM_STATUS_SUCCESS" "$NET_WORK/$run.$r" ||
      fail "$kind $op: rank $r did not destroy its communicator cleanly: $(cat "$NET_WORK/$run.$r")"
    at=$(sed 's/.* at=\([0-9.]*\):.*/\1/' <<<"$line")
    message=${line#*: }
    local after
    after=$(awk -v a="$at" -v b="$injected" 'BEGIN { printf "%.2f", a - b }')
    worst=$(awk -v a="$after" -v b="$worst" 'BEGIN { print (a > b ? a : b) }')
    [ "$r" = "$victim" ] && continue  # the partitioned rank: it must only end cleanly
    expect "$after <= $timeout_ms / 1000 + $slack" "$kind $op: rank $r failed $after s after the fault: $message"
    # flatmem's own text (after net_rank's "<call>: <STATUS>: ") must name the operation.
    grep -qE "$names" <<<"${message#*: FLATMEM_STATUS_*: }" ||
      fail "$kind $op: rank $r's message does not name the operation: $message"
    # The peer it waited for: the lost rank, or one that waits for it (a chain of timeouts).
    grep -oE "(from|to) rank [0-9]+" <<<"$message" | grep -qv "rank $r\$" ||
      fail "$kind $op: rank $r's message names no peer: $message"
    if grep -q "rank $victim\b" <<<"$message"; then naming=$((naming + 1)); fi
  done
  [ "$naming" -gt 0 ] || fail "$kind $op: no surviving rank's message names the lost rank $victim"
  printf '%s %s: every rank failed within %.2f s of the fault and destroyed cleanly (%d of %d survivors name rank %d); took %d s\n' \
    "$kind" "$op" "$worst" "$naming" $((hosts - 1)) "$victim" $((SECONDS - started))
  sed -n 's/^rank \([0-9]*\) FAILED [a-z_]* at=[0-9.]*: /  rank \1: /p' "$NET_WORK/$run".* | cut -c1-330
}

step "(d) a host partitioned (its link down) mid-operation: rank 2; timeout $timeout_ms ms"
for op in all_reduce ring_shift ring_loss cyclic; do fault partition 2 "$op"; done
step "(e) a host killed (SIGKILL to its processes) mid-step: rank 3; timeout $timeout_ms ms"
for op in all_reduce ring_shift ring_loss cyclic; do fault kill 3 "$op"; done

step "ring contrastive loss over the networks (bench/ring_rank's method; 4 ranks x 1 thread, fp32)"
printf '| %-26s | %-11s | %9s | %9s | %9s | %6s | %9s | %9s | %6s | %s\n' scenario "B x d" latency "1 MiB" \
  step "vs lo" transfer blocked hidden mechanism
# value KEY TEXT: KEY's number in a ring_measure line.
value() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p" <<<"$2"; }
for spec in "${measures[@]}"; do
  batch=${spec%%,*}
  reference=
  for row in "${rows[@]}"; do
    IFS='|' read -r what mechanism latency bandwidth measured <<<"$row"
    [ "$(value batch "$measured")" = "$batch" ] || continue
    [ -n "$reference" ] || reference=$(value step_ms "$measured")
    printf '| %-26s | %-11s | %6s ms | %6s ms | %6s ms | %6s | %6s ms | %6s ms | %5s%% | %s\n' "$what" \
      "$batch x $(value d "$measured")" "$latency" "$bandwidth" "$(value step_ms "$measured")" \
      "$(awk -v a="$(value step_ms "$measured")" -v b="$reference" 'BEGIN { printf "%.2f", a / b }')" \
      "$(value transfer_ms "$measured")" "$(value blocked_ms "$measured")" "$(value hidden_pct "$measured")" \
      "$mechanism"
  done
done
echo "latency: 1-element all-reduce (one direct exchange); 1 MiB: ring shift; step: the slowest rank's ring loss"
echo "forward + backward; transfer: the same payload sent alone as ring shifts; blocked: time in ring"
echo "waits; hidden = 1 - blocked / transfer (means over ranks; a lower bound, as in bench/ring_bench)."
step "test-netns: passed"
