"""The targets table every benchmark prints at its end (Markdown, pasted into the READMEs)."""

from __future__ import annotations


def print_targets(targets: list[dict]) -> None:
    print("\n| target | measured | goal | met |\n|---|---:|---|---|")
    for t in targets:
        print(f"| {t['target']} | {t['measured']} | {t['goal']} | {'yes' if t['met'] else 'no'} |")
