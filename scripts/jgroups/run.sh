#!/bin/bash
# JGroups 2.12 (Debian's libjgroups-java) in an MPerf-style test, for the comparison in
# docs/compare-v14-session14.txt: N processes each multicast M messages of S bytes to the group
# (itself included), R rounds in one cluster (the JIT warms up over the first rounds).
#
#   apt-get install libjgroups-java default-jdk-headless unzip
#   scripts/jgroups/run.sh N M SIZE ROUNDS
#
# It prints one line per node and round: messages received, seconds from the round's start
# barrier to that node's last delivery, msgs/s, and how many arrived out of order or
# duplicated in that round ("bad"). The stack is the jar's own tcp.xml on loopback, with two
# changes: its thread pools queue rather than discard when busy (with "discard", messages
# dropped under this load wait for retransmission and a round of 100,000 took 60-150 s),
# and the regular pool has at most 4 threads rather than 10 (2 vCPUs here).
set -euo pipefail
N=${1:?nodes}; M=${2:?messages}; S=${3:?size}; R=${4:?rounds}
JAR=/usr/share/java/jgroups.jar
[ -f "$JAR" ] || { echo "no $JAR: apt-get install libjgroups-java" >&2; exit 1; }
DIR=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$DIR"' EXIT
here=$(cd "$(dirname "$0")" && pwd)
javac -d "$DIR" -cp "$JAR" "$here/MPerf.java"
(cd "$DIR" && unzip -q -o "$JAR" tcp.xml)
sed -e 's/queue_enabled="false"/queue_enabled="true"/' \
    -e 's/queue_max_size="100"/queue_max_size="100000"/' \
    -e 's/rejection_policy="discard"/rejection_policy="run"/' \
    -e 's/thread_pool.max_threads="10"/thread_pool.max_threads="4"/' \
    "$DIR/tcp.xml" > "$DIR/mperf.xml"
hosts=$(for i in $(seq 0 $((N - 1))); do printf "127.0.0.1[%d]," $((7800 + i)); done)
pids=()
for i in $(seq 0 $((N - 1))); do
    timeout 600 java -Xms1g -Xmx2g -Djava.net.preferIPv4Stack=true \
        -Djgroups.bind_addr=127.0.0.1 -Djgroups.tcpping.initial_hosts="${hosts%,}" \
        -Dmperf.config="$DIR/mperf.xml" -cp "$JAR:$DIR" \
        MPerf "$i" "$N" "$M" "$S" "$R" > "$DIR/out.$i" 2> "$DIR/err.$i" &
    pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
{ grep -h round "$DIR"/out.* || true; } | sort -k4n -k2n
[ $rc = 0 ] || { echo "a node failed (rc $rc):" >&2; tail -n 5 "$DIR"/err.* >&2; exit $rc; }
