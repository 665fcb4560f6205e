"""The feature definitions: ``defs`` (list, lock), ``import-feast`` and ``sample-data``."""

from __future__ import annotations

import argparse
import datetime as dt
import sys

from jobs.cli.common import common_flags, date_arg, load
from jobs.exit_codes import (
    EXIT_OK,
    EXIT_USAGE,
)


def add_defs(sub) -> None:
    defs = sub.add_parser(
        "defs",
        help="check the feature definitions and list field ids",
        description="Load and check feature_defs; print every feature with its type, options, stored name and field id. "
        "With --lock, record the definitions in feature_defs/stored.lock (what the stores hold under each stored name): "
        "new features, safe changes (int -> float, renames that keep their stored_as) and removals; a change that would "
        "make old values read differently is refused, one line per feature with the way forward.",
    )
    common_flags(defs)
    defs.add_argument("--source", help="only this source")
    defs.add_argument("--lock", action="store_true", help="write feature_defs/stored.lock from the definitions (commit it with them)")


def add_import_feast(sub) -> None:
    imp = sub.add_parser(
        "import-feast",
        help="write definition files from a Feast repository (read by Feast's own code)",
        description="Read a Feast repository (the folder of its feature_store.yaml) with Feast's own code, run by the\n"
        "Python of your Feast environment in a fresh process (nothing is applied to Feast's registry or stores),\n"
        "and write its definitions: entities.yaml, one source per feature view under the view's name (so Feast's\n"
        "references such as driver_hourly_stats:conv_rate keep working), feature_services.yaml, stored.lock, and\n"
        "IMPORTED.md, which lists every choice and everything left out with the reason (printed here too).\n"
        "The files are checked as every command loads them before anything is written; importing again writes\n"
        "only what changed, and refuses a change of type that the stored values cannot follow. Point the job at\n"
        "the folder with definitions_dir in the env's config. The mapping: feature_defs/feast_import/README.md.",
        epilog="Examples:\n  materialize import-feast my_project/feature_repo\n"
        "  materialize import-feast ~/repos/features/feature_repo --out /srv/features/defs --feast-python ~/venvs/feast/bin/python",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    imp.add_argument("repo", metavar="REPO", help="the Feast repository: the folder of its feature_store.yaml")
    imp.add_argument(
        "--out", metavar="DIR", help="where to write the definitions (default: feast_defs/<project> under the working directory)"
    )
    imp.add_argument(
        "--feast-python", metavar="PY",
        help="the Python of your Feast environment (default: the one that runs the `feast` command on PATH)",
    )  # fmt: skip
    imp.add_argument(
        "--allow-missing-data", action="store_true",
        help="import even when a source path on this machine does not exist yet (each is listed); by default that stops the import",
    )  # fmt: skip
    imp.add_argument("--timeout", type=float, metavar="SECONDS", help="how long Feast may take to read the repository (default 300)")


def add_sample_data(sub) -> None:
    sample = sub.add_parser(
        "sample-data",
        help="write the deterministic sample Delta tables",
        description="(Re)write the sample ETL tables consumer_daily and store_features_long.",
    )
    common_flags(sample)
    sample.add_argument("--days", type=int, default=5, help="number of dates (default 5)")
    sample.add_argument("--end", type=date_arg, default=dt.date(2026, 11, 20), help="last date (default 2026-11-20)")
    sample.add_argument("--consumers", type=int, default=2000, help="consumers per date (default 2000)")
    sample.add_argument("--stores", type=int, default=300, help="stores per date (default 300)")


def cmd_defs(args) -> int:
    conf, defs = load(args, expectations=True)
    if args.lock:
        from feature_defs import DEFAULT_DIR

        return _lock_defs(conf.path(conf.definitions_dir) or DEFAULT_DIR, defs)
    from serializers import field_id_int, freshness_field_name

    if defs.lock is None:
        print("warning: no feature_defs/stored.lock: changes of type or options cannot be checked; write it with `materialize defs --lock`")

    for source in defs.sources.values():
        if args.source and source.name != args.source:
            continue
        entity = defs.entity_of(source)
        print(
            f"{source.name}  (entity {entity.name}, key {entity.prefix}:<{':'.join(k.name for k in entity.keys)}>, layout {source.layout})"
        )
        print(f"  {freshness_field_name(source.name):<34} {'freshness':<12} field id {field_id_int(freshness_field_name(source.name)):>10}")
        for f in source.features:
            opts = ", ".join(f"{k}={v}" for k, v in f.options.items())
            stored = f"  stored as {f.stored_name}" if f.stored_as else ""
            print(f"  {f.name:<34} {f.type:<12} field id {f.field_id:>10}  {opts}{stored}")
    return EXIT_OK


def _lock_defs(directory, defs) -> int:
    """``defs --lock``: record what is lockable; refuse (writing nothing) what is not."""
    from feature_defs import DefinitionError
    from feature_defs.stored_lock import LOCK_NAME, changes, locked, write_lock

    found = changes(defs, defs.lock) if defs.lock else []
    refused = [c for c in found if not c.lockable]
    if refused:
        raise DefinitionError([c.line() for c in refused] + [f"nothing written to {directory / LOCK_NAME}"])
    lock = locked(defs, defs.lock)
    path = write_lock(directory, lock)
    for c in found:
        print(f"  {c.where}: {c.text}")
    names = sum(len(n) for n in lock.entities.values())
    print(f"{'wrote' if defs.lock is None else 'updated'} {path}: {names} stored names, {len(found)} change(s)")
    return EXIT_OK


def cmd_import_feast(args) -> int:
    from feature_defs.feast_import import DEFAULT_TIMEOUT, FeastImportError, import_feast, report

    timeout = DEFAULT_TIMEOUT if args.timeout is None else args.timeout  # 0 is refused, not the default
    try:
        done = import_feast(args.repo, args.out, args.feast_python, args.allow_missing_data, timeout)
    except FeastImportError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    print("\n".join(report(done)))
    return EXIT_OK


def cmd_sample_data(args) -> int:
    from jobs.sample_data import sample_dates, write_sample_tables
    from jobs.spark import build_spark

    conf, defs = load(args)
    spark = build_spark(conf.spark, conf.locations(defs))
    dates = sample_dates(args.days, args.end)
    counts = write_sample_tables(spark, conf.data_path, dates, args.consumers, args.stores)
    for table, rows in counts.items():
        print(f"wrote {rows:,} rows to {conf.data_path / table} ({dates[0]} .. {dates[-1]})")
    return EXIT_OK
