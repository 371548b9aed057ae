#!/bin/bash
# Run every test of one of Mooncake's unittest suites on its own (a fresh master and process
# per test, so a failfast suite still runs them all), against kvcake or the real wheel, and
# print one summary line per test. Output of each run: $OUT/<suite>_<side>_<Class.test>.txt.
#
# usage: run_each.sh kvcake|wheel SUITE.py [Class ...]   (default: every TestCase class)
#   SUITES_DIR (default /tmp/mcsuites), OUT (default $SUITES_DIR/runs); see run_suite.sh
set -u
side=$1; suite=$2; shift 2
here=$(cd "$(dirname "$0")" && pwd)
dir=${SUITES_DIR:-/tmp/mcsuites}
out=${OUT:-$dir/runs}
mkdir -p "$out"
tests=$(python3 - "$dir/$suite" "$@" <<'EOF'
import ast, sys
tree = ast.parse(open(sys.argv[1]).read())
want = set(sys.argv[2:])
for node in tree.body:
    if isinstance(node, ast.ClassDef) and (not want or node.name in want):
        names = [f.name for f in node.body if isinstance(f, ast.FunctionDef) and f.name.startswith("test")]
        if names and any("Test" in ast.unparse(b) for b in node.bases):
            print("\n".join(f"{node.name}.{n}" for n in names))
EOF
)
for t in $tests; do
  log="$out/${suite%.py}_${side}_$t.txt"
  bash "$here/run_suite.sh" "$side" "$suite" "$t" >"$log" 2>&1
  res=$(grep -E "^(OK|FAILED)" "$log" | tail -1)
  echo "$side $suite $t: ${res:-no result (see $log)}"
done
