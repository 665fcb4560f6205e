"""How every part connects to each store, one module per store: the writers (sinks/), the
readers (feature_reader/) and the operator commands (jobs/) build their clients here, sync
and asyncio alike, with the same TLS, timeouts, keepalives and split of errors into
transient and terminal (errors.py). Spark-free; below sinks/ and feature_reader/."""
