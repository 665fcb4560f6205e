"""The nightly run of one source as stages, in reading order.

read -> prepare -> quarantine -> gate -> write (write_redis, write_sql) -> verify -> report;
run.py wires them. The transforms they apply are jobs/transforms.py (DataFrame in,
DataFrame out); the writes run inside the partitions (sinks/partition.py, each store's writer.py).
"""
