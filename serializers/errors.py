"""The serializers' two errors: bad input to encode, bad bytes to decode."""


class BadValue(ValueError):
    """A value that the format cannot represent (bad input: quarantined, never written)."""


class DecodeError(ValueError):
    """Bytes that are not a valid encoding of the declared type."""
