"""The soak's report from its raw material: per fault, and over the whole soak, against the goals."""

from __future__ import annotations

P99_GOALS_MS = {1: 2.0, 100: 10.0}
"""The serving targets (bench/serve_load.py `targets`, bench/README.md "The feature server"):
1 x 50 p99 <= 2 ms at 1,000/s, 100 x 50 p99 <= 10 ms at 100/s, cache off, on an idle core."""
RECOVERY_GOAL_S = 2.0
RSS_GROWTH_GOAL = 0.10
GAP = 1.0
"""Seconds without an error (a few hundred requests) that mark a recovery's end."""
STREAM, SCHED, LATENCY, STATUS, OLD, NEW, ABSENT, WRONG = range(8)


def _p(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 3)


def _recovered(errors: list[float], back: float, until: float) -> tuple[float, bool]:
    """When the errors after the store came back stopped: the first error-free GAP seconds
    after ``back`` begins at the returned time (a stray error later, as a busy machine makes,
    is counted outside the windows, not as a slow recovery). True when still failing at ``until``."""
    last = back
    for t in errors:
        if t - last > GAP:
            break
        last = t
    return last, until - last <= GAP


def analyse(raw: dict, allowance: float) -> dict:
    """``allowance``: seconds after a store is back in which errors still count as the fault's."""
    records, windows, streams = raw["records"], raw["windows"], raw["streams"]
    bounds = [(w["start"], w["back"] + allowance) for w in windows]

    def inside(r: list) -> bool:
        """In flight at some point of a window (+ allowance): sent before its end, answered after its start."""
        return any(r[SCHED] <= b and r[SCHED] + r[LATENCY] / 1000 >= a for a, b in bounds)

    errors = [r for r in records if r[STATUS] != 200]
    nightly = next((w["start"] for w in windows if w["name"] == "nightly run"), None)
    # an answer with the new values before the nightly run began is wrong too
    early_new = sum(r[NEW] for r in records if r[NEW] and (nightly is None or r[SCHED] < nightly))
    faults = []
    for i, w in enumerate(windows):
        until = windows[i + 1]["start"] if i + 1 < len(windows) else raw["end"]
        mine = [r for r in records if r[SCHED] + r[LATENCY] / 1000 >= w["start"] and r[SCHED] < until]
        failed = [r for r in mine if r[STATUS] != 200]
        recovered, persisted = _recovered(sorted(r[SCHED] for r in failed if r[SCHED] > w["back"]), w["back"], until)
        recovery = round(recovered - w["back"], 2)
        statuses: dict[str, int] = {}
        for r in failed:
            statuses[str(r[STATUS])] = statuses.get(str(r[STATUS]), 0) + 1
        faults.append({
            "fault": w["name"], "window_seconds": round(w["back"] - w["start"], 2), "requests": len(mine),
            "errors": len(failed), "error_statuses": statuses,
            "errors_after_allowance": sum(1 for r in failed if r[SCHED] > w["back"] + allowance),
            "recovery_seconds": None if persisted else recovery, "status_500": sum(1 for r in mine if r[STATUS] == 500),
            "wrong_entities": sum(r[WRONG] for r in mine), "new_values_served": sum(r[NEW] for r in mine), **w["notes"],
        })  # fmt: skip
    p99 = {}
    for shape in sorted({s["shape"] for s in streams}):
        ids = {i for i, s in enumerate(streams) if s["shape"] == shape}
        quiet = [r[LATENCY] for r in records if r[STREAM] in ids and raw["warmed"] <= r[SCHED] and not inside(r)]
        p99[shape] = {"requests": len(quiet), "p50_ms": _p(quiet, 0.5), "p99_ms": _p(quiet, 0.99), "goal_ms": P99_GOALS_MS[shape]}
    by_stream = []
    for i, s in enumerate(streams):
        mine = [r for r in records if r[STREAM] == i]
        by_stream.append({**s, "requests": len(mine), "ok": sum(1 for r in mine if r[STATUS] == 200),
                          "entities_checked": sum(r[OLD] + r[NEW] + r[ABSENT] + r[WRONG] for r in mine)})  # fmt: skip
    rss = {}
    for name, series in raw["rss_mib"].items():
        warm = [v for t, v in series if t >= raw["warmed"] and v]
        if warm:
            rss[name] = {"after_warm_up_mib": round(warm[0], 1), "end_mib": round(warm[-1], 1), "max_mib": round(max(warm), 1),
                         "growth": round(warm[-1] / warm[0] - 1, 4)}  # fmt: skip
    outside = [r for r in errors if not inside(r)]
    return {
        "requests": len(records), "answers_200": sum(1 for r in records if r[STATUS] == 200),
        "entities_checked": sum(r[OLD] + r[NEW] + r[ABSENT] + r[WRONG] for r in records), "checked": "every 200 answer, every entity",
        "wrong_entities": sum(r[WRONG] for r in records), "new_values_before_the_nightly_run": early_new,
        "status_500": sum(1 for r in records if r[STATUS] == 500), "errors": len(errors),
        "errors_outside_windows": len(outside),
        "errors_outside_windows_first": [{"at_s": round(r[SCHED] - raw["start"], 2), "status": r[STATUS]} for r in outside[:10]],
        "allowance_seconds": allowance, "faults": faults, "p99_outside_windows": p99, "streams": by_stream, "rss": rss,
        "shutdown_seconds": raw["shutdown_seconds"], "machine": raw.get("machine"), "rss_series_mib": raw["rss_mib"],
        "wrong_detail": raw["wrong_detail"], "error_samples": raw["error_samples"],
    }  # fmt: skip


def goals(report: dict) -> list[dict]:
    rows = [
        ("wrong values (entities), whole soak", report["wrong_entities"] + report["new_values_before_the_nightly_run"], "0",
         lambda v: v == 0),
        ("500 answers, whole soak", report["status_500"], "0", lambda v: v == 0),
        (f"errors outside the fault windows (+ {report['allowance_seconds']:g} s)", report["errors_outside_windows"], "0",
         lambda v: v == 0),
    ]  # fmt: skip
    for f in report["faults"]:
        if "clients" in f:  # the fault is on other clients: the load should not see it at all
            rows.append((f"{f['fault']}: errors while they hold connections", f["errors"], "0", lambda v: v == 0))
        if "job_exit" in f:
            rows.append(("nightly run: the job succeeded (its exit code)", f["job_exit"], "0", lambda v: v == 0))
        rows.append((f"{f['fault']}: seconds to recover after the store is back", f["recovery_seconds"], f"<= {RECOVERY_GOAL_S:g}",
                     lambda v: v is not None and v <= RECOVERY_GOAL_S))  # fmt: skip
    for name, r in report["rss"].items():
        rows.append((f"server RSS growth over the soak ({name}: {r['after_warm_up_mib']} -> {r['end_mib']} MiB)",
                     r["growth"], f"<= {RSS_GROWTH_GOAL:g}", lambda v: v <= RSS_GROWTH_GOAL))  # fmt: skip
    for shape, p in report["p99_outside_windows"].items():
        rows.append((f"{shape} x 50: p99 outside the fault windows (ms)", p["p99_ms"], f"<= {p['goal_ms']:g}",
                     lambda v, g=p["goal_ms"]: v is not None and v <= g))  # fmt: skip
    return [{"target": t, "measured": m, "goal": g, "met": bool(ok(m))} for t, m, g, ok in rows]


def print_faults(report: dict) -> None:
    print(f"\n{'fault':<30} {'window s':>8} {'requests':>8} {'errors':>7} {'statuses':<28} {'recover s':>9} {'500s':>5} {'wrong':>6}")
    for f in report["faults"]:
        statuses = ", ".join(f"{k}: {v}" for k, v in sorted(f["error_statuses"].items()))
        recovery = "NOT" if f["recovery_seconds"] is None else f"{f['recovery_seconds']:.2f}"
        print(f"{f['fault']:<30} {f['window_seconds']:>8.1f} {f['requests']:>8} {f['errors']:>7} {statuses[:28]:<28} "
              f"{recovery:>9} {f['status_500']:>5} {f['wrong_entities']:>6}")  # fmt: skip
