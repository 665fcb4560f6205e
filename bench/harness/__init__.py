"""The benchmarks' shared harness: what more than one entry point (``python -m bench.X``) uses.

- servers.py: the CPU pinning of server and load, waiting for a server to answer, stopping its process group;
- feast.py: the peer, Feast 0.67 in its own venv (`feast materialize` of the standard table, timed) and `feast serve`'s flags;
- pki.py: a CA, a server certificate, a JWT signing key with its JWKS, and bearer tokens;
- data.py: the standard table written by the job, the reader's conf over it, and request bodies.

Entry points import from here (and from the shared builders bench/standard.py, confs.py,
report.py, vegeta.py), never another entry point's helpers.
"""
