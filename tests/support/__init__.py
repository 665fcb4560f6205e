"""What the suite's tests share, imported by tests and by conftest.py's fixtures (no test
module imports another: tests/test_imports.py): sample data and small sources (samples,
every_type, bad_values), config folders (confs), the reader's and the server's samples
(reader_sample, serving), the Redis sink's test data (redis_sink), the consumer job's
expectations (consumer_job), the documented privileges, JVM options, port pickers, TLS and
token builders, and Feast's example (feast_example)."""
