"""The extras of pyproject.toml by the modules they add, for a one-line answer where one is missing.

The base install reads features (feature_defs, serializers, feature_reader); ``[server]`` adds
``materialize serve``; ``[spark]`` adds the job and every command that starts Spark.
"""

from __future__ import annotations

EXTRA_OF_MODULE = {
    **dict.fromkeys(("pyspark", "py4j", "delta", "great_expectations", "pandas", "pyarrow", "tqdm"), "spark"),
    **dict.fromkeys(("uvicorn", "uvloop", "httptools", "prometheus_client"), "server"),
    **dict.fromkeys(("jwt", "cryptography"), "auth"),
}
TITLES = {"spark": "Spark", "server": "feature server", "auth": "token authentication"}


def missing_extra(exc: ImportError) -> tuple[str, str] | None:
    """(the missing module, its extra) when ``exc`` is the import of an extra's module that is not installed; else None."""
    if not isinstance(exc, ModuleNotFoundError):
        return None
    module = (exc.name or "").partition(".")[0]
    extra = EXTRA_OF_MODULE.get(module)
    return (module, extra) if extra else None


def install_hint(extra: str) -> str:
    return f"pip install 'feature-materializer[{extra}]'"
