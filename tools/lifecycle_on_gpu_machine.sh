#!/usr/bin/env bash
# Issue 25's lifecycle proofs on the lent GPU machine, through the device tool, carrying .cache/lc (what
# tools/gpu_setup.sh installs).
set -u
source tools/gpu_setup.sh
aiomnn info
# KIND:COUNT:SECONDS for each backend, where a leak is being hunted: sessions dropped without close, with the
# object types that grew (tools/leak_probe.py), e.g. LEAKS="cuda:1000:300 vulkan:300:120".
for spec in ${LEAKS:-}; do
  IFS=: read -r k n t <<<"$spec"
  SETTLE="${SETTLE:-20}" timeout "$t" python3 tools/leak_probe.py "$k" "$n" 2>&1 | head -40; echo "exit ${PIPESTATUS[0]}"
done | tee "$OUT/leak.txt"
[ "${TEST_SECONDS:-400}" -gt 0 ] || exit 0
# The lifecycle tests (1000 sessions dropped a backend); -s keeps each backend's line.
timeout "${TEST_SECONDS:-400}" python3 -m pytest -q -s -p no:cacheprovider \
  tests/test_lifecycle.py ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/lifecycle.txt"
