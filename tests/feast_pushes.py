"""Run by Feast's own Python (its venv), never by the project's: one Feast SDK process that
takes requests, one JSON line each on stdin, and answers each with one JSON line on stdout
(Feast's import takes most of its start: one process serves a whole test module).

    {"op": "push", "push_source_name": ..., "df": {column: [values]}, "to": "online"}
        -> FeatureStore.push(push_source_name, DataFrame(df), to=PushMode.ONLINE)
    {"op": "write", "feature_view_name": ..., "df": {...}}
        -> FeatureStore.write_to_online_store(feature_view_name, DataFrame(df))
    {"op": "read", "features": [...], "entity_rows": [...]}
        -> get_online_features(..., full_feature_names=True).to_dict()

Answers: {"ok": true} (a read: {"ok": <to_dict()>}), or {"error": <exception type>, "message":
<its text>} when Feast's SDK raised. The columns "event_timestamp" and "created" are ISO
times, made pandas UTC timestamps, as Feast's example's test_workflow.py builds its frame.
The FeatureStore (feature_store.yaml in the current directory) is made at the first request:
the process may start before that file and the registry are written.
"""

import json
import sys

import pandas as pd
from feast import FeatureStore
from feast.data_source import PushMode

TIMES = ("event_timestamp", "created")


def as_json(value):
    return sorted(value) if isinstance(value, set | frozenset) else str(value)


def frame(df: dict) -> pd.DataFrame:
    return pd.DataFrame(
        {name: pd.to_datetime(values, utc=True, format="ISO8601") if name in TIMES else values for name, values in df.items()}
    )


def answer(store: FeatureStore, request: dict):
    op = request["op"]
    if op == "push":
        store.push(request["push_source_name"], frame(request["df"]), to=PushMode[request.get("to", "online").upper()])
        return True
    if op == "write":
        store.write_to_online_store(request["feature_view_name"], frame(request["df"]))
        return True
    if op == "read":
        response = store.get_online_features(features=request["features"], entity_rows=request["entity_rows"], full_feature_names=True)
        return response.to_dict()
    raise ValueError(f"unknown op {op!r}")


out = sys.stdout
sys.stdout = sys.stderr  # whatever Feast prints goes to stderr: stdout carries the answers alone
store = None
for line in sys.stdin:
    store = store or FeatureStore(repo_path=".")
    try:
        reply = {"ok": answer(store, json.loads(line))}
    except Exception as exc:  # the SDK's refusal is the answer
        reply = {"error": type(exc).__name__, "message": str(exc)}
    out.write(json.dumps(reply, default=as_json) + "\n")
    out.flush()
