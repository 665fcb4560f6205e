"""Feast's own HTTP client against our server (make check-feast-client).

    python -m bench.feast_client [--entities 2000]

The job writes the standard table into a throwaway Redis and `feast materialize` (Feast
0.67, its own venv) the same table into the next database; `feast serve` and
`materialize serve` both start. Then, in Feast's venv, one feature repository with
Feast's remote online store (`online_store: {type: remote, path: <url>}`) reads the same
features for the same entities (one of them absent) through each server with
`FeatureStore.get_online_features(...).to_dict()`. The check passes when both answers
are equal and complete. Lists are kept out: Feast 0.67's remote client cannot type an
empty list it receives (whatever server sends it), a bug of Feast's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from fm_config import PROJECT_ROOT

CLIENT = r"""
import json, sys
from pathlib import Path
from feast import FeatureStore

registry, source, names, ids, servers = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4]), json.loads(sys.argv[5])
out = {}
for label, url in servers.items():
    repo = Path(registry).parent.parent / f"client-{label}"
    repo.mkdir(exist_ok=True)
    (repo / "feature_store.yaml").write_text(
        f"project: fm_bench\nregistry: {registry}\nprovider: local\nentity_key_serialization_version: 3\n"
        f"online_store:\n  type: remote\n  path: {url}\n"
    )
    store = FeatureStore(repo_path=str(repo))
    out[label] = store.get_online_features(features=[f"{source}:{n}" for n in names], entity_rows=[{"entity_id": i} for i in ids]).to_dict()
print(json.dumps(out))
"""


def check(entities: int, workdir: Path, log=print) -> dict:
    from bench import feast_peer
    from bench.reads import _load
    from bench.serve_load import FEAST_FLAGS, _stop, _wait_http
    from bench.standard import SOURCE, write_definitions
    from feature_defs import load_definitions
    from throwaway.servers import free_port, start_redis

    workdir.mkdir(parents=True, exist_ok=True)
    redis = start_redis(workdir / "client-redis", "--logfile", str(workdir / "client-redis.log"))
    processes = []
    try:
        log(f"writing {entities:,} entities of the standard shape with the job, then feast materialize")
        _load(workdir, entities, redis.url)
        defs = write_definitions(workdir / "defs")
        feast_peer.materialize(entities, redis.url, workdir)
        repo = workdir / "feast" / f"repo-{entities}"
        # every scalar feature (floats and ints); the lists stay out (see above)
        names = [f.name for f in load_definitions(defs).source(SOURCE).features if f.type in ("float", "int")]
        ids = [0, 1, entities // 2, entities - 1, entities + 7]  # the last one is not in the table
        servers = {}
        for label in ("ours", "feast"):
            port = free_port()
            if label == "ours":
                run = [sys.executable, "-m", "bench.serve_load", "--serve-child", json.dumps([redis.url, str(defs), True, port])]
            else:
                run = [str(feast_peer.feast_bin()), "-c", str(repo), "serve", "-p", str(port), *FEAST_FLAGS]
            process = subprocess.Popen(
                run, cwd=PROJECT_ROOT, stdout=subprocess.DEVNULL, stderr=open(workdir / f"client-{label}.log", "w"), start_new_session=True
            )
            processes.append(process)
            servers[label] = f"http://127.0.0.1:{port}"
            _wait_http(f"{servers[label]}/health", process, f"{label} server")
        python = feast_peer.feast_bin().parent / "python"
        done = subprocess.run(
            [str(python), "-c", CLIENT, str(repo / "registry.db"), SOURCE, json.dumps(names), json.dumps(ids), json.dumps(servers)],
            capture_output=True, text=True, cwd=workdir,
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"Feast's client failed:\n{done.stderr[-3000:]}")
        answers = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        for process in processes:
            _stop(process)
        redis.stop()
    ours, theirs = answers["ours"], answers["feast"]
    complete = all(v is not None for n in names for v in ours[n][:-1]) and all(ours[n][-1] is None for n in names)
    return {
        "features": len(names),
        "entities": ids,
        "equal": ours == theirs,
        "complete": complete,
        "ours_sample": {k: ours[k] for k in ("entity_id", names[0], names[-1])},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.feast_client", description=__doc__.split("\n\n")[0])
    p.add_argument("--entities", type=int, default=2000, help="entities written (default 2000)")
    p.add_argument("--workdir", type=Path, default=PROJECT_ROOT / ".run" / "bench")
    args = p.parse_args(argv)
    result = check(args.entities, args.workdir.resolve(), log=lambda m: print(m, flush=True))
    print(json.dumps(result, indent=1))
    ok = result["equal"] and result["complete"]
    print("Feast's remote client reads the same values from our server as from feast serve" if ok else "MISMATCH: see above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
