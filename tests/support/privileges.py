"""Least privilege: the documented Redis ACL and SQL grants, as written (conf/README.md)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ACL_FILE = ROOT / "conf" / "base" / "redis-acl.txt"
GRANTS_FILE = ROOT / "conf" / "base" / "sql-grants.sql"
PLACEHOLDER = ">CHANGE_ME"
ROLES = ("fm_schema", "fm_writer", "fm_reader", "fm_cleanup")
ACL_USERS = ("fm_writer", "fm_reader")


def acl_commands(password: str) -> list[list[str]]:
    """The documented ACL SETUSER lines (one per user), each with a real password in place of the placeholder."""
    lines = [line.split() for line in ACL_FILE.read_text().splitlines() if line.strip()]
    assert [args[:3] for args in lines] == [["ACL", "SETUSER", user] for user in ACL_USERS]
    assert all(args.count(PLACEHOLDER) == 1 for args in lines)
    return [[f">{password}" if a == PLACEHOLDER else a for a in args] for args in lines]
