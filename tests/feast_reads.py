"""Run by Feast's own Python (its venv), never by the project's: Feast's SDK reads features
with `get_online_features` through the feature_store.yaml in the current directory and prints
what `to_dict()` returned as JSON, with event timestamps where the store gives them.

    feast-venv/bin/python feast_reads.py '{"features": [...], "entity_rows": [...]}'
    feast-venv/bin/python feast_reads.py '[{"features": ...}, ...]'   (one JSON line per request)
    feast-venv/bin/python feast_reads.py < requests.json              (the same, on stdin: many entities)

A set (Feast's Set types) prints as its sorted members, a time as its ISO text.
"""

import json
import sys

from feast import FeatureStore


def as_json(value):
    return sorted(value) if isinstance(value, set | frozenset) else str(value)


request = json.loads(sys.argv[1] if len(sys.argv) > 1 else sys.stdin.read())
store = FeatureStore(repo_path=".")
for one in request if isinstance(request, list) else [request]:
    response = store.get_online_features(features=one["features"], entity_rows=one["entity_rows"], full_feature_names=True)
    print(json.dumps(response.to_dict(include_event_timestamps=True), default=as_json))
