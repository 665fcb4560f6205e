"""The Spark master this run would use: Java and the Delta jars for a local one, else the
master reachable (standalone, Kubernetes API, YARN's client configuration)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

from fm_config import RunConf
from jobs.operations.doctor.line import DoctorLine


def check_spark(conf: RunConf) -> list[DoctorLine]:
    master = conf.spark.master
    if master.startswith("local"):
        return [_java(), _delta_jars()]
    if master.startswith("spark://"):
        hosts = master[len("spark://") :].split(",")
        down = [h for h in hosts if not _reachable(h, 7077)]
        if len(down) == len(hosts):
            return [
                DoctorLine(
                    "fail",
                    "spark master",
                    f"{master}: no master answers on {', '.join(hosts)}",
                    "start the standalone master or fix spark.master",
                )
            ]
        return [DoctorLine("ok", "spark master", f"{master}: reachable" + (f" ({', '.join(down)} down)" if down else ""))]
    if master.startswith("k8s://"):
        api = urlsplit(master[len("k8s://") :] if "://" in master[len("k8s://") :] else "https://" + master[len("k8s://") :])
        ok = _reachable(api.netloc, 443)
        return [
            DoctorLine(
                "ok" if ok else "fail",
                "spark master",
                f"{master}: Kubernetes API {'reachable' if ok else 'unreachable'}",
                "check the API server address and this host's network",
            )
        ]
    if master == "yarn":
        folder = os.environ.get("HADOOP_CONF_DIR") or os.environ.get("YARN_CONF_DIR")
        if folder and (Path(folder) / "yarn-site.xml").is_file():
            return [DoctorLine("ok", "spark master", f"yarn: {Path(folder) / 'yarn-site.xml'}")]
        return [
            DoctorLine(
                "fail",
                "spark master",
                "yarn: no yarn-site.xml in $HADOOP_CONF_DIR or $YARN_CONF_DIR",
                "export HADOOP_CONF_DIR to the cluster's client configuration",
            )
        ]
    return [DoctorLine("warn", "spark master", f"{master}: not a master this check knows (local, spark://, k8s://, yarn)")]


def _java() -> DoctorLine:
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home and (Path(home) / "bin" / "java").exists() else shutil.which("java")
    if not java:
        return DoctorLine("fail", "java", "no java on PATH and no $JAVA_HOME", "install Java 17 or 21 (make setup does)")
    text = subprocess.run([java, "-version"], check=False, capture_output=True, text=True, timeout=30).stderr
    found = re.search(r'version "(\d+)', text)
    major = int(found.group(1)) if found else 0
    if major < 17:
        return DoctorLine(
            "fail", "java", f"{java}: Java {major or '?'}; Spark 4 needs 17 or later", "install Java 17 or 21 and point JAVA_HOME at it"
        )
    return DoctorLine("ok", "java", f"{java}: Java {major}")


def _delta_jars() -> DoctorLine:
    from jobs.jars import delta_jars

    try:
        jars = delta_jars()
    except FileNotFoundError as exc:
        return DoctorLine("fail", "delta jars", str(exc).split(";")[0], "run `make setup` (scripts/setup.sh)")
    return DoctorLine("ok", "delta jars", ", ".join(j.name for j in jars))


def _reachable(address: str, default_port: int) -> bool:
    host, _, port = address.rpartition(":") if ":" in address else (address, "", "")
    try:
        socket.create_connection((host or address, int(port or default_port)), timeout=5).close()
        return True
    except (OSError, ValueError):
        return False
