"""Run in the user's Feast environment (not this project's): read a Feast repository with
Feast's own code and print its objects as JSON on stdout.

    cd REPO && FEAST_PYTHON - < feast_dump.py

Standard library and Feast only: it never imports this project. ``materialize import-feast``
feeds it to the interpreter of the user's Feast on stdin, in a fresh process whose working
directory is the repository, and maps the JSON to definition files in its own process.

As ``feast apply`` does: the repository is put on ``sys.path`` and every Python file in it
is imported (``feast.repo_operations.parse_repo``), then the feature views' missing types are
inferred from their sources (``feast.inference``), which reads the sources' schemas. Nothing is
applied: no registry, online or offline store is written.

Whatever the repository's code prints goes to stderr, so stdout holds only the JSON. A
failure is reported as ``{"error": {...}}`` naming the user's file and line.
"""

import sys

# The working directory (the repository) must not shadow the standard library or Feast: a
# repository file named json.py or feast.py. Feast's CLI appends the repository to sys.path.
sys.path[:] = [p for p in sys.path if p not in ("", ".")]

import json  # noqa: E402
import os  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402

FORMAT = 1
"""Version of the JSON shape; the reading side refuses another."""


def _one_line(text):
    return " ".join(str(text).split())


def _where(exc, repo):
    """(file relative to the repository, line) of the deepest frame in the user's files."""
    if isinstance(exc, SyntaxError) and exc.filename:
        path = os.path.abspath(exc.filename)
        if path.startswith(repo + os.sep):
            return os.path.relpath(path, repo), exc.lineno
    found = (None, None)
    for frame in traceback.extract_tb(exc.__traceback__):
        path = os.path.abspath(frame.filename)
        if path.startswith(repo + os.sep) and os.sep + "site-packages" + os.sep not in path:
            found = (os.path.relpath(path, repo), frame.lineno)
    return found


def _error(kind, message, file=None, line=None):
    return {"format": FORMAT, "error": {"kind": kind, "message": _one_line(message), "file": file, "line": line}}


def _field(f):
    from feast.types import from_feast_type

    try:
        value_type = from_feast_type(f.dtype).name
    except Exception:  # a type Feast itself cannot name as a value type
        value_type = "UNKNOWN"
    out = {"name": f.name, "dtype": str(f.dtype), "value_type": value_type}
    if getattr(f, "vector_length", 0):
        out["vector_length"] = int(f.vector_length)
    if f.description:
        out["description"] = f.description
    return out


def _source(ds):
    if ds is None:
        return None
    out = {
        "class": type(ds).__name__,
        "name": ds.name,
        "timestamp_field": ds.timestamp_field or "",
        "created_timestamp_column": ds.created_timestamp_column or "",
        "field_mapping": dict(sorted((ds.field_mapping or {}).items())),
        "date_partition_column": getattr(ds, "date_partition_column", None) or "",
    }
    kind = type(ds).__name__
    if kind == "FileSource":
        out["path"] = ds.path
        out["file_format"] = None if ds.file_format is None else str(ds.file_format)
        options = getattr(ds, "file_options", None)
        out["s3_endpoint_override"] = getattr(options, "s3_endpoint_override", None) or None
    elif kind == "SparkSource":
        table_format = getattr(ds, "table_format", None)
        format_type = getattr(table_format, "format_type", None)
        out.update(
            table=ds.table or None,
            query=ds.query or None,
            path=ds.path or None,
            file_format=ds.file_format or None,
            table_format=None if format_type is None else str(getattr(format_type, "value", format_type)),
        )
    batch = getattr(ds, "batch_source", None)
    if batch is not None:
        out["batch_source"] = _source(batch)
    return out


def _view(fv, entities, config, provider):
    from feast.feature_view import DUMMY_ENTITY_NAME
    from feast.inference import (
        update_data_sources_with_inferred_event_timestamp_col,
        update_feature_views_with_inferred_features_and_entities,
    )

    out = {"class": type(fv).__name__, "name": fv.name, "inference_error": None}
    # What `feast apply` infers from the source: the timestamp field, the join keys' types,
    # the features of a view without a schema. Per view, so one unreadable source costs only its view.
    if config is not None and fv.batch_source is not None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                update_data_sources_with_inferred_event_timestamp_col([fv.batch_source], config)
                update_feature_views_with_inferred_features_and_entities(provider, [fv], entities, config)
        except Exception as exc:
            out["inference_error"] = f"{type(exc).__name__}: {_one_line(exc)}"[:500]
    out.update(
        entities=[e for e in fv.entities if e != DUMMY_ENTITY_NAME],
        entity_columns=[_field(f) for f in fv.entity_columns],
        features=[_field(f) for f in fv.features],
        ttl_seconds=None if fv.ttl is None else fv.ttl.total_seconds(),
        online=bool(fv.online),
        enabled=bool(getattr(fv, "enabled", True)),
        description=fv.description or "",
        derived_from=sorted(v.name for v in (getattr(fv, "source_views", None) or [])),
        transformation=bool(getattr(fv, "udf", None) or getattr(fv, "feature_transformation", None)),
        batch_source=_source(fv.batch_source),
        stream_source=_source(fv.stream_source),
    )
    return out


def _service(fs):
    return {
        "name": fs.name,
        "description": fs.description or "",
        "projections": [
            {
                "feature_view": p.name,
                "name_to_use": p.name_to_use(),
                "name_alias": p.name_alias or None,
                "join_key_map": dict(sorted((p.join_key_map or {}).items())),
                "features": [f.name for f in p.features],
            }
            for p in fs.feature_view_projections
        ],
        # "view:feature" strings given to features=: Feast resolves them at apply
        "pending_refs": [str(r) for r in (getattr(fs, "_pending_feature_refs", None) or [])],
    }


def dump(repo):
    repo = os.path.realpath(repo)
    os.chdir(repo)  # parse_repo names modules by their path relative to the working directory
    sys.path.append(repo)  # as Feast's CLI does
    sys.dont_write_bytecode = True
    try:
        import feast
        from feast.feature_view import DUMMY_ENTITY_NAME
        from feast.repo_operations import parse_repo
    except ImportError as exc:
        return _error("no_feast", f"{sys.executable} cannot import Feast: {_one_line(exc)}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from pathlib import Path

            contents = parse_repo(Path(repo))
    except BaseException as exc:  # SystemExit from a user's file too: it is the repository that failed
        if isinstance(exc, KeyboardInterrupt):
            raise
        file, line = _where(exc, repo)
        return _error("load", f"{type(exc).__name__}: {_one_line(exc)}", file, line)

    config, provider, config_error = None, None, None
    try:
        from pathlib import Path

        from feast.infra.provider import get_provider
        from feast.repo_config import load_repo_config

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = load_repo_config(Path(repo), Path(repo) / "feature_store.yaml")
            provider = get_provider(config)
    except Exception as exc:  # the definitions still load; only what needs inference is missed
        # the type only: Feast's message may quote the file's values, a password among them
        config, provider, config_error = None, None, type(exc).__name__

    entities = list(contents.entities)
    views = [_view(fv, entities, config, provider) for fv in contents.feature_views]
    views += [_view(fv, entities, config, provider) for fv in contents.stream_feature_views]
    return {
        "format": FORMAT,
        "feast_version": getattr(feast, "__version__", "unknown"),
        "config_error": config_error,
        "entities": [
            {"name": e.name, "join_key": e.join_key, "value_type": e.value_type.name, "description": e.description or ""}
            for e in contents.entities
            if e.name != DUMMY_ENTITY_NAME  # parse_repo always adds Feast's placeholder entity
        ],
        "feature_views": views,
        "on_demand_feature_views": [{"name": v.name} for v in contents.on_demand_feature_views],
        "label_views": [{"name": v.name} for v in getattr(contents, "label_views", [])],
        "feature_services": [_service(fs) for fs in contents.feature_services],
        "data_sources": [_source(ds) for ds in contents.data_sources],
    }


def main(argv):
    real_stdout = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # the repository's own prints (and C extensions') go to stderr
    sys.stdout = sys.stderr
    try:
        out = dump(argv[1] if len(argv) > 1 else ".")
    except Exception as exc:  # a failure of this script or of Feast itself, not of the repository
        out = _error("internal", f"{type(exc).__name__}: {_one_line(exc)}")
        traceback.print_exc()
    real_stdout.write(json.dumps(out, sort_keys=True, ensure_ascii=True, default=str))
    real_stdout.write("\n")
    real_stdout.flush()
    return 1 if "error" in out else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
