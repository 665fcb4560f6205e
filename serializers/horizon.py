"""How far ahead of today a snapshot may be: the one rule of every command that takes a date
(run, validate, verify, backfill), of the writers' guard and of the readers.

A date's snapshot is as of the end of that day, UTC (``as_of_epoch``), so a snapshot of
today is already up to a day ahead of the clock. A run accepts dates up to tomorrow, UTC: a
day of slack for sources dated in time zones ahead of UTC. Any later date is a mistake
(`--date 2099-01-01`, a typo), and so is an as-of time read from a store that is later
than the latest such date's: it is beyond the *horizon*. A stored as-of beyond the horizon is
treated as corrupt: readers answer INVALID for it, and the next write of the entity
replaces it (an older snapshot replaces it, unlike a newer one within the horizon).
The clocks of writers and readers may disagree by ``skew_seconds``.
"""

from __future__ import annotations

import datetime as dt
import time

DATE_SLACK = dt.timedelta(days=1)
"""A date may be at most this much after today, UTC."""
CLOCK_SKEW_SECONDS = 300
"""How far the clocks of the writers and readers may disagree (the writers' allowance; the
readers' is ``reader.clock_skew_seconds``, this by default)."""


class FutureDateError(ValueError):
    """A date past the latest a run accepts: no snapshot of it can exist yet (exit code 2)."""


def today(now: float | None = None) -> dt.date:
    """The UTC date at ``now`` (epoch seconds; default: the clock)."""
    return dt.datetime.fromtimestamp(time.time() if now is None else now, dt.UTC).date()


def latest_date(now: float | None = None) -> dt.date:
    """The latest snapshot date a command accepts at ``now``: tomorrow, UTC."""
    return today(now) + DATE_SLACK


def check_date(date: dt.date, flag: str = "--date", now: float | None = None) -> None:
    """Refuse a date past :func:`latest_date`, naming the date, today and the rule."""
    latest = latest_date(now)
    if date > latest:
        raise FutureDateError(
            f"{flag} {date} is in the future: today is {today(now)} UTC and the latest date accepted is {latest} "
            f"(a day of slack for sources dated ahead of UTC); no snapshot of {date} can exist yet. "
            "Check the date (a stored snapshot dated later than that is treated as corrupt and replaced by the next run)"
        )


def check_until(end: dt.datetime, flag: str = "--until", now: float | None = None) -> None:
    """Refuse a window end (an incremental run's, selected by event time) past the latest
    as-of time a run may store: the midnight after tomorrow, UTC, as :func:`check_date`
    refuses a date past tomorrow. ``end``: an aware datetime."""
    latest = as_of_horizon(now, skew_seconds=0)
    if end.timestamp() > latest:
        at = dt.datetime.fromtimestamp(latest, dt.UTC).isoformat().replace("+00:00", "Z")
        raise FutureDateError(
            f"{flag} {end.astimezone(dt.UTC).isoformat().replace('+00:00', 'Z')} is in the future: the latest window end accepted is "
            f"{at} (the end of tomorrow, UTC); no snapshot can be as of later than that (a stored one is treated as corrupt and replaced)"
        )


def as_of_horizon(now: float | None = None, skew_seconds: float = CLOCK_SKEW_SECONDS) -> int:
    """The latest as-of time (UTC epoch seconds) a store may hold at ``now``: that of the
    latest date a run accepts (the midnight after tomorrow, UTC), by a clock up to
    ``skew_seconds`` ahead of this one. Later: corrupt.

    ``as_of_epoch(latest_date(now + skew_seconds))`` in integer arithmetic (UTC days are
    86,400 epoch seconds each): readers ask on every read."""
    moment = (time.time() if now is None else now) + skew_seconds
    return (int(moment // _DAY) + 1 + DATE_SLACK.days) * _DAY


_DAY = 86400
