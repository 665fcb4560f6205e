"""Which failures a scheduler retries: the CLI's classification (jobs/cli/common.py retry_cannot_fix)
and the exit codes the DAG tasks fail at once on (jobs/exit_codes.py, jobs/airflow_tasks.py)."""

from __future__ import annotations

import pytest

from feature_defs import DefinitionError
from jobs.cli import retry_cannot_fix
from jobs.exit_codes import RETRY_CANNOT_FIX
from jobs.operations.ledger.lease import LeaseHeld
from jobs.operations.ledger.local_commits import DeltaLogError
from jobs.pipeline.gate.checks import QualityGateError
from jobs.pipeline.gate.stage import BadInputError
from jobs.pipeline.parquet_files import MixedParquetTypes
from jobs.pipeline.read import SourceNotReady
from jobs.pipeline.snapshot_order import MostlySkippedNewer
from jobs.source_errors import CatalogUnavailable, SchemaDriftError, SourceUnreadable
from sinks.errors import CapacityError, TransientSinkError
from sinks.redis.node import ChunkFailed, KeysEvicted, RedisRestarted
from stores.redis import TlsVerificationError

# what the issue lists (bad input, definition errors, refused changes, gate failures) and what
# else the same input fails again on; the others are worth another attempt later
CANNOT_FIX = [
    DefinitionError, QualityGateError, BadInputError, SchemaDriftError, SourceUnreadable, MixedParquetTypes,
    CapacityError, KeysEvicted, TlsVerificationError, DeltaLogError, MostlySkippedNewer,
]  # fmt: skip
WORTH_A_RETRY = [TransientSinkError, ChunkFailed, RedisRestarted, CatalogUnavailable, LeaseHeld, SourceNotReady, OSError, RuntimeError]


@pytest.mark.parametrize("kind", CANNOT_FIX + WORTH_A_RETRY, ids=lambda k: k.__name__)
def test_a_failure_is_retried_only_when_the_same_input_may_pass(kind):
    assert retry_cannot_fix(kind.__new__(kind)) == (kind in CANNOT_FIX)


def test_the_exit_codes_not_retried():
    # usage/definitions, the gate, a store that lost data (a backfill is needed), any other terminal
    assert sorted(RETRY_CANNOT_FIX) == [2, 4, 6, 7]
