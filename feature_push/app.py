"""The server ``materialize serve`` runs: the feature server, taking pushes when
``server.push.enabled`` (off: it holds no writer credentials at all)."""

from __future__ import annotations

import os

from feature_reader.server import FeatureServer, server_reader
from fm_config import load_config

APP = "feature_push.app:build_app"


def build_app(conf=None) -> FeatureServer:
    """As feature_reader.server.build_app, with the push routes answered when push is on."""
    conf = conf or load_config(os.environ.get("FM_SERVE_ENV"))
    reader = server_reader(conf)
    if not conf.server.push.enabled:
        return FeatureServer(reader)
    from feature_push.handler import PushHandler  # Arrow and the writers: the [push] extra

    return FeatureServer(reader, push=PushHandler(conf, reader.defs, reader))
