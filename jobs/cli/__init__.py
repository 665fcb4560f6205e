"""``materialize``: the command line of feature-materializer.

Each command's parser sits beside its handler, grouped by what a user does: run.py (run a
date and check it), backfill.py (date ranges and the ledger), stores.py (cleanup and the SQL
schema), doctor.py, reading.py (get, serve) and definitions.py (defs, import-feast,
sample-data); common.py holds what they share. Handlers import their heavy modules (Spark,
the server) when they run, so ``--help`` and the light commands start fast.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from jobs.cli import backfill, definitions, doctor, reading, run, stores
from jobs.cli.common import UsageError, retry_cannot_fix
from jobs.exit_codes import EXIT_FAILED, EXIT_TERMINAL, EXIT_USAGE

COMMANDS = {
    "run": (run.add_run, run.cmd_run),
    "validate": (run.add_validate, run.cmd_validate),
    "backfill": (backfill.add_backfill, backfill.cmd_backfill),
    "runs": (backfill.add_runs, backfill.cmd_runs),
    "cleanup": (stores.add_cleanup, stores.cmd_cleanup),
    "verify": (run.add_verify, run.cmd_verify),
    "get": (reading.add_get, reading.cmd_get),
    "serve": (reading.add_serve, reading.cmd_serve),
    "schema": (stores.add_schema, stores.cmd_schema),
    "ready": (run.add_ready, run.cmd_ready),
    "report": (run.add_report, run.cmd_report),
    "doctor": (doctor.add_doctor, doctor.cmd_doctor),
    "sample-data": (definitions.add_sample_data, definitions.cmd_sample_data),
    "defs": (definitions.add_defs, definitions.cmd_defs),
    "import-feast": (definitions.add_import_feast, definitions.cmd_import_feast),
}
"""Each command: (its parser's builder, its handler), in --help's order."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="materialize",
        description="Materialize ML features from Delta tables into the online stores (Redis, CockroachDB).",
        epilog="Examples:\n  materialize sample-data\n  materialize run --env local --date 2026-11-20\n"
        "  materialize run --env local --date 2026-11-20 --sink sql --source consumer_daily\n"
        "  materialize run --env local --incremental --source driver_hourly_stats\n"
        "  materialize validate --env local --date 2026-11-20\n"
        "  materialize backfill --env local --source consumer_daily --start 2026-11-16 --end 2026-11-20 --dry-run\n"
        "  materialize runs --last 10\n  materialize cleanup --env local --entity consumer --dry-run\n"
        "  materialize defs --source consumer_daily\n  materialize doctor --env prod\n"
        "  materialize import-feast my_project/feature_repo --out feast_defs/my_project\n"
        '  echo \'{"features": ["consumer_daily:orders_7d"], "entities": {"consumer_id": [1, 2]}}\' | materialize get --env local',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:  # in --help's order
        COMMANDS[name][0](sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    from feature_defs import DefinitionError
    from feature_defs.loader import UnknownNameError
    from fm_config import ConfigError
    from jobs.operations.ledger.local_commits import DeltaLogError
    from jobs.source_errors import CatalogUnavailable, SchemaDriftError, SourceUnreadable
    from serializers.horizon import FutureDateError

    try:
        return COMMANDS[args.command][1](args)
    except (ConfigError, DefinitionError, UnknownNameError, FileNotFoundError, FutureDateError, UsageError) as exc:
        # a KeyError of any other kind is a bug, not a usage error: its traceback is wanted
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (DeltaLogError, SchemaDriftError, SourceUnreadable, CatalogUnavailable) as exc:
        # a ledger's log a person has to look at (the message says what to do), a source table as
        # it is: one line each, no JVM trace; only an unreachable catalog is worth a retry
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_TERMINAL if retry_cannot_fix(exc) else EXIT_FAILED
    except ModuleNotFoundError as exc:
        # the base install reads features; Spark commands need [spark], `serve` needs [server]
        from jobs.extras import TITLES, install_hint, missing_extra

        missing = missing_extra(exc)
        if missing is None:
            raise  # not an extra's module: a broken install or a bug, its traceback is wanted
        module, extra = missing
        print(
            f"materialize {args.command} needs the {TITLES[extra]} extra ({module} is not installed): {install_hint(extra)}",
            file=sys.stderr,
        )
        return EXIT_USAGE


__all__ = ["COMMANDS", "UsageError", "build_parser", "main", "retry_cannot_fix"]
