#!/bin/bash
# Run one of Mooncake's own Python test suites, unedited, against kvcake or the real wheel
# (issue 14; docs/compat/mooncake.md, "Mooncake's own test suites"). The suites are not
# committed here: copy them from the Mooncake repository into SUITES_DIR first.
#
# usage: run_suite.sh kvcake|wheel SUITE.py [unittest args, e.g. Class.test_name]
#   SUITES_DIR       where the suite files are (default /tmp/mcsuites)
#   MOONCAKE_VENV    the wheel's venv (default /work/mooncake-venv: mooncake-transfer-engine-non-cuda)
#   KVCAKE_VENV      kvcake's venv (default: the repository's .venv)
#   MASTER_EXTRA     more master flags, e.g. "--enable_offload=true --root_fs_dir=/tmp/fs"
# The master gets Mooncake's flags (HTTP metadata server, 1 s lease) on free loopback ports.
# conformance.py (beside this script) runs whole suites on both sides and compares them.
set -u
side=$1; suite=$2; shift 2
here=$(cd "$(dirname "$0")/../.." && pwd)
dir=${SUITES_DIR:-/tmp/mcsuites}
mc=${MOONCAKE_VENV:-/work/mooncake-venv}
kv=${KVCAKE_VENV:-$here/.venv}
fp() { python3 -c "import socket;s=socket.socket();s.bind(('127.0.0.1',0));print(s.getsockname()[1])"; }
port=$(fp); mport=$(fp)
flags="--rpc_port=$port --enable_http_metadata_server=true --http_metadata_server_port=$mport --default_kv_lease_ttl=1000 ${MASTER_EXTRA:-}"
if [ "$side" = wheel ]; then
  "$mc/bin/mooncake_master" $flags --rpc_address=127.0.0.1 --http_metadata_server_host=127.0.0.1 \
    --metrics_port=0 --metrics_host=127.0.0.1 >"$dir/master_$side.log" 2>&1 & mp=$!
  py=$mc/bin/python; pp=""
else
  shim=$dir/shim
  [ -d "$shim" ] || "$kv/bin/kvcake" mooncake-shim --target "$shim" install >/dev/null
  # the stand-in mooncake_master the switch installs, with the same command line (issue 36)
  "$shim/bin/mooncake_master" $flags --http_metadata_server_host=127.0.0.1 --metrics_port="$(fp)" \
    >"$dir/master_$side.log" 2>&1 & mp=$!
  py=$kv/bin/python; pp=$shim
fi
trap 'kill $mp 2>/dev/null; wait $mp 2>/dev/null' EXIT
for _ in $(seq 150); do
  (echo >/dev/tcp/127.0.0.1/$port) 2>/dev/null && (echo >/dev/tcp/127.0.0.1/$mport) 2>/dev/null && break
  sleep 0.2
done
# A suite with a __main__ block runs as a script (as its users run it: unittest.main, or its own
# argparse and TextTestRunner like test_tensor_api.py's --mode); one without runs under pytest.
runner=""; grep -q "__main__" "$dir/$suite" || runner="-m pytest -q -p no:cacheprovider"
cd "$dir" && PYTHONPATH=$pp MASTER_SERVER=127.0.0.1:$port MOONCAKE_MASTER=127.0.0.1:$port \
  MC_METADATA_SERVER=http://127.0.0.1:$mport/metadata DEFAULT_KV_LEASE_TTL=1000 PROTOCOL=tcp \
  DEVICE_NAME= timeout 900 "$py" $runner "$suite" "$@" 2>&1
echo "exit=$?"
