"""Throwaway servers on free loopback ports, for the tests and the benchmarks: redis-server,
PostgreSQL and the S3 API test server (servers.py), and Redis Clusters (cluster.py), each
started again on another port when the one found free was taken before it bound. Development
tooling, like bench/ and tests/: the product never imports it, and it is not in the wheel.
"""
