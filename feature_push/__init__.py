"""Pushes: Feast's push API (``POST /push``, ``POST /write-to-online-store``) on ``materialize
serve``, written through the nightly run's own encoders, stored names and snapshot-order
guard (README.md here)."""
