#!/usr/bin/env bash
# spark-submit for --deploy-mode cluster on a standalone master, exiting with the driver's outcome
# (sinks/README.md "Cluster deploy mode"). Spark 4.2's spark-submit waits for the driver
# (spark.standalone.submit.waitAppCompletion=true) but then exits 0 whatever its final state
# ("State of driver driver-... is FAILED, exiting spark-submit JVM."): a scheduler would call a
# failed run a success. This runs it with the same arguments and exits 1 unless the last state
# it reported is FINISHED. spark-submit's stderr is merged into stdout. SPARK_SUBMIT: the
# spark-submit to run (default: this checkout's .venv).
set -uo pipefail
SUBMIT="${SPARK_SUBMIT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv/bin/spark-submit}"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$SUBMIT" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || exit "$rc"
grep -q -- "--deploy-mode cluster\|--deploy-mode=cluster" <<<"$*" || exit 0  # client mode: spark-submit's status is the job's
last=$(grep -oE "State of driver [^ ]+ is [A-Z]+" "$log" | tail -1)
driver=$(awk '{print $4}' <<<"$last")
state=$(awk '{print $NF}' <<<"$last")
case "$state" in
  FINISHED) exit 0 ;;
  "") echo "submit-cluster: spark-submit reported no final driver state (is spark.standalone.submit.waitAppCompletion=true set?)" >&2 ;;
  *) echo "submit-cluster: driver $driver ended $state; its output is in the worker's work/$driver/stdout" >&2 ;;
esac
exit 1
