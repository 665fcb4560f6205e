"""`make bench-soak`: the feature server under steady open-loop load while faults are
injected one at a time (bench/README.md "The feature server under faults").

- data.py: the standard table for two dates, written by the real job; the expected values,
  read independently from the table's Parquet files;
- load.py: the open-loop load (its own process), every 200 answer checked;
- faults.py: Redis paused, Redis restarted, PostgreSQL restarted, a Redis Cluster primary
  killed, the nightly run, slow clients, hostile clients (hostile.py: refused huge bodies,
  pipelining non-readers, the JWKS trickling);
- idp.py: the signing key, the tokens and the JWKS endpoint (the servers take bearer tokens);
- run.py: servers, `materialize serve`, the warm-up to the cache's working set, the timeline;
  analysis.py: the report and its goals; gc_probe.py: `--gc-probe`, what holds the server's memory.
"""
