"""Stage 4, gate: the data-quality checks derived from the definitions, in one place.

stage.py runs the gate in a run (profile, expectations, the bad-row limit: a failure writes
nothing); checks.py derives the checks and runs great-expectations; scan.py computes the
checks' counts and the profile in one Spark aggregation, from Spark SQL text
(jobs/sql_text.py, shared with the transforms)."""
