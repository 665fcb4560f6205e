"""Event-time runs lose no row, and pushes interleave with them: a model-based test. Random arrivals
of rows (late, early, at an existing event time with a created time before, equal to or after it, at
the last window's end, still to come) between random runs (a date past, today, tomorrow or past the
horizon; incremental, up to now, to an --until past, still to come or past the horizon; a run whose
SQL write fails midway, then run again), through the ledger (``recorded_run``, as ``materialize
run`` runs a source), and random pushes to the feature server between them (``POST /push`` of one
row, at the same kinds of event times), both stores read back raw after every run and every push.

The model is the documented rule alone (feature_defs/README.md "Selection by event time",
jobs/README.md "Incremental runs and the ledger's windows", serializers/FORMAT.md "Writes"): a run
of a date covers every event time up to the end of that date, an incremental run from the latest
window end a succeeded run recorded less the lookback (everything, for the first) up to --until or
now; neither ends after the time the run reads the table. A run writes, of its window's rows, each
entity's latest by event time (then created time, a row without one losing), as of that event time
to the microsecond (serializers/FORMAT.md 1.4); a push writes its row as of its event time (one
later than the clock plus server.push.clock_skew_seconds is refused, nothing written); a store keeps
what it holds when that is later, to the microsecond, whoever wrote it, and takes an equal one
again. So each entity ends as its latest row among those some succeeded run's window held when it
read the table. A failed run's window does not count; what it wrote stays. A date past tomorrow, an
--until past the horizon or not after the window's start is refused, a window without rows is not
ready: one line, nothing written or recorded.

Pushes are online, to the table or both (an appended row is a row later runs read), at the same
kinds of event times and older than the entity type's TTL; refused as the rule says (400 past the
clock's skew or the TTL, 409 for a tie with a table row), every other written as a run writes. The
definitions change at a drawn step (version 2 removes tag; its stored.lock records it): the
runs and the push server move to it, and a server one version behind pushes too, written until
the stores describe what it lacks (409 after: StaleDefinitions, or StoredAsSomethingElse for tag
retired). A writer without tag leaves Redis's tag field as it was and writes the SQL row without
it.

The failure midway is the SQL store refusing rows from its n-th insert on (a trigger), after Redis
was written: a driver killed instead would leave its step ``running`` and its lease held for
minutes; neither kind of step counts (tests/test_event_time.py has both).
"""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import dataclass, field, replace

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from feature_defs import load_definitions
from feature_defs.stored_lock import locked, write_lock
from feature_push.app import build_app
from fm_config import QualityConf, RunConf
from fm_config.redis import RedisSettings
from fm_config.sql import SqlSettings
from jobs import event_time
from jobs.operations.backfill import recorded_run
from jobs.operations.ledger.events import Ledger, aware, sink_targets
from jobs.operations.ledger.windows import WindowError
from jobs.pipeline.read import SourceNotReady
from serializers import decode, field_id, subsecond_field
from serializers.horizon import FutureDateError
from sinks.sql.config import sql_sink_config
from sinks.sql.preflight import ensure_schema
from stores.sql import connect

from .support.asgi import asgi_call
from .support.events import FRESH, SCHEMA, micros, write_events

UTC = dt.UTC
SUBSECOND = subsecond_field("events")
LOOKBACK = dt.timedelta(hours=1)
ENTITIES = (1, 2, 3, 4)
FEATURES = (("score", "float"), ("tag", "string"))
NO_CREATED = dt.datetime.min.replace(tzinfo=UTC)

# -- the steps (event times relative to B, the clock when the example starts: the runs cut
# their windows at the driver's clock, so "today" and "still to come" mean what they say) --

AGO = (2 * 1440 + 7, 1440 + 13, 240, 90, 40, 10)  # minutes before B: the last two within the lookback of a run at B
AHEAD = (30, 150, 3 * 1440 + 5)  # minutes after B: still to come during the test; the last past the horizon
arrival = st.one_of(
    st.tuples(st.just("ago"), st.sampled_from(AGO), st.sampled_from((0, 250_000))),  # with sub-seconds or not
    st.tuples(st.just("ahead"), st.sampled_from(AHEAD), st.just(0)),
    st.tuples(st.just("edge"), st.sampled_from((0, -1)), st.just(0)),  # at the last window's end (the next window's), a second before
    st.tuples(st.just("same"), st.integers(0, 20), st.just(0)),  # the event time of a row already there
)
created = st.sampled_from(("none", "earlier", "equal", "later"))
row = st.tuples(st.sampled_from(ENTITIES), arrival, created, st.booleans())  # the last: a null score
run = st.one_of(
    st.tuples(st.just("date"), st.sampled_from((-2, -1, 0, 1, 2))),  # days from today
    st.tuples(st.just("incremental"), st.sampled_from(("now", "past_far", "past_near", "ahead", "beyond"))),
)
UNTIL = {"past_far": -2 * 60, "past_near": -30, "ahead": 60, "beyond": 3 * 1440}  # minutes from B
TTL_DAYS = 30  # the consumer entity type's ttl_seconds (feature_defs/entities.yaml)
pushed = st.tuples(
    st.sampled_from(ENTITIES),
    st.one_of(arrival, st.tuples(st.just("ago"), st.just((TTL_DAYS + 1) * 1440), st.just(0))),  # or older than the TTL
    st.booleans(),  # a null score
    st.sampled_from(("online", "offline", "online_and_offline", "stale")),  # stale: online, by a server on older definitions
)
# a step: rows arrive (maybe none), then a run, whose SQL write may fail at its (n mod
# entities written)-th row, then run again; pushes (maybe none) come before the run
step = st.tuples(st.lists(row, max_size=3), run, st.one_of(st.none(), st.integers(0, 3)), st.lists(pushed, max_size=2))


@dataclass(frozen=True)
class Row:
    entity: int
    score: float | None
    tag: str
    event: dt.datetime
    created: dt.datetime | None

    def rank(self) -> tuple:
        return (self.event, self.created is not None, self.created or NO_CREATED)

    def stored(self) -> tuple[dict, int]:
        """What a store holds for it: its non-null features, as of its event time in epoch microseconds."""
        return {k: v for k, v in (("score", self.score), ("tag", self.tag)) if v is not None}, micros(self.event)


@dataclass
class Model:
    base: dt.datetime
    rows: list[Row] = field(default_factory=list)
    ends: list[dt.datetime] = field(default_factory=list)  # of the succeeded runs' windows
    stored: dict[int, Row] = field(default_factory=dict)

    leftover: dict[int, str] = field(default_factory=dict)  # Redis tag fields a writer without tag left as they were

    pushes: int = 0
    version: int = 1  # of the runs' and the push server's definitions: 2 removes tag (its stored.lock records it)
    described: bool = False  # whether a writer with tag has recorded tag in the stores' description
    retired: bool = False  # whether a writer of version 2 has recorded it retired there since

    def event_of(self, when: tuple) -> dt.datetime:
        what, n, micros = when
        if what == "ago":
            return self.base - dt.timedelta(minutes=n) + dt.timedelta(microseconds=micros)
        if what == "ahead":
            return self.base + dt.timedelta(minutes=n)
        if what == "edge":
            return max(self.ends, default=self.base) + dt.timedelta(seconds=n)
        return self.rows[n % len(self.rows)].event if self.rows else self.base

    def writes_tag(self, to: str) -> bool:
        """Whether the server taking a push ``to`` writes tag: version 1, or the stale one after the change
        (before it, the stale server is of version 0, without tag)."""
        return (self.version == 1) != (to == "stale")

    def push(self, entity: int, when: tuple, null_score: bool, to: str) -> Row:
        """A pushed row (in the table once appended); its values unique, apart from the rows'."""
        self.pushes += 1
        return Row(entity, None if null_score else 1000 + self.pushes + 0.5, f"push {self.pushes}", self.event_of(when), None)

    def push_outcome(self, r: Row, to: str, now: dt.datetime) -> str:
        """What a push does: refused (400, and why), stale, retired or tie (409), or ok."""
        if not self.writes_tag(to) and to != "stale" and to != "online":
            return "unknown column"  # the table's tag, no feature of version 2's: such a push to the table is refused
        if r.event > now + dt.timedelta(seconds=300):
            return "later than the clock"
        if r.event < now - dt.timedelta(days=TTL_DAYS):
            return "older than the TTL"
        if to == "stale" and self.version == 1:
            return "stale" if self.described else "ok"  # the stores describe tag once a writer of it checked them
        if to == "stale":
            return "retired" if self.retired else "ok"
        tied = any((t.entity, t.event, t.created) == (r.entity, r.event, None) for t in self.rows)
        return "tie" if tied and to != "online" else "ok"

    def prepared(self, tag: bool) -> None:
        """A writer (with tag or without, of version 2) checked and recorded the stores' description."""
        if tag:
            self.described = True
        elif self.version == 2 and self.described:
            self.retired = True

    def add(self, entity: int, when: tuple, kind: str, null_score: bool) -> Row:
        """A row arriving (the ``row`` strategy's draw); its values are its number, unique."""
        event = self.event_of(when)
        # the created time: none, or a minute before, equal to or a minute after the latest of the
        # rows already at this event time (of any entity)
        known = max((r.created for r in self.rows if r.event == event and r.created), default=None)
        if kind == "later":
            made = (known or self.base) + dt.timedelta(minutes=1)
        elif kind == "earlier" and known:
            made = known - dt.timedelta(minutes=1)
        else:
            made = known if kind == "equal" else None
        number = len(self.rows) + 1
        new = Row(entity, None if null_score else number + 0.25, f"row {number}", event, made)
        # an entity's rows of one event and created time carry one version (different ones would
        # be a conflict the gate refuses): a second is a copy
        twin = next((r for r in self.rows if (r.entity, r.event, r.created) == (entity, event, made)), None)
        new = replace(new, score=twin.score, tag=twin.tag) if twin else new
        self.rows.append(new)
        return new

    def since(self) -> dt.datetime | None:
        return max(self.ends, default=None)

    def outcome(self, run: tuple, today: dt.date, now: dt.datetime) -> tuple[str, dt.datetime | None, dt.datetime]:
        """(what the run does: ok, future, window, not ready; its window's start; the end asked for),
        for a run reading the table at ``now``."""
        if run[0] == "date":
            day = today + dt.timedelta(days=run[1])
            asked = event_time.date_window(day).end
            if day > today + dt.timedelta(days=1):
                return "future", None, asked
            if not self.inside(asked - dt.timedelta(days=1), asked):  # no row of that day
                return "not ready", None, asked
            start = None
        else:
            asked = now if run[1] == "now" else self.base + dt.timedelta(minutes=UNTIL[run[1]])
            if asked > dt.datetime.combine(today + dt.timedelta(days=2), dt.time(), tzinfo=UTC):
                return "future", None, asked
            since = self.since()
            start = None if since is None else since - LOOKBACK
            if start is not None and start >= min(asked, now):
                return "window", start, asked
        return ("ok" if self.inside(start, min(asked, now)) else "not ready"), start, asked

    def inside(self, start: dt.datetime | None, end: dt.datetime) -> list[Row]:
        return [r for r in self.rows if (start is None or r.event >= start) and r.event < end]

    def written(self, start: dt.datetime | None, end: dt.datetime) -> dict[int, Row]:
        """Each entity's row a run of [start, end) writes: its latest by event time, then created."""
        out: dict[int, Row] = {}
        for r in self.inside(start, end):
            if r.entity not in out or r.rank() > out[r.entity].rank():
                out[r.entity] = r
        return out

    def after(self, writes: dict[int, Row], tag: bool = True) -> tuple[dict[int, Row], dict[int, str]]:
        """The stores (and Redis's leftover tags) after those writes by a writer with ``tag`` or without: a later
        stored as-of time (to the microsecond) stays, an equal one is replaced. A writer without tag leaves
        Redis's tag field as it was (its runs and pushes never name it) and writes the SQL row without it."""
        stored, leftover = dict(self.stored), dict(self.leftover)
        for entity, r in writes.items():
            if entity in stored and micros(r.event) < micros(stored[entity].event):
                continue
            before = stored.get(entity)
            if tag:
                leftover.pop(entity, None)
            elif before is not None and before.tag is not None:
                leftover[entity] = before.tag
            stored[entity] = r if tag else replace(r, tag=None)
        return stored, leftover


# -- the stores, read back raw --


def redis_state(client) -> dict[int, tuple[dict, int]]:
    out = {}
    for entity in ENTITIES:
        fields = client.hgetall(f"c:{entity}")
        if not fields:
            continue
        as_of = int(fields.pop(FRESH)) * 1_000_000 + int(fields.pop(SUBSECOND, 0))  # the sub-second field: absent when 0
        values = {name: decode(kind, fields.pop(field_id(name))) for name, kind in FEATURES if field_id(name) in fields}
        assert not fields, (entity, fields)  # nothing but the source's features and its freshness and sub-second fields
        out[entity] = (values, as_of)
    return out


def sql_state(conn) -> dict[int, tuple[dict, int]]:
    found = conn.execute("SELECT entity_key, features::text, as_of FROM consumer_features WHERE source = 'events'")
    return {int(k): (json.loads(doc), micros(as_of)) for k, doc, as_of in found}


def expected(stored: dict[int, Row], leftover: dict[int, str] | None = None) -> dict[int, tuple[dict, int]]:
    """What a store holds; with ``leftover`` (Redis), the tag fields a writer without tag left."""
    out = {entity: r.stored() for entity, r in stored.items()}
    for entity, tag in (leftover or {}).items():
        if entity in out and "tag" not in out[entity][0]:
            out[entity] = ({**out[entity][0], "tag": tag}, out[entity][1])
    return out


def held(model: Model) -> tuple:
    """What (Redis, the SQL store) hold by the model."""
    return expected(model.stored, model.leftover), expected(model.stored)


def clock() -> dt.datetime:
    return dt.datetime.now(UTC).replace(microsecond=0)


def arm_crash(conn, at: int) -> None:
    """The SQL store fails from its ``at``-th row inserted on: the rows before are committed
    (a transaction per row here), the run fails midway, as a store going away would leave it."""
    conn.execute("CREATE SEQUENCE crash_rows")
    conn.execute(
        "CREATE FUNCTION crash() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        f"IF nextval('crash_rows') >= {at} THEN RAISE EXCEPTION 'the store failed mid-write'; END IF; RETURN NEW; END $$"
    )
    conn.execute("CREATE TRIGGER crash BEFORE INSERT ON consumer_features FOR EACH ROW EXECUTE FUNCTION crash()")


def disarm_crash(conn) -> None:
    conn.execute("DROP TRIGGER crash ON consumer_features")
    conn.execute("DROP FUNCTION crash()")
    conn.execute("DROP SEQUENCE crash_rows")


# -- the test --


@settings(
    max_examples=3, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(first=st.lists(row, min_size=1, max_size=3), steps=st.lists(step, min_size=1, max_size=3), change_at=st.integers(0, 4))
# always among the examples: the first incremental run; rows arriving late within the lookback
# (loaded by the next incremental run), later than it (left to a run of a date), at the last
# window's end (the next window's); an --until still to come, cut at the read, whose SQL write
# fails midway, run again; an --until before the window's start; a run of today, cut at its
# read, loading the row later than the lookback and not the row still to come; a date past tomorrow
@example(
    first=[(1, ("ago", 240, 0), "none", False), (2, ("ago", 10, 0), "later", False)],
    steps=[
        ([], ("incremental", "now"), None, []),
        (
            [(1, ("ago", 90, 0), "none", False), (4, ("ago", 40, 0), "none", False), (3, ("edge", 0, 0), "none", True)],
            ("incremental", "ahead"),
            1,
            [(1, ("ahead", 30, 0), False, "online"), (2, ("ago", 2 * 1440 + 7, 0), False, "online")],  # later than the clock; older
        ),
        (
            [(2, ("ago", 40, 0), "none", False)],
            ("incremental", "past_far"),
            None,
            [(4, ("ahead", 3 * 1440 + 5, 0), False, "online")],
        ),  # refused
        (
            [(1, ("same", 0, 0), "later", False), (4, ("ahead", 30, 0), "none", False)],
            ("date", 0),
            None,
            [(3, ("same", 0, 0), True, "online")],  # at a row's event time: as new as it
        ),
        ([], ("date", 2), None, []),
    ],
    change_at=9,  # never
)
# pushes of each kind (issue 62): a server on older definitions before anything is described
# (written, without tag) and after (409); a push 0.25 s older than a row in the same second
# (kept); a push to the table as recent as a row of its entity (409 tie); one appended and
# written by the next run; one older than the TTL (400); newer pushes for most of the next
# incremental run's entities (counted, the run succeeds)
@example(
    first=[(1, ("ago", 40, 250_000), "none", False), (2, ("ago", 40, 0), "none", False), (3, ("ago", 50, 0), "none", False)],
    steps=[
        ([], ("incremental", "now"), None, [(1, ("ago", 40, 0), False, "stale")]),
        (
            [],
            ("incremental", "now"),
            None,
            [
                (1, ("ago", 40, 0), False, "online"),
                (2, ("same", 1, 0), False, "online_and_offline"),
                (3, ("ago", 10, 0), False, "offline"),
                (4, ("ago", (TTL_DAYS + 1) * 1440, 0), False, "online"),
                (2, ("ago", 10, 0), True, "stale"),
                (1, ("ago", 10, 250_000), False, "online"),
                (2, ("ago", 10, 0), False, "online_and_offline"),
            ],
        ),
    ],
    change_at=9,  # never
)
# the definitions change at the second step (tag removed, its stored.lock saying so): a server still
# on the old ones pushes with tag before any writer of the new has checked the stores (written),
# one of the new pushes (tag retired; Redis keeps the tag field it never names, the SQL row loses
# it), the new run writes without tag; then the old server is refused (retired), and a push of
# the new one to the table, whose rows have a tag no feature names now, is refused
@example(
    first=[(1, ("ago", 40, 0), "none", False), (2, ("ago", 30, 0), "none", False)],
    steps=[
        ([], ("incremental", "now"), None, []),
        (
            [(1, ("ago", 20, 0), "none", False)],
            ("incremental", "now"),
            None,
            [(2, ("ago", 10, 0), False, "stale"), (3, ("ago", 5, 0), False, "online")],
        ),
        ([], ("incremental", "now"), None, [(1, ("ago", 3, 0), False, "stale"), (1, ("ago", 2, 0), False, "offline")]),
    ],
    change_at=1,
)
# a table holding only a row still to come: a run of today has nothing up to its read
@example(
    first=[(1, ("ahead", 30, 0), "none", False)],
    steps=[([], ("date", 0), None, []), ([(2, ("ago", 10, 0), "none", False)], ("incremental", "now"), None, [])],
    change_at=9,  # never
)
def test_event_time_runs_and_pushes_leave_both_stores_as_the_model_says(
    spark, tmp_path_factory, redis_server, pg_server, first, steps, change_at
):
    now = dt.datetime.now(UTC)
    if now.time() >= dt.time(23, 55):  # "today" must stay today during the example
        time.sleep((dt.datetime.combine(now.date() + dt.timedelta(days=1), dt.time(), tzinfo=UTC) - now).total_seconds() + 1)
    root = tmp_path_factory.mktemp("event-model")
    redis = redis_server.client()
    redis.flushall()
    with pg_server.connect() as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
    conf = RunConf(
        env="test",
        data_root=str(root),
        ledger_root=str(root / "ledger"),
        definitions_dir=str(root / "defs"),
        quarantine_root=str(root / "quarantine"),
        reports_dir=str(root / "reports"),
        sinks=["redis", "sql"],
        redis=RedisSettings(url=redis_server.url, password_env=None, sample_entities=10),
        # a transaction per row: a failing insert leaves the rows before it written
        sql=SqlSettings(dsn=pg_server.dsn, password_env=None, batch_rows=1, statements_per_transaction=1, retry_base_delay=0.01),
        quality=QualityConf(expectations=False, verify_sample=10),
        reader={"timeout_ms": 10_000},
        server={"push": {"enabled": True}},
    )
    model = Model(base=clock())
    rows = [model.add(e, w, c, n) for e, w, c, n in first]
    extra = f"  lookback_seconds: {int(LOOKBACK.total_seconds())}\n  push_source: events_push\n"
    defs = write_events(spark, root, [astuple(r) for r in rows], extra=extra)
    source, entity = defs.sources["events"], defs.entities["consumer"]
    table = sql_sink_config(conf, source, entity, model.base.date())
    with connect(table) as conn:
        ensure_schema(conn, table)
    ledger = Ledger(spark, root / "ledger")
    # the definitions without tag: version 0, older than the runs' (a rolling deploy's feature server), and
    # version 2, to which the definitions change at step ``change_at`` (tag removed, recorded in its stored.lock)
    servers, by_version = {1: conf}, {1: defs}
    for version in (0, 2):
        folder = root / f"defs_v{version}"
        folder.mkdir()
        (folder / "entities.yaml").write_text((root / "defs" / "entities.yaml").read_text())
        (folder / "events.yaml").write_text((root / "defs" / "events.yaml").read_text().replace("    - {name: tag, type: string}\n", ""))
        if version == 2:
            write_lock(folder, locked(load_definitions(folder, check_lock=False), locked(defs, None)))
        servers[version], by_version[version] = conf.model_copy(update={"definitions_dir": str(folder)}), load_definitions(folder)

    def table_rows() -> list:
        """The source's table as delta-rs reads it (the rows runs read), comparable with the model's."""
        import deltalake

        held = deltalake.DeltaTable(str(root / "events")).to_pyarrow_table().to_pylist()
        return sorted(map(repr, (comparable(r["consumer_id"], r["score"], r["tag"], r["event_ts"], r["created"]) for r in held)))

    def attempt(run: tuple, pg, crash_at: int | None = None) -> None:
        """Run it, compare what it did and both stores with the model, and move the model on."""
        today, before = dt.datetime.now(UTC).date(), clock()
        what, start, asked = model.outcome(run, today, before)
        day = today + dt.timedelta(days=run[1]) if run[0] == "date" else event_time.end_date(asked)
        until = None if run[0] == "date" else asked
        if crash_at is not None and what == "ok":
            arm_crash(pg, 1 + crash_at % len(model.written(start, min(asked, before))))
        recorded = ledger.source_steps("events")
        try:
            runs = by_version[model.version]
            summary = recorded_run(spark, conf, runs, ledger, "run", "events", day, until=until, guard_skipped_newer=True)
            error = None
        except Exception as exc:  # noqa: BLE001 (compared with the model below)
            summary, error = None, exc
        finally:
            if crash_at is not None and what == "ok":
                disarm_crash(pg)
        after = clock()
        assert dt.datetime.now(UTC).date() == today, "the date changed during the step"
        state = (redis_state(redis), sql_state(pg))
        if what != "ok":  # refused, one clear line: nothing written, no window recorded
            kind = {"future": FutureDateError, "window": WindowError, "not ready": SourceNotReady}[what]
            assert isinstance(error, kind), (run, what, error)
            assert ("in the future" if what == "future" else "'events'") in str(error) and "\n" not in str(error), error
            assert state == held(model), (run, what)
            assert ledger.source_steps("events") == recorded, (run, what)
            return
        model.prepared(tag=model.version == 1)  # the run checked and recorded the stores' description before writing
        steps_now = ledger.source_steps("events")
        assert len(steps_now) == len(recorded) + 1, run
        last = max(steps_now, key=lambda s: s["started_at"])
        # the time the run read the table (the driver's clock) ends the window when the end asked for is later
        end = _aware(last["window_end"])
        assert end == asked if asked <= before else before <= end <= after, (run, end, asked, before, after)
        writes = model.written(start, end)
        failed = crash_at is not None and error is not None
        if failed:  # midway: each entity of each store as before or as written
            written, left = model.after(writes, tag=model.version == 1)
            ways = [(expected(model.stored, model.leftover), expected(written, left)), (expected(model.stored), expected(written))]
            for holds, (before_, after_) in zip(state, ways):
                for e in ENTITIES:
                    assert holds.get(e) in [before_.get(e), after_.get(e)], (run, e, holds.get(e))
            assert "the store failed mid-write" in str(error) and last["status"] == "failed", error
        else:
            model.stored, model.leftover = model.after(writes, tag=model.version == 1)
            assert state == held(model), (run, model)
            assert error is None and summary.status == "succeeded" and last["status"] == "succeeded", (run, error)
            assert crash_at is None, f"{run}: the SQL store's write was to fail at its row {1 + crash_at % len(writes)}"
        # the window recorded: the model's start; the end asked for, when it was cut
        assert (_aware(last["window_start"]) if last["window_start"] else None) == start, (run, last)
        assert (_aware(last["window_requested_end"]) if last["window_requested_end"] else None) == (asked if end < asked else None)
        if failed:
            attempt(run, pg)  # and run again
        else:
            model.ends.append(end)

    def push(entity: int, when: tuple, null_score: bool, to: str, pg) -> None:
        """Push one row through the server's push route, compare both stores (and the table) with the model, move it on."""
        r, tag = model.push(entity, when, null_score, to), model.writes_tag(to)
        df = {"consumer_id": [r.entity], "score": [r.score], "tag": [r.tag], "event_ts": [r.event.isoformat()], "created": [None]}
        if not tag and to in ("online", "stale"):  # to the table, the row has every column of it
            del df["tag"]
        body = json.dumps({"push_source_name": "events_push", "df": df, "to": "online" if to == "stale" else to}).encode()
        what = model.push_outcome(r, to, dt.datetime.now(UTC))
        server = servers[(model.version - (to == "stale"))]
        status, answer = asgi_call(build_app(server), "POST", "/push", body)
        said = json.loads(answer).get("error", "")
        if what == "unknown column":
            assert status == 400 and "unknown column(s) 'tag'" in said, answer
        elif what == "later than the clock":
            assert status == 400 and "later than now" in said and "(server.push.clock_skew_seconds)" in said, answer
        elif what == "older than the TTL":
            assert status == 400 and "older than entity 'consumer''s TTL" in said, answer
        elif what in ("stale", "retired", "tie"):
            kind = {"stale": "StaleDefinitions", "retired": "StoredAsSomethingElse", "tie": "Tie"}[what]
            assert (status, json.loads(answer)["type"]) == (409, kind), (what, answer)
            if what == "tie":
                model.prepared(tag)
        else:
            assert status == 200, answer
            model.prepared(tag)
            if to != "offline":
                model.stored, model.leftover = model.after({r.entity: r}, tag)
            if to in ("offline", "online_and_offline"):
                model.rows.append(r)  # appended: a row of the table that runs read
        assert (redis_state(redis), sql_state(pg)) == held(model), (r, to, model)
        assert table_rows() == sorted(map(repr, (comparable(*astuple(x)) for x in model.rows))), (r, to)

    # The source's leases held across the steps, as a backfill holds them across its own: each
    # run's claim and release would be two Delta commits more (a third of a run's time here).
    lease = ledger.leases(conf.lease.seconds).hold("events", sorted(sink_targets(conf).values()), "run")
    with pg_server.connect() as pg, lease:
        assert (redis_state(redis), sql_state(pg)) == ({}, {})
        for n, (arrivals, run_, crash_at, pushes) in enumerate(steps):
            if n == change_at:
                model.version = 2  # the runs and the push server on version 2; the stale server on 1
            if arrivals:
                new = [model.add(*r) for r in arrivals]
                spark.createDataFrame([astuple(r) for r in new], SCHEMA).write.format("delta").mode("append").save(str(root / "events"))
            for p in pushes:
                push(*p, pg)
            attempt(run_, pg, crash_at)


def comparable(entity, score, tag, event, created) -> tuple:
    return (entity, score, tag, micros(event), None if created is None else micros(created))


def astuple(r: Row) -> tuple:
    return (r.entity, r.score, r.tag, r.event, r.created)


def _aware(when) -> dt.datetime:
    return aware(when.to_pydatetime() if hasattr(when, "to_pydatetime") else when)  # the ledger's reader may give pandas' Timestamp
