#!/bin/bash
# User-space instructions per message, sending and receiving process, under callgrind:
# the run is made with N and with 2N messages, and the difference divided by N, so that
# start-up and connection set-up cancel out.
#
#   scripts/instructions-per-message.sh SIZE N            # batchwire natural (bench throughput)
#   scripts/instructions-per-message.sh SIZE N grpc       # scripts/grpc-ref, payloads built first
#   scripts/instructions-per-message.sh SIZE N grpc-fresh # scripts/grpc-ref --fresh
#
# Needs valgrind (Debian: apt-get install valgrind) and release builds (cargo build
# --release -p batchwire-cli; scripts/grpc-ref: cargo build --release). Copies done with
# `rep movsb` count as few instructions, so compare builds of one program, not programs.
set -euo pipefail
S=${1:?size}; N=${2:?messages}; WHAT=${3:-natural}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$ROOT/target/release/batchwire
REF=$ROOT/scripts/grpc-ref/target/release/grpc-ref
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
total() { grep -m1 '^totals:\|^summary:' "$1" | awk '{print $2}'; }
run() { # messages -> "send recv"
  d=$TMP/$1; mkdir -p "$d"
  if [ "$WHAT" = natural ]; then
    valgrind --tool=callgrind --trace-children=yes --callgrind-out-file="$d/cg.%p" \
      "$BIN" bench throughput --bundler natural --size "$S" --messages "$1" --runs 1 --quiet \
      >/dev/null 2>"$d/log"
    local s r
    for f in "$d"/cg.*; do
      case $(grep -m1 '^cmd:' "$f") in
        *"--role send"*) s=$(total "$f") ;;
        *"--role recv"*) r=$(total "$f") ;;
      esac
    done
    echo "$s $r"
  else
    local fresh=(); [ "$WHAT" = grpc-fresh ] && fresh=(--fresh)
    valgrind --tool=callgrind --callgrind-out-file="$d/srv" "$REF" server \
      --listen 127.0.0.1:7791 --once 2>/dev/null &
    sleep 2
    valgrind --tool=callgrind --callgrind-out-file="$d/cli" "$REF" client \
      --peer 127.0.0.1:7791 --messages "$1" --size "$S" "${fresh[@]}" >/dev/null 2>&1
    wait
    echo "$(total "$d/cli") $(total "$d/srv")"
  fi
}
A=($(run "$N")); B=($(run $((2 * N))))
echo "$WHAT $S B: send $(( (B[0] - A[0]) / N )), receive $(( (B[1] - A[1]) / N )) instructions per message"
