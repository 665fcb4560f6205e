"""The soak's report from its raw material: per fault, and over the whole soak, against the goals."""

from __future__ import annotations

P99_GOALS_MS = {1: 2.0, 100: 10.0}
"""The serving targets (bench/serve_load.py `targets`, bench/README.md "The feature server"):
1 x 50 p99 <= 2 ms at 1,000/s, 100 x 50 p99 <= 10 ms at 100/s, cache off, on an idle core."""
RECOVERY_GOAL_S = 2.0
RSS_GROWTH_GOAL = 0.10
LEVEL_WINDOW, LEVEL_GROWTH = 10.0, 0.02
"""The cache has levelled off when its bytes grew at most 2% over the last 10 s."""
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


def working_set(series: list, start: float, at: float, window: float = LEVEL_WINDOW) -> dict:
    """Whether the cache's bytes (``series``: (time, entries, bytes) from /metrics) have levelled
    off by ``at``: their mean over the last 5 s is at most LEVEL_GROWTH above their value
    ``window`` s earlier. The working-set time: seconds from ``start`` (the load's) until the
    bytes first reached (1 - LEVEL_GROWTH) of that level."""
    points = [(t, e, b) for t, e, b in series if start <= t <= at and b is not None]
    last = [p for p in points if p[0] > at - 5]
    earlier = [p for p in points if p[0] <= at - window]
    if not last or not earlier:
        return {"levelled": False, "working_set_seconds": None}
    level = sum(p[2] for p in last) / len(last)
    growth = level / earlier[-1][2] - 1 if earlier[-1][2] else float("inf")
    reached = next((t for t, _, b in points if b >= (1 - LEVEL_GROWTH) * level), None)
    levelled = growth <= LEVEL_GROWTH
    return {
        "levelled": levelled, "growth_over_the_last_window": round(growth, 4), "window_seconds": window,
        "level_bytes": round(level), "level_entries": round(sum(p[1] for p in last) / len(last)),
        "working_set_seconds": round(reached - start, 1) if levelled and reached is not None else None,
    }  # fmt: skip


def _warm_up(raw: dict) -> dict:
    series = raw.get("cache", {}).get("standalone", [])
    return {"warm_up_seconds": round(raw["warmed"] - raw["start"], 1), "entry_lifetime_seconds": raw.get("entry_lifetime_seconds"),
            **working_set(series, raw["start"], raw["warmed"])}  # fmt: skip


def _near(series: list, t: float) -> tuple | None:
    """The sample of ``series`` nearest ``t``."""
    return min(series, key=lambda p: abs(p[0] - t), default=None)


def _rss(raw: dict) -> dict:
    """Per server: RSS at the warm-up's end (the first sample after it), at the end, the max;
    for the standalone server, the max in each phase and the cache's bytes beside it."""
    rss = {}
    hostile = next((w for w in raw["windows"] if w["name"] == "hostile clients"), None)
    for name, series in raw["rss_mib"].items():
        warm = [(t, v) for t, v in series if t >= raw["warmed"] and v]
        if not warm:
            continue
        w0 = warm[0][1]
        r = rss[name] = {"after_warm_up_mib": round(w0, 1), "end_mib": round(warm[-1][1], 1), "max_mib": round(max(v for _, v in warm), 1),
                         "growth": round(warm[-1][1] / w0 - 1, 4)}  # fmt: skip
        cache = raw.get("cache", {}).get(name, [])
        if cache:
            r["cache_mib_after_warm_up"] = round((_near(cache, warm[0][0])[2] or 0) / 2**20, 1)
        if hostile is None or name != "standalone":
            continue
        phases = {"before_hostile": (raw["warmed"], hostile["start"]), "hostile": (hostile["start"], hostile["back"]),
                  "after_hostile": (hostile["back"], raw["end"] + 5)}  # fmt: skip
        unsent = raw.get("unsent_bytes", {}).get(name, [])
        for phase, (a, b) in phases.items():
            inside = [(t, v) for t, v in warm if a <= t < b]
            if inside:
                t, v = max(inside, key=lambda p: p[1])
                at = _near(cache, t) if cache else None
                r[f"max_{phase}_mib"] = round(v, 1)
                r[f"max_{phase}_at_s"] = round(t - raw["start"], 1)
                r[f"cache_mib_at_max_{phase}"] = round((at[2] or 0) / 2**20, 1) if at else None
                waiting = [u for t, u in unsent if a <= t < b and u is not None]
                r[f"unsent_mib_max_{phase}"] = round(max(waiting) / 2**20, 1) if waiting else None
        through = [v for t, v in warm if t >= hostile["start"]]
        r["max_hostile_and_after_over_warm_up"] = round(max(through) / w0, 4) if through else None
    return rss


def _recovery(failed: list, back: float, until: float) -> float | None:
    """Seconds from ``back`` to the end of the errors after it (None: still failing at ``until``)."""
    recovered, persisted = _recovered(sorted(r[SCHED] for r in failed if r[SCHED] > back), back, until)
    return None if persisted else round(recovered - back, 2)


def _by_server(failed: list, streams: list[dict], back: float | None = None, until: float | None = None) -> dict[str, dict]:
    """Per server: its errors, and (given ``back``) its recovery: a fault on one server's store says nothing of the other's."""
    out: dict[str, dict] = {}
    for server in sorted({streams[r[STREAM]]["server"] for r in failed}):
        mine = [r for r in failed if streams[r[STREAM]]["server"] == server]
        out[server] = {"errors": len(mine)} if back is None else {"errors": len(mine), "recovery_seconds": _recovery(mine, back, until)}
    return out


def _faults(raw: dict, allowance: float) -> list[dict]:
    records, windows = raw["records"], raw["windows"]
    out = []
    for i, w in enumerate(windows):
        until = windows[i + 1]["start"] if i + 1 < len(windows) else raw["end"]
        mine = [r for r in records if r[SCHED] + r[LATENCY] / 1000 >= w["start"] and r[SCHED] < until]
        failed = [r for r in mine if r[STATUS] != 200]
        statuses: dict[str, int] = {}
        for r in failed:
            statuses[str(r[STATUS])] = statuses.get(str(r[STATUS]), 0) + 1
        out.append({
            "fault": w["name"], "window_seconds": round(w["back"] - w["start"], 2), "requests": len(mine),
            "errors": len(failed), "error_statuses": statuses, "by_server": _by_server(failed, raw["streams"], w["back"], until),
            "errors_after_allowance": sum(1 for r in failed if r[SCHED] > w["back"] + allowance),
            "recovery_seconds": _recovery(failed, w["back"], until), "status_500": sum(1 for r in mine if r[STATUS] == 500),
            "wrong_entities": sum(r[WRONG] for r in mine), "new_values_served": sum(r[NEW] for r in mine),
            "reads_p99_ms": _p99_by_shape(raw, [r for r in mine if r[SCHED] <= w["back"]]), **w["notes"],
        })  # fmt: skip
    return out


def _p99_by_shape(raw: dict, records: list) -> dict[int, float | None]:
    """The reads' p99 latency (ms) per request shape among ``records`` (those answered 200)."""
    shapes = {i: s["shape"] for i, s in enumerate(raw["streams"])}
    return {shape: _p([r[LATENCY] for r in records if shapes[r[STREAM]] == shape and r[STATUS] == 200], 0.99)
            for shape in sorted(set(shapes.values()))}  # fmt: skip


def _p99(raw: dict, inside) -> dict:
    records, streams = raw["records"], raw["streams"]
    p99 = {}
    for shape in sorted({s["shape"] for s in streams}):
        ids = {i for i, s in enumerate(streams) if s["shape"] == shape}
        quiet = [r[LATENCY] for r in records if r[STREAM] in ids and raw["warmed"] <= r[SCHED] and not inside(r)]
        p99[shape] = {"requests": len(quiet), "p50_ms": _p(quiet, 0.5), "p99_ms": _p(quiet, 0.99), "goal_ms": P99_GOALS_MS[shape]}
    return p99


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
    by_stream = []
    for i, s in enumerate(streams):
        mine = [r for r in records if r[STREAM] == i]
        by_stream.append({**s, "requests": len(mine), "ok": sum(1 for r in mine if r[STATUS] == 200),
                          "entities_checked": sum(r[OLD] + r[NEW] + r[ABSENT] + r[WRONG] for r in mine)})  # fmt: skip
    outside = [r for r in errors if not inside(r)]
    return {
        "requests": len(records), "answers_200": sum(1 for r in records if r[STATUS] == 200),
        "entities_checked": sum(r[OLD] + r[NEW] + r[ABSENT] + r[WRONG] for r in records), "checked": "every 200 answer, every entity",
        "wrong_entities": sum(r[WRONG] for r in records), "new_values_before_the_nightly_run": early_new,
        "status_500": sum(1 for r in records if r[STATUS] == 500), "errors": len(errors),
        "errors_outside_windows": len(outside), "errors_outside_windows_by_server": _by_server(outside, streams),
        "errors_outside_windows_first": [{"at_s": round(r[SCHED] - raw["start"], 2), "status": r[STATUS]} for r in outside[:10]],
        "allowance_seconds": allowance, "warm_up": _warm_up(raw), "faults": _faults(raw, allowance),
        "p99_outside_windows": _p99(raw, inside),
        "streams": by_stream, "rss": _rss(raw), "shutdown_seconds": raw["shutdown_seconds"], "machine": raw.get("machine"),
        "rss_series_mib": raw["rss_mib"], "cache_series": raw.get("cache", {}), "unsent_bytes_series": raw.get("unsent_bytes", {}),
        "jwks_fetches": raw.get("jwks_fetches", []),
        "wrong_detail": raw["wrong_detail"], "error_samples": raw["error_samples"], "error_samples_last": raw.get("error_samples_last", {}),
    }  # fmt: skip


def goals(report: dict) -> list[dict]:
    rows = [
        ("wrong values (entities), whole soak", report["wrong_entities"] + report["new_values_before_the_nightly_run"], "0",
         lambda v: v == 0),
        ("500 answers, whole soak", report["status_500"], "0", lambda v: v == 0),
        (f"errors outside the fault windows (+ {report['allowance_seconds']:g} s)", report["errors_outside_windows"], "0",
         lambda v: v == 0),
    ]  # fmt: skip
    warm = report.get("warm_up", {})
    if warm.get("level_bytes") is not None:
        ws = warm["working_set_seconds"]
        rows.append((f"warm-up covers the cache's working-set time (warm-up {warm['warm_up_seconds']:g} s; working set "
                     f"{'not reached' if ws is None else f'{ws:g} s'})", ws, f"<= {warm['warm_up_seconds']:g}",
                     lambda v: v is not None and v <= warm["warm_up_seconds"]))  # fmt: skip
    for f in report["faults"]:
        rows += _fault_goals(f)
    for name, r in report["rss"].items():
        rows.append((f"server RSS growth over the soak ({name}: {r['after_warm_up_mib']} -> {r['end_mib']} MiB)",
                     r["growth"], f"<= {RSS_GROWTH_GOAL:g}", lambda v: v <= RSS_GROWTH_GOAL))  # fmt: skip
        if "max_hostile_and_after_over_warm_up" in r:
            top = max(r.get("max_hostile_mib", 0), r.get("max_after_hostile_mib", 0))
            rows.append((f"server RSS, max through the hostile phase and after / at the warm-up's end ({name}: {r['after_warm_up_mib']} "
                         f"-> {top} MiB)", r["max_hostile_and_after_over_warm_up"], f"<= {1 + RSS_GROWTH_GOAL:g}",
                         lambda v: v is not None and v <= 1 + RSS_GROWTH_GOAL))  # fmt: skip
    for shape, p in report["p99_outside_windows"].items():
        rows.append((f"{shape} x 50: p99 outside the fault windows (ms)", p["p99_ms"], f"<= {p['goal_ms']:g}",
                     lambda v, g=p["goal_ms"]: v is not None and v <= g))  # fmt: skip
    for f in report["faults"]:
        if "pushers" in f:  # the reads' p99 while pushes saturate their limit, over the quiet periods'
            for shape, p in report["p99_outside_windows"].items():
                inside, quiet = f["reads_p99_ms"].get(shape), p["p99_ms"]
                ratio = round(inside / quiet, 2) if inside is not None and quiet else None
                rows.append((f"{shape} x 50: reads' p99 while pushes saturate / outside the windows ({inside} / {quiet} ms)", ratio,
                             f"<= {PUSH_P99_RATIO_GOAL:g}", lambda v: v is not None and v <= PUSH_P99_RATIO_GOAL))  # fmt: skip
    return [{"target": t, "measured": m, "goal": g, "met": bool(ok(m))} for t, m, g, ok in rows]


PUSH_P99_RATIO_GOAL = 1.5
"""Reads' p99 while pushes saturate their limit, at most this over the quiet periods' (unchanged, with the
noise of 2 cores shared by the load, the server, the pushers and both stores)."""


REFUSED = ("400", "403", "413")
"""What the hostile token holders' bodies are answered: past max_features, not granted, past max_body_bytes."""


def _fault_goals(f: dict) -> list[tuple]:
    rows = []
    if "clients" in f:  # the fault is on other clients: the load should not see it at all
        rows.append((f"{f['fault']}: errors while they hold connections", f["errors"], "0", lambda v: v == 0))
    if "pushers" in f:  # pushes past their limit beside the reads: the reads should not see them
        answers = f["push_answers"]
        rows.append(("pushes saturated: read errors while they push", f["errors"], "0", lambda v: v == 0))
        rows.append((f"pushes saturated: pushes written and refused at their limit ({answers})",
                     answers.get("200", 0) > 0 and answers.get("503", 0) > 0, "both", lambda v: v))  # fmt: skip
    if "job_exit" in f:
        rows.append(("nightly run: the job succeeded (its exit code)", f["job_exit"], "0", lambda v: v == 0))
    if "refused_answers" in f:
        other = {k: v for k, v in f["refused_answers"].items() if k not in REFUSED and k != "bytes_sent"}
        shown = ", ".join(f"{k}: {v:,}" for k, v in sorted(f["refused_answers"].items()) if k in REFUSED)
        rows += [
            (f"hostile: token holders' huge bodies answered other than 400/403/413 ({shown})", sum(other.values()), "0", lambda v: v == 0),
            (f"hostile: non-reading clients held past the write deadline + 2 s (of {f['connections']} connections, "
             f"{f['reset_by_server']} reset)", f["held_past_the_write_deadline_plus_2_s"], "0", lambda v: v == 0),
            ("hostile: fresh tokens not answered 200 while the JWKS trickled",
             sum(v for k, v in f["fresh_tokens_while_trickling"].items() if k != "200"), "0", lambda v: v == 0),
            ("hostile: JWKS fetches while it trickled that the server did not cut off (of "
             f"{f['jwks_fetches_in_window']})", f["jwks_fetches_whole"] if f["jwks_fetches_in_window"] else None, "0",
             lambda v: v == 0),
        ]  # fmt: skip
    rows.append((f"{f['fault']}: seconds to recover after the store is back", f["recovery_seconds"], f"<= {RECOVERY_GOAL_S:g}",
                 lambda v: v is not None and v <= RECOVERY_GOAL_S))  # fmt: skip
    return rows


def print_faults(report: dict) -> None:
    head = f"{'fault':<30} {'window s':>8} {'requests':>8} {'errors':>7} {'statuses':<28} {'recover s':>9} {'500s':>5} {'wrong':>6}"
    print(f"\n{head}  errors by server")
    for f in report["faults"]:
        statuses = ", ".join(f"{k}: {v}" for k, v in sorted(f["error_statuses"].items()))
        servers = ", ".join(f"{k}: {v['errors']} (recovered {'NOT' if v['recovery_seconds'] is None else v['recovery_seconds']})"
                            for k, v in f.get("by_server", {}).items())  # fmt: skip
        recovery = "NOT" if f["recovery_seconds"] is None else f"{f['recovery_seconds']:.2f}"
        print(f"{f['fault']:<30} {f['window_seconds']:>8.1f} {f['requests']:>8} {f['errors']:>7} {statuses[:28]:<28} "
              f"{recovery:>9} {f['status_500']:>5} {f['wrong_entities']:>6}  {servers}")  # fmt: skip


def print_warm_up(report: dict) -> None:
    w = report.get("warm_up") or {}
    if w.get("level_bytes") is not None:
        print(f"\nwarm-up {w['warm_up_seconds']:g} s; the cache's working set reached after {w['working_set_seconds']} s "
              f"({w['level_entries']:,} entries, {w['level_bytes'] / 2**20:.1f} MiB; "
              f"an entry lives at most {w['entry_lifetime_seconds']} s)")  # fmt: skip
    for name, r in report["rss"].items():
        maxima = {k[4:-4].replace("_", " ") or "whole soak": v for k, v in r.items() if k.startswith("max_") and k.endswith("_mib")}
        phases = ", ".join(f"{k} {v}" for k, v in maxima.items())
        unsent = ", ".join(f"{k[15:].replace('_', ' ')} {v}" for k, v in r.items() if k.startswith("unsent_mib_max_") and v is not None)
        print(f"RSS {name}: {r['after_warm_up_mib']} MiB at the warm-up's end (cache {r.get('cache_mib_after_warm_up')} MiB), "
              f"{r['end_mib']} at the end; max MiB: {phases}" + (f"; unsent answers, max MiB: {unsent}" if unsent else ""))  # fmt: skip
