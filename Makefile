# feature-materializer: the two commands are `make demo` and `make test`.
VENV   ?= .venv
BIN    := $(VENV)/bin
DATE   ?= 2026-11-20
ENV    ?= local
export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON := $(abspath $(BIN)/python)
# Bytecode caches on, whatever the environment says: without them each pytest process
# rewrote the asserts of 350 modules (12 of its 14 s of collection), each CLI run compiled the product.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup lint demo test test-fast bench bench-targets bench-reads bench-cluster services-start services-stop sample-data submit package airflow-nightly proto clean bench-serve bench-serve-cost bench-serve-floor bench-soak bench-feast-example check-feast-client bench-push

setup:                      ## install Java, redis-server, PostgreSQL, the .venv, the Delta jars and the JVM class archive when missing
	bash scripts/setup.sh

services-start: setup       ## start the local Redis (127.0.0.1:6390) and PostgreSQL (127.0.0.1:6391)
	bash scripts/local_services.sh start

services-stop:
	bash scripts/local_services.sh stop

sample-data: setup          ## (re)write the sample Delta tables under data/
	$(BIN)/materialize sample-data --env $(ENV)

demo: services-start        ## set up, write sample data once, run the nightly job for DATE
	test -d data/consumer_daily/_delta_log -a -d data/store_features_long/_delta_log || $(BIN)/materialize sample-data --env $(ENV)
	$(BIN)/materialize run --env $(ENV) --date $(DATE)

submit: services-start      ## the same job under spark-submit
	$(BIN)/spark-submit --master 'local[2]' --jars "$$($(BIN)/python -m jobs.jars --jars jars)" \
	  jobs/materialize.py --env $(ENV) --date $(DATE)

package: setup              ## build dist/: the project zip (--py-files), the PEX of driver and executors (spark.pyspark.python) and the job bundle
	bash scripts/package.sh

lint:                       ## ruff: lint and format check (pyproject.toml [tool.ruff]); `$(BIN)/ruff format .` and `--fix` mend most
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test:                       ## set up (with the S3 test server), lint, and run the whole suite (real Redis, PostgreSQL, S3 API servers, local Spark)
	bash scripts/setup.sh --test
	$(MAKE) --no-print-directory lint
	PY=$(BIN)/python bash scripts/test_lanes.sh

test-fast:                  ## lint, then the tests without Spark or a venv of their own (2-3 minutes): formats, sinks, clusters, CLI, config, docs
	bash scripts/setup.sh --test-fast
	$(MAKE) --no-print-directory lint
	$(BIN)/python -m pytest -m "not spark and not install and not slow" -n 3 --dist loadfile

BENCH_ENTITIES ?= 100000,1000000
bench: services-start       ## benchmark the job on the standard shape against its baselines (BENCH_ENTITIES=100000,1000000,5000000)
	$(BIN)/python -m bench --env $(ENV) --entities $(BENCH_ENTITIES) --output bench/results/results.json

bench-targets: services-start  ## the fast-end-to-end targets in one run, beside the Redis ceiling and feast materialize (about 25 minutes)
	$(BIN)/python -m bench.targets --output bench/results/targets.json

bench-feast-example: setup  ## feast materialize and materialize run on Feast's own example scaled to 1,000,000 drivers (about 11 minutes)
	$(BIN)/python -m bench.feast_example --output bench/results/feast_example.json

bench-reads: services-start  ## the reader against the raw HMGET ceiling and Feast's get_online_features, and the stampede (about 4 minutes)
	$(BIN)/python -m bench.reads --output bench/results/reads_results.json

bench-cluster: setup        ## Redis write throughput and CPU per entity at 1, 2, 3 primaries and 1, 2 writers (sinks/README.md "Sizing")
	$(BIN)/python -m bench.cluster_scaling --output bench/results/cluster_results.json

airflow-nightly: services-start  ## run the nightly DAG once for DATE with `airflow dags test` (Airflow in .run/airflow)
	test -d data/consumer_daily/_delta_log -a -d data/store_features_long/_delta_log || $(BIN)/materialize sample-data --env $(ENV)
	FM_ENV=$(ENV) bash scripts/airflow_local.sh dags test fm_nightly_nightly $(DATE)

proto:                      ## regenerate serializers/features_pb2.py after editing the .proto
	cd serializers && ../$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. features.proto

clean:
	rm -rf data reports .run spark-warehouse

bench-serve: services-start  ## the feature server under open-loop load (vegeta) beside feast serve: JSON, chart and targets (about 35 minutes)
	$(BIN)/pip install -q -r bench/requirements.txt
	$(BIN)/python -m bench.serve_load --output bench/results/serve_results.json

bench-serve-cost: setup     ## what TLS and bearer tokens cost the feature server: CPU per request and p50/p99 against plain HTTP, modes alternated (about 5 minutes)
	$(BIN)/python -m bench.serve_cost --output bench/results/serve_cost.json

bench-serve-floor: services-start  ## the server's CPU per request against the bare stack (uvicorn, orjson) with and without a redis-py read, and what the load's core has left (about 6 minutes)
	$(BIN)/python -m bench.serve_floor --output bench/results/serve_floor.json

bench-soak: setup           ## the feature server under open-loop load while Redis, PostgreSQL and Redis Cluster fail one at a time (about 7 minutes)
	$(BIN)/python -m bench.soak --output bench/results/soak_results.json

bench-push: setup           ## Feast's POST /push of 1, 10 and 100 rows into Redis: materialize serve beside feast serve, rows/s and p50/p99, same pushes, servers alternated (about 3 minutes)
	$(BIN)/python -m bench.push --output bench/results/push.json

check-feast-client: services-start  ## Feast's own HTTP client (remote online store, its own venv) reads the same values from our server as from feast serve, also over HTTPS with a bearer token
	$(BIN)/python -m bench.feast_client
