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

A third run reads through our server with HTTPS and bearer tokens on (``server.tls``,
``server.auth``): Feast's client trusts the server's CA (``online_store.cert``) and sends the
token of ``auth: {type: oidc, token_env_var: ...}`` in feature_store.yaml; its answer must be
the same, and the same client without a token must be refused (401).
"""

from __future__ import annotations

import argparse
import json
import os
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
for label, server in servers.items():
    repo = Path(registry).parent.parent / f"client-{label}"
    repo.mkdir(exist_ok=True)
    yaml = (f"project: fm_bench\nregistry: {registry}\nprovider: local\nentity_key_serialization_version: 3\n"
            f"online_store:\n  type: remote\n  path: {server['url']}\n")
    if server.get("cert"):
        yaml += f"  cert: {server['cert']}\n"
    if server.get("token_env"):
        yaml += f"auth:\n  type: oidc\n  token_env_var: {server['token_env']}\n"
    (repo / "feature_store.yaml").write_text(yaml)
    store = FeatureStore(repo_path=str(repo))
    try:
        rows = [{"entity_id": i} for i in ids]
        out[label] = store.get_online_features(features=[f"{source}:{n}" for n in names], entity_rows=rows).to_dict()
    except Exception as exc:  # the run without a token: refused
        out[label] = {"refused": f"{type(exc).__name__}: {exc}"[:300]}
print(json.dumps(out))
"""


def check(entities: int, workdir: Path, log=print) -> dict:
    from bench.harness.data import load_standard
    from bench.harness.feast import FEAST_FLAGS, feast_bin, materialize
    from bench.harness.pki import make_pki
    from bench.harness.servers import stop_process, wait_answering, wait_http
    from bench.standard import SOURCE, write_definitions
    from feature_defs import load_definitions
    from throwaway.servers import free_port, start_redis

    workdir.mkdir(parents=True, exist_ok=True)
    redis = start_redis(workdir / "client-redis", "--logfile", str(workdir / "client-redis.log"))
    processes = []
    try:
        log(f"writing {entities:,} entities of the standard shape with the job, then feast materialize")
        load_standard(workdir, entities, redis.url)
        defs = write_definitions(workdir / "defs")
        materialize(entities, redis.url, workdir)
        repo = workdir / "feast" / f"repo-{entities}"
        # every scalar feature (floats and ints); the lists stay out (see above)
        names = [f.name for f in load_definitions(defs).source(SOURCE).features if f.type in ("float", "int")]
        ids = [0, 1, entities // 2, entities - 1, entities + 7]  # the last one is not in the table
        pki = make_pki(workdir / "client-pki")
        servers: dict[str, dict] = {}
        for label in ("ours", "feast", "ours-tls-token"):
            port = free_port()
            if label == "ours":
                run = [sys.executable, "-m", "bench.serve_load", "--serve-child", json.dumps([redis.url, str(defs), True, port])]
            elif label == "feast":
                run = [str(feast_bin()), "-c", str(repo), "serve", "-p", str(port), *FEAST_FLAGS]
            else:
                run = [
                    sys.executable,
                    "-m",
                    "bench.serve_cost",
                    "--serve-child",
                    json.dumps([redis.url, str(defs), port, "tls+auth", pki["folder"]]),
                ]
            process = subprocess.Popen(
                run, cwd=PROJECT_ROOT, stdout=subprocess.DEVNULL, stderr=open(workdir / f"client-{label}.log", "w"), start_new_session=True
            )
            processes.append(process)
            if label == "ours-tls-token":
                url, ca = f"https://127.0.0.1:{port}", f"{pki['folder']}/ca.pem"
                servers[label] = {"url": url, "cert": ca, "token_env": "FM_BENCH_TOKEN"}
                servers["ours-tls-no-token"] = {"url": url, "cert": ca}
                import ssl

                wait_answering(f"{url}/health", process, ssl.create_default_context(cafile=ca))
            else:
                servers[label] = {"url": f"http://127.0.0.1:{port}"}
                wait_http(f"{servers[label]['url']}/health", process, f"{label} server")
        python = feast_bin().parent / "python"
        done = subprocess.run(
            [str(python), "-c", CLIENT, str(repo / "registry.db"), SOURCE, json.dumps(names), json.dumps(ids), json.dumps(servers)],
            capture_output=True, text=True, cwd=workdir, env={**os.environ, "FM_BENCH_TOKEN": pki["tokens"][0]},
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"Feast's client failed:\n{done.stderr[-3000:]}")
        answers = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        for process in processes:
            stop_process(process)
        redis.stop()
    ours, theirs, secured = answers["ours"], answers["feast"], answers["ours-tls-token"]
    complete = all(v is not None for n in names for v in ours[n][:-1]) and all(ours[n][-1] is None for n in names)
    return {
        "features": len(names),
        "entities": ids,
        "equal": ours == theirs,
        "equal_over_tls_with_a_token": secured == ours,
        "refused_without_a_token": answers["ours-tls-no-token"].get("refused"),
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
    ok = (
        result["equal"]
        and result["complete"]
        and result["equal_over_tls_with_a_token"]
        and "401" in (result["refused_without_a_token"] or "")
    )
    print(
        "Feast's remote client reads the same values from our server as from feast serve, also over HTTPS with a bearer token"
        if ok
        else "MISMATCH: see above"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
