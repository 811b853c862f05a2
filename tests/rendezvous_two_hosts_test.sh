#!/usr/bin/env bash
# Two ranks of bridge-pretrain on two "hosts": network namespaces joined by a veth pair, each with its own host name
# and /etc/hosts in which that name resolves to 127.0.0.1 (as in many containers and cluster nodes), launched by hand
# as torchrun --nnodes=2 would (LOCAL_WORLD_SIZE=1), without GLOO_SOCKET_IFNAME unless said.
#   1. MASTER_ADDR is host a's address: Gloo follows the route to it, not the loopback the host name gives; trains.
#   2. MASTER_ADDR is host a's name, which is loopback on host a: both ranks refuse within the rendezvous timeout,
#      naming GLOO_SOCKET_IFNAME and /etc/hosts; with GLOO_SOCKET_IFNAME set on host a it trains.
#   3. Rank 1 has a wrong MASTER_ADDR: rank 1 names the address it tried, rank 0 names rank 1 as never joined, both
#      within the rendezvous timeout, in one line each, without c10d's retry warnings.
# Needs root and iproute2 (ip netns, veth); exits 77 (CTest's skip) where it cannot make the namespaces.
# Usage: tests/rendezvous_two_hosts_test.sh <bridge-pretrain>
set -euo pipefail
program=$(realpath "${1:?usage: $0 <bridge-pretrain>}")
suffix=$$
ns_a=bridge_rdv_a_$suffix ns_b=bridge_rdv_b_$suffix
veth_a=rdva$suffix veth_b=rdvb$suffix # at most 15 characters
addr_a=10.231.0.1 addr_b=10.231.0.2 nobody=10.231.0.77
work=$(mktemp -d "${TMPDIR:-/tmp}/bridge_rdv.XXXXXX")
cleanup() {
  ip netns del "$ns_a" 2>/dev/null || true
  ip netns del "$ns_b" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
skip() {
  echo "skipped: $1"
  exit 77
}
command -v ip >/dev/null || skip "no ip command (iproute2)"
[[ $(id -u) == 0 ]] || skip "network namespaces need root"
ip netns add "$ns_a" 2>/dev/null || skip "cannot create a network namespace here (ip netns add)"
ip netns add "$ns_b"
ip link add "$veth_a" type veth peer name "$veth_b" 2>/dev/null || skip "cannot create a veth pair here"
ip link set "$veth_a" netns "$ns_a"
ip link set "$veth_b" netns "$ns_b"
ip -n "$ns_a" addr add "$addr_a/24" dev "$veth_a"
ip -n "$ns_b" addr add "$addr_b/24" dev "$veth_b"
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
ip -n "$ns_a" link set "$veth_a" up
ip -n "$ns_b" link set "$veth_b" up
printf '127.0.0.1 localhost\n127.0.0.1 hosta\n' >"$work/hosts_a"
printf '127.0.0.1 localhost\n127.0.0.1 hostb\n%s hosta\n' "$addr_a" >"$work/hosts_b"
# A private UTS and mount namespace per rank: its own host name and /etc/hosts.
if ! ip netns exec "$ns_a" unshare --uts --mount sh -c 'mount --bind "$0" /etc/hosts && hostname hosta' \
  "$work/hosts_a" 2>/dev/null; then
  skip "cannot set a host name and /etc/hosts in a namespace (unshare --uts --mount)"
fi

failures=0
check() { # check <description> <command...>
  if "${@:2}"; then echo "ok: $1"; else
    echo "FAILED: $1"
    failures=$((failures + 1))
  fi
}
common=(dataset.data_path=[] train.train_iters=2 train.eval_iters=0 logging.log_interval=1 train.num_threads=1
  parallelism.timeout=60s parallelism.rendezvous_timeout=5s)

# launch <log> <namespace> <host> <hosts file> <rank> <MASTER_ADDR> [VAR=value ...]: one rank in the background.
launch() {
  local log=$1 ns=$2 host=$3 hosts=$4 rank=$5 master=$6
  shift 6
  env RANK="$rank" WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR="$master" MASTER_PORT="$port" \
    XDG_CACHE_HOME="$work/cache" "$@" timeout 90 ip netns exec "$ns" unshare --uts --mount \
    sh -c 'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"' "$hosts" "$host" \
    "$program" "${common[@]}" >"$work/$log" 2>&1 &
  pids+=($!)
}
# run <name> <master for rank 0> <master for rank 1> [VAR=value for rank 0 ...]: both ranks; sets status0/1, elapsed.
run() {
  local name=$1 master0=$2 master1=$3
  shift 3
  port=$((20000 + RANDOM % 20000))
  pids=()
  local start=$SECONDS
  launch "$name.rank0.log" "$ns_a" hosta "$work/hosts_a" 0 "$master0" "$@"
  launch "$name.rank1.log" "$ns_b" hostb "$work/hosts_b" 1 "$master1"
  status0=0 status1=0
  wait "${pids[0]}" || status0=$?
  wait "${pids[1]}" || status1=$?
  elapsed=$((SECONDS - start))
}
quiet() { # no c10d retry warnings or backtraces in a log, a few lines in all (c10d's server may warn once that
  # reverse DNS has no name for an address, as it does in these namespaces)
  ! grep -q -e 'frame #' -e 'retrying' -e 'recvValue' -e 'Connect timeout' "$work/$1" && (($(wc -l <"$work/$1") <= 3))
}

run route "$addr_a" "$addr_a"
check "1. host names on loopback, MASTER_ADDR=$addr_a: both ranks train (exit $status0, $status1)" \
  test "$status0" -eq 0 -a "$status1" -eq 0
check "1. rank 0 says Gloo follows the route to MASTER_ADDR" \
  grep -q "Gloo advertises $addr_a on $veth_a (the route to MASTER_ADDR $addr_a)" "$work/route.rank0.log"
check "1. the last rank ends with the summary" grep -q "bridge-pretrain: done" "$work/route.rank1.log"

run loopback hosta hosta
check "2. MASTER_ADDR=hosta (loopback on hosta): both ranks fail (exit $status0, $status1)" \
  test "$status0" -eq 1 -a "$status1" -eq 1
check "2. within 5 s plus start-up (took $elapsed s)" test "$elapsed" -lt 30
for rank in 0 1; do
  check "2. rank $rank names rank 0's loopback address and the fix" grep -q \
    "rank 0 on host 'hosta' advertises the loopback address 127.0.0.1 (lo).*GLOO_SOCKET_IFNAME=$veth_a on that host.*fix /etc/hosts there" \
    "$work/loopback.rank$rank.log"
  check "2. rank $rank is quiet" quiet "loopback.rank$rank.log"
done

run named_interface hosta hosta GLOO_SOCKET_IFNAME="$veth_a"
check "2. the same with GLOO_SOCKET_IFNAME=$veth_a on hosta trains (exit $status0, $status1)" \
  test "$status0" -eq 0 -a "$status1" -eq 0

run wrong_host "$addr_a" "$nobody"
check "3. a wrong MASTER_ADDR on rank 1: both ranks fail (exit $status0, $status1)" \
  test "$status0" -eq 1 -a "$status1" -eq 1
check "3. within 5 s plus start-up (took $elapsed s)" test "$elapsed" -lt 30
check "3. rank 0 names rank 1 and the address it should reach" grep -q \
  "rank 1 of 2 never joined the rendezvous at $addr_a:$port within 5 s (parallelism.rendezvous_timeout): check it was started, and that its MASTER_ADDR/MASTER_PORT are $addr_a:$port" \
  "$work/wrong_host.rank0.log"
check "3. rank 1 names the address it tried" grep -q \
  "rank 1 of 2 could not reach the rendezvous store at $nobody:$port within 5 s (parallelism.rendezvous_timeout)" \
  "$work/wrong_host.rank1.log"
for rank in 0 1; do
  check "3. rank $rank is quiet" quiet "wrong_host.rank$rank.log"
  check "3. rank $rank says it once" test "$(grep -c -e 'never joined' -e 'could not reach' "$work/wrong_host.rank$rank.log")" -eq 1
done

if ((failures > 0)); then
  for log in "$work"/*.log; do
    echo "--- $log (end)"
    tail -n 20 "$log"
  done
  exit 1
fi
echo "rendezvous on two hosts: ok"
