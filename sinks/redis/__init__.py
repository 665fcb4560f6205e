"""Redis: one hash per entity, a guarded write script per entity, pipelined per server.

settings -> config -> client; preflight (driver) -> writer (partitions). Beside them:
node.py (one server's pipelined writer), cluster.py (the same per slot owner), router.py
(slot map, key -> node), capacity.py (memory projection).
"""
