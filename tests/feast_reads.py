"""Run by Feast's own Python (its venv), never by the project's: Feast's SDK reads features
with `get_online_features` through the feature_store.yaml in the current directory and prints
what `to_dict()` returned as JSON, with event timestamps where the store gives them.

    feast-venv/bin/python feast_reads.py '{"features": [...], "entity_rows": [...]}'
"""

import json
import sys

from feast import FeatureStore

request = json.loads(sys.argv[1])
store = FeatureStore(repo_path=".")
response = store.get_online_features(features=request["features"], entity_rows=request["entity_rows"], full_feature_names=True)
print(json.dumps(response.to_dict(include_event_timestamps=True), default=str))
