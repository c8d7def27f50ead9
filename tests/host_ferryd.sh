# Sourced by the shell tests that drive a real ferryd on the host backend:
#   need TOOL...            fail unless each tool is installed
#   [pool_size=SIZE] start_host_ferryd NAME FERRYD [YAML LINE...]
#                           a scratch $dir, ferryd running there ($pid, socket $sock) with a
#                           pool of $pool_size (default 64MiB), both cleaned up on exit;
#                           metrics on $metrics_address if set (then $metrics is the address
#                           it bound, IPV4:PORT)
#   wait_pool_whole FERRYCTL
#                           ferryd's status (JSON) in $st once its pool is whole again, or after
#                           10 s the last one read
fail() { echo "FAIL: $*"; exit 1; }
need() {
  for t in "$@"; do command -v "$t" >/dev/null || fail "$t is not installed (scripts/setup.sh installs it)"; done
}
start_host_ferryd() {
  local name=$1 bin=$2
  shift 2
  dir=$(mktemp -d "/tmp/ferry-$name-XXXXXX")
  trap 'kill $pid 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT
  {
    printf 'runtime_dir: %s/rt\nbackend: host\npool: {size: %s, slab: 1MiB}\nmetrics: {address: "%s"}\n' "$dir" \
      "${pool_size:-64MiB}" "${metrics_address:-}"
    for line in "$@"; do printf '%s\n' "$line"; done
  } >"$dir/ferryd.yaml"
  "$bin" --config "$dir/ferryd.yaml" >"$dir/ferryd.log" 2>&1 &
  pid=$!
  # The socket answers "starting" until the pool is built: the log says when ferryd is ready.
  for _ in $(seq 200); do grep -q '\[info\] ready' "$dir/ferryd.log" 2>/dev/null && break; sleep 0.05; done
  sock=$dir/rt/ferryd.sock
  grep -q '\[info\] ready' "$dir/ferryd.log" || { cat "$dir/ferryd.log"; fail "ferryd did not start"; }
  metrics=$(sed -n 's|.*metrics on http://\([0-9.]*:[0-9]*\)/metrics.*|\1|p' "$dir/ferryd.log")
}
wait_pool_whole() {
  # Slabs of ended sessions come back once their processes are gone and the zeroer is done.
  for _ in $(seq 100); do
    st=$("$1" --socket "$sock" status --json) || fail "ferryctl status"
    python3 -c 'import json, sys; s = json.loads(sys.argv[1]); sys.exit(s["pool_free_bytes"] != s["pool_bytes"])' "$st" &&
      return 0
    sleep 0.1
  done
}
