"""One line of `materialize doctor`: what every check, of the write side (the other modules here) and
of the read side (reads.py), answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class DoctorLine:
    status: Status
    name: str
    detail: str
    fix: str = ""

    def lines(self) -> list[str]:
        out = [f"{self.status.upper():<5} {self.name:<28} {self.detail}"]
        return out + ([f"{'':<5} {'':<28} fix: {self.fix}"] if self.fix and self.status != "ok" else [])
