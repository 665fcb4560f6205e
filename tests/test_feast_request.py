"""Feast's request body read exactly: an integer of 19 digits or more (which orjson turns into
a float past 64 bits, or refuses) is read by the exact parse wherever it stands."""

from __future__ import annotations

import pytest

from feature_reader.errors import RequestError
from feature_reader.feast_request import parse_body


@pytest.mark.parametrize(
    "number, expected",
    [
        (b"18446744073709551616", 2**64),  # 20 digits: a float to orjson
        (b"-18446744073709551617", -(2**64) - 1),
        (b"1000000000000000000", 10**18),  # 19 digits
        (b"123456789012345678", 123456789012345678),  # 18: orjson's own
        (b"9" * 400, int("9" * 400)),
    ],
)
def test_integers_are_read_exactly(number, expected):
    body = b'{"features": ["s:f"], "entities": {"id": [1, ' + number + b"]}}"
    got = parse_body(body)["entities"]["id"][1]
    assert type(got) is int and got == expected


def test_digits_inside_strings_or_split_by_other_bytes_change_nothing():
    assert parse_body(b'{"features": ["s:f1234567890123456789"], "entities": {"id": [1.5, 123456789.0123456789]}}') == {
        "features": ["s:f1234567890123456789"], "entities": {"id": [1.5, 123456789.0123456789]},
        "feature_service": None, "full_feature_names": False, "max_age": None,
    }  # fmt: skip
    with pytest.raises(RequestError, match="not JSON"):
        parse_body(b'{"entities": {"id": [NaN, 12345678901234567890]}}')
