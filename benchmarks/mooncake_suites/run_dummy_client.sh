#!/bin/bash
# Mooncake's test_dummy_client.py, unedited, as its users run it: a mooncake_master and a real
# mooncake_client on the suite's fixed ports (master 50051, metadata 8080, client 50052), then
# the suite's dummy client against them (docs/compat/mooncake.md). Fixed ports, and the wheel's
# programs bind every interface, so each side runs in its own network namespace (unshare -n,
# root): loopback plus a veth pair, because the wheel's client wants a non-loopback interface.
#
# usage: run_dummy_client.sh kvcake|wheel SUITES_DIR OUT
#   SUITES_DIR     holds test_dummy_client.py;  OUT  logs, junit XML, kvcake's shim (OUT/shim)
#   MOONCAKE_VENV  the wheel's venv (default /work/venvs/mooncake)
set -u
side=$1; dir=$(cd "$2" && pwd); out=$(mkdir -p "$3" && cd "$3" && pwd)
here=$(cd "$(dirname "$0")/../.." && pwd)
if [ "$side" = wheel ]; then
  bin=${MOONCAKE_VENV:-/work/venvs/mooncake}/bin; py=$bin/python; pp=""
else
  [ -d "$out/shim/mooncake" ] || "$here/.venv/bin/kvcake" mooncake-shim --target "$out/shim" install >/dev/null
  bin=$out/shim/bin; py=$here/.venv/bin/python; pp=$out/shim
fi
export side dir out bin py pp
exec unshare -n bash -c '
  ip link set lo up
  ip link add mc0 type veth peer name mc1 && ip addr add 10.213.0.1/24 dev mc0 \
    && ip link set mc0 up && ip link set mc1 up
  wait_port() { for _ in $(seq 150); do (echo >/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.2; done; return 1; }
  "$bin/mooncake_master" --rpc_port=50051 --default_kv_lease_ttl=500 \
    --enable_http_metadata_server=true --http_metadata_server_port=8080 >"$out/dummy.$side.master.log" 2>&1 & m=$!
  trap "kill \$c 2>/dev/null; wait \$c; kill \$m 2>/dev/null; wait" EXIT  # the client first: it unpublishes from the master
  wait_port 50051 && wait_port 8080 || { echo "master did not start"; exit 2; }
  "$bin/mooncake_client" --master_server_address=127.0.0.1:50051 --global_segment_size=1GB \
    --port=50052 --host=127.0.0.1 --metadata_server=http://127.0.0.1:8080/metadata \
    >"$out/dummy.$side.client.log" 2>&1 & c=$!
  wait_port 50052 || { echo "client did not start"; exit 2; }
  sleep 2  # the client mounts its segment after it listens
  cd "$dir" && PYTHONPATH=$pp DEFAULT_KV_LEASE_TTL=500 timeout 600 "$py" -m pytest -q \
    -p no:cacheprovider --junitxml="$out/test_dummy_client.$side.xml" test_dummy_client.py
  echo "exit=$?"
'
