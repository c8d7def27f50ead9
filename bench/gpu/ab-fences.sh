#!/usr/bin/env bash
# A/B of how ferryd sees its copies done, on a GPU machine, in turn on one build: fence words
# (words, the default: each copy stream writes a sequence number into host memory the loop
# reads; a lane's groups take events), events (FERRY_FENCES=events: cudaEventQuery /
# cudaStreamQuery each turn) and conn32 (words, with 32 hardware queues for ferryd:
# CUDA_DEVICE_MAX_CONNECTIONS=32, against the driver's default of 8), hostflags and devflags
# (words, with the lanes' event flags in the ring segment's host pages or in device memory:
# FERRY_EVENT_FLAGS=host or device). VARIANTS
# (default "words events") picks them. Per variant
# and round (ROUNDS, default 2), one ferryd: ferry-bench transfer SECTIONS (default
# latency,many,blocks) against the in-process baseline; then (INSTEP=1, the default) the seed's
# in-step overlap. Writes $OUT/fences-*.txt.
set -uo pipefail
. "$(dirname "$0")/env.sh"
policy=${POLICY:-policies/chunked.yaml}
for round in $(seq "${ROUNDS:-2}"); do
  for fences in ${VARIANTS:-words events}; do
    echo "== round $round: fences $fences"
    case $fences in
      words) variant_env= ;;
      events) variant_env=FERRY_FENCES=events ;;
      conn32) variant_env=CUDA_DEVICE_MAX_CONNECTIONS=32 ;;
      hostflags) variant_env=FERRY_EVENT_FLAGS=host ;;
      devflags) variant_env=FERRY_EVENT_FLAGS=device ;;
      *) echo "ab-fences: unknown variant $fences (words, events, conn32, hostflags, devflags)" >&2; exit 2 ;;
    esac
    FERRYD_ENV=$variant_env start_ferryd >/dev/null
    grep -h "fence words\|ready" "$rt/ferryd.log" | head -2
    "$BUILD/ferry-bench" transfer --socket "$sock" --only "${SECTIONS:-latency,many,blocks}" \
      >"$OUT/fences-$fences-$round.txt" 2>/dev/null
    grep -E "^  (h2d|d2h)  |^1024 x|PASS|FAIL|LIMIT" "$OUT/fences-$fences-$round.txt"
    if [ "${INSTEP:-1}" = 1 ]; then
      "$BUILD/ferryctl" --socket "$sock" bench overlap --policies "$policy" \
        >"$OUT/fences-overlap-$fences-$round.txt" 2>/dev/null
      grep -E "in-process in-step|in-step blocks|copy alone" "$OUT/fences-overlap-$fences-$round.txt"
    fi
    kill -TERM $pid; wait $pid
  done
done
