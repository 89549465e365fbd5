#!/usr/bin/env bash
# A batchwire cluster across network namespaces: N hosts (namespaces) on one bridge, each
# running `batchwire node`, all joining through the first one. Then some are killed with
# SIGKILL, the survivors must see them down, they are restarted, and every node must see
# every other alive again. Needs root (ip netns). Everything it makes is removed on every
# exit path (success, failure, Ctrl-C); every wait is bounded.
#
#   sudo scripts/netns-cluster.sh [BINARY] [NODES] [KILL]
#
# BINARY defaults to target/release/batchwire; NODES to 5 (at most 200); KILL (how many to
# kill and restart) to 2. Prints one "ok ..." line per check and exits non-zero on failure.
set -euo pipefail

BIN=${1:-target/release/batchwire}
N=${2:-5}
KILL=${3:-2}
TAG=bw$$                 # unique per run: namespaces, bridge and veths carry it
BR=${TAG}br
NET=10.$((RANDOM % 200 + 20)).$((RANDOM % 250)).
PORT=7400
DIR=$(mktemp -d)
TIMEOUT=${NETNS_TIMEOUT:-30}   # seconds per wait

if [ "$(id -u)" != 0 ]; then
    echo "netns-cluster: needs root (ip netns); run with sudo" >&2
    exit 2
fi
if ! [ -x "$BIN" ]; then
    echo "netns-cluster: no batchwire binary at $BIN (cargo build --release)" >&2
    exit 2
fi
BIN=$(realpath "$BIN")
if [ "$N" -lt 3 ] || [ "$N" -gt 200 ] || [ "$KILL" -ge "$N" ] || [ "$KILL" -lt 1 ]; then
    echo "netns-cluster: need 3 <= NODES <= 200 and 1 <= KILL < NODES" >&2
    exit 2
fi

declare -a PIDS
cleanup() {
    set +e
    for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    exec 2>/dev/null
    for i in $(seq 1 "$N"); do ip netns del "${TAG}h$i" 2>/dev/null; done
    ip link del "$BR" 2>/dev/null
    rm -rf "$DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip link add "$BR" type bridge
ip link set "$BR" up
for i in $(seq 1 "$N"); do
    ns=${TAG}h$i
    ip netns add "$ns"
    ip link add "${TAG}v$i" type veth peer name "${TAG}p$i"
    ip link set "${TAG}p$i" netns "$ns"
    ip link set "${TAG}v$i" master "$BR" up
    ip -n "$ns" addr add "${NET}$i/24" dev "${TAG}p$i"
    ip -n "$ns" link set "${TAG}p$i" up
    ip -n "$ns" link set lo up
done
echo "ok $N hosts (namespaces ${TAG}h1..${TAG}h$N) on bridge $BR, ${NET}0/24"

echo "netns-cluster secret" > "$DIR/secret"
start() { # start node i (its stdout, the view it prints, goes to DIR/i.out)
    local i=$1 seed=()
    [ "$i" -gt 1 ] && seed=(--join "${NET}1:$PORT")
    ip netns exec "${TAG}h$i" "$BIN" node --name "n$i" --listen "${NET}$i:$PORT" \
        --secret-file "$DIR/secret" --stats-every 0 "${seed[@]}" \
        > "$DIR/$i.out" 2>> "$DIR/$i.err" &
    PIDS[$i]=$!
}
# The state each node last printed for member NAME (joined/suspected/alive/down/left).
state() { grep -E "^member [a-z]+ $2 " "$DIR/$1.out" 2>/dev/null | tail -1 | cut -d' ' -f2; }
incarnation() { grep -E "^member [a-z]+ $2 " "$DIR/$1.out" 2>/dev/null | tail -1 | cut -d' ' -f5; }
live() { [ "$(state "$1" "$2")" = joined ] || [ "$(state "$1" "$2")" = alive ]; }
# Wait until every node in $1 sees every node in $2 in a live state (or check fn $3).
wait_for() { # description, check-command...
    local what=$1; shift
    local t0=$SECONDS
    until "$@"; do
        if [ $((SECONDS - t0)) -ge "$TIMEOUT" ]; then
            echo "FAIL: $what within ${TIMEOUT}s" >&2
            for i in $(seq 1 "$N"); do echo "--- n$i"; cat "$DIR/$i.out"; tail -5 "$DIR/$i.err"; done >&2
            return 1
        fi
        sleep 0.2
    done
    echo "ok $what ($((SECONDS - t0)) s)"
}
all_see_all() {
    for i in $(seq 1 "$N"); do for j in $(seq 1 "$N"); do
        [ "$i" = "$j" ] && continue
        live "$i" "n$j" || return 1
    done; done
}
victims() { seq $((N - KILL + 1)) "$N"; }
survivors_see_victims() { # $1: down | new
    for i in $(seq 1 $((N - KILL))); do for v in $(victims); do
        if [ "$1" = down ]; then [ "$(state "$i" "n$v")" = down ] || return 1
        else live "$i" "n$v" && [ "$(incarnation "$i" "n$v")" != "${OLD[$v]}" ] || return 1
        fi
    done; done
}

for i in $(seq 1 "$N"); do start "$i"; done
wait_for "every node sees the $((N - 1)) others alive, joined through n1 only" all_see_all

declare -a OLD
for v in $(victims); do
    OLD[$v]=$(incarnation 1 "n$v")
    kill -9 "${PIDS[$v]}"
    wait "${PIDS[$v]}" 2>/dev/null || true
    PIDS[$v]=
done
echo "ok SIGKILLed $(victims | sed 's/^/n/' | tr '\n' ' ')"
wait_for "every survivor sees the killed nodes down" survivors_see_victims down

for v in $(victims); do start "$v"; done
wait_for "every survivor sees the restarted nodes as new incarnations" survivors_see_victims new
wait_for "every node sees every other alive again" all_see_all
echo "ok netns cluster of $N: join, SIGKILL, detection, restart"
