"""Each source table: there, and its columns what the definition says. A Delta table's schema
is read from its log without Spark (locations.py); a Parquet or catalog-table source is
opened as a run opens it."""

from __future__ import annotations

from feature_defs import Definitions, SourceDef
from fm_config import RunConf
from jobs.operations.doctor.line import DoctorLine
from jobs.operations.doctor.locations import delta_log


def check_source(conf: RunConf, defs: Definitions, source: SourceDef) -> DoctorLine:
    from pyspark.sql.types import StructType

    from jobs.pipeline.read import source_path
    from jobs.transforms import schema_problems

    if source.table is not None or source.format != "delta":
        return check_opened_source(conf, defs, source)
    where = source_path(conf, source)
    name = f"source {source.name}"
    try:
        log = delta_log(conf, where)
    except OSError as exc:
        return DoctorLine("fail", name, f"{where}: cannot read: {exc}", "check the location and this host's credentials for it")
    if not log:
        fix = "run `materialize sample-data`" if where.is_local else "check the source's location (feature_defs) and data_root"
        return DoctorLine("fail", name, f"no Delta table at {where}", fix)
    version, schema = log
    if schema is None:
        return DoctorLine("warn", name, f"{where}: Delta table (version {version}); its schema could not be read from the log")
    problems = schema_problems(StructType.fromJson(schema), source, defs.entity_of(source))
    if problems:
        return DoctorLine("fail", name, f"{where}: " + "; ".join(problems), "fix the table or the source's definition in feature_defs")
    return DoctorLine("ok", name, f"{where}: Delta table, version {version}, columns match the definition")


def check_opened_source(conf: RunConf, defs: Definitions, source: SourceDef) -> DoctorLine:
    """A Parquet or catalog-table source, opened as a run opens it (jobs/pipeline/source_table.py):
    its schema is what Spark sees, partition columns included."""
    from fm_config.catalog import CATALOG_HELP
    from jobs.pipeline.source_table import open_table, table_ref
    from jobs.source_errors import CatalogUnavailable, SourceNotFound, SourceUnreadable
    from jobs.spark import build_spark
    from jobs.transforms import schema_problems

    name, ref = f"source {source.name}", table_ref(conf, source)
    if source.table is not None and not conf.spark.catalog.configured:
        return DoctorLine("fail", name, f"{ref}: no catalog is configured", CATALOG_HELP)
    spark = build_spark(conf.spark, conf.locations(defs))  # the one session of this process, started once
    try:
        table = open_table(spark, conf, ref)
    except SourceNotFound as exc:
        fix = (
            f"check the catalog ({conf.spark.catalog.describe()}) and the source's table"
            if source.table
            else "check the source's location and format (feature_defs) and data_root"
        )
        return DoctorLine("fail", name, str(exc), fix)
    except (SourceUnreadable, CatalogUnavailable) as exc:
        return DoctorLine(
            "fail",
            name,
            str(exc),
            "check the catalog's metastore and this host's access to it" if source.table else "check the files at the location",
        )
    problems = schema_problems(table.schema, source, defs.entity_of(source))
    if problems:
        return DoctorLine("fail", name, f"{ref}: " + "; ".join(problems), "fix the table or the source's definition in feature_defs")
    what = "catalog table" if source.table else "Parquet"
    return DoctorLine("ok", name, f"{ref}: {what}, columns match the definition")
