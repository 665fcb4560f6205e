#!/usr/bin/env bash
# The whole suite in two lanes at once (`make test`): the tests marked `spark` (the Spark
# session fixture, or a JVM of their own) in one pytest process, so one Spark session serves
# them all, and every other test in another. The other lane spends most of its time waiting
# on the servers it starts, so the two share 2 cores well. The Spark lane prints as it goes;
# the other lane's output is printed whole when it ends. Arguments go to both pytests.
# Each lane lists its slowest tests (--durations): where the suite's time goes; the end, the
# CPU time both used, a measure that does not depend on how busy the machine is.
# Exit status: 0 when both lanes pass, else the first failing lane's.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT

"$PY" -m pytest -m "not spark" --durations=30 --durations-min=5 --basetemp "$work/other" "$@" > "$work/other.log" 2>&1 &
other=$!
{ PYTHONUNBUFFERED=1 "$PY" -m pytest -m spark -n "${SPARK_WORKERS:-2}" --dist loadfile --durations=40 --durations-min=5 --basetemp "$work/spark" "$@" 2>&1; echo $? > "$work/spark.rc"; } | sed -u 's/^/[spark] /' &
spark=$!

wait "$other"; other_rc=$?
echo "===== tests without Spark (exit $other_rc) ====="
cat "$work/other.log"
echo "===== tests without Spark: end ====="
wait "$spark"; spark_rc=$(cat "$work/spark.rc" 2>/dev/null || echo 1)
wait  # every child reaped: its CPU time counted below
# The CPU the lanes used (both, their pytests and whatever those waited for: JVMs, CLI runs,
# venvs; not the servers that run detached, such as PostgreSQL): unlike the wall time, it
# does not grow when other work shares the machine.
read -r -a stat < /proc/$$/stat
echo "===== CPU time of the lanes: $(( (stat[15] + stat[16]) / $(getconf CLK_TCK) )) s (user and system) in ${SECONDS} s ====="

ok() { [ "$1" -eq 0 ] || [ "$1" -eq 5 ]; }  # 5: a lane with no test selected (arguments such as -k)
ok "$other_rc" || exit "$other_rc"
ok "$spark_rc" || exit "$spark_rc"
exit 0
