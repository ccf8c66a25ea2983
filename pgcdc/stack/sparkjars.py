"""The Spark Kafka connector jars for the installed pyspark, fetched once from Maven Central.

Only the four jars pyspark does not ship are fetched; adding pyspark's own jars a second
time (different versions on one classpath) breaks Spark in confusing ways.
"""

from __future__ import annotations

import fcntl
import hashlib
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from pgcdc.stack import common

CENTRAL = "https://repo1.maven.org/maven2"
SCALA = "2.13"  # pyspark 4.x is built for Scala 2.13 only


def spark_version() -> str:
    """pyspark's version: the installed package if the venv has it, else pyproject's pin."""
    for info in sorted(common.REPO.glob(".venv/lib/python*/site-packages/pyspark-*.dist-info")):
        return info.name.removeprefix("pyspark-").removesuffix(".dist-info")
    pin = re.search(r'"pyspark==([^"]+)"', (common.REPO / "pyproject.toml").read_text())
    if pin is None:
        raise common.StackError(
            "cannot tell the Spark version: no pyspark in .venv and no "
            "pyspark==X pin in pyproject.toml"
        )
    return pin.group(1)


def _url(group: str, artifact: str, version: str, ext: str) -> str:
    return f"{CENTRAL}/{group.replace('.', '/')}/{artifact}/{version}/{artifact}-{version}.{ext}"


def _fetch_verified(url: str, dest: Path) -> Path:
    """Download once and check the SHA-1 Maven Central publishes next to the file."""
    if dest.exists():
        return dest
    part = common.download(url, dest.with_name(dest.name + ".unverified"))
    sha_file = common.download(url + ".sha1", dest.with_name(dest.name + ".sha1"))
    want = sha_file.read_text().split()[0].strip().lower()
    got = hashlib.sha1(part.read_bytes()).hexdigest()
    if got != want:
        part.unlink()
        raise common.StackError(f"checksum mismatch for {url}: got {got}, want {want}")
    part.replace(dest)
    return dest


def _released(group: str, artifact: str, folder: Path) -> list[tuple[int, ...]]:
    """Release versions (no previews) listed in the artifact's maven-metadata.xml."""
    meta = folder / f"{artifact}.maven-metadata.xml"
    if not meta.exists():
        url = f"{CENTRAL}/{group.replace('.', '/')}/{artifact}/maven-metadata.xml"
        common.download(url, meta)
    found = []
    for node in ET.parse(meta).getroot().iter("version"):
        if node.text and re.fullmatch(r"\d+(\.\d+)*", node.text.strip()):
            found.append(tuple(int(x) for x in node.text.strip().split(".")))
    return sorted(found, reverse=True)


def _token_provider_version(spark: str, folder: Path) -> str:
    """The token-provider version to use: Spark's own, else the newest same-major release below.

    Maven Central (as these machines see it) has no spark-token-provider-kafka-0-10 after
    4.0.0, although spark-sql-kafka 4.2.0 depends on it. The module's API (KafkaConfigUpdater,
    KafkaTokenUtil) is unchanged across 4.x, so the newest earlier 4.x release stands in, with a
    warning. It only matters when Kafka delegation tokens are used.
    """
    artifact = f"spark-token-provider-kafka-0-10_{SCALA}"
    if (folder / f"{artifact}-{spark}.jar").exists():
        return spark
    want = tuple(int(x) for x in spark.split("."))
    released = _released("org.apache.spark", artifact, folder)
    if want in released:
        return spark
    older = [v for v in released if v[0] == want[0] and v < want]
    if not older:
        raise common.StackError(f"no {artifact} release for Spark {spark} on Maven Central")
    chosen = ".".join(map(str, older[0]))
    common.say(f"warning: {artifact}:{spark} is not on Maven Central; using {chosen}")
    return chosen


def _spark_properties(version: str, folder: Path) -> dict[str, str]:
    """kafka.version and commons-pool2.version as Spark's own parent pom pins them."""
    pom = _fetch_verified(
        _url("org.apache.spark", f"spark-parent_{SCALA}", version, "pom"),
        folder / f"spark-parent_{SCALA}-{version}.pom",
    )
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    props = ET.parse(pom).getroot().find("m:properties", ns)
    out: dict[str, str] = {}
    for key in ("kafka.version", "commons-pool2.version"):
        node = props.find(f"m:{key}", ns) if props is not None else None
        if node is None or not (node.text or "").strip():
            raise common.StackError(f"{pom} has no <{key}>; cannot pick connector jars")
        out[key] = (node.text or "").strip()
    return out


def ensure(paths: common.Paths) -> list[Path]:
    """Return the connector jars for the installed pyspark, downloading any that are missing."""
    folder = paths.cache / "spark-jars"
    folder.mkdir(parents=True, exist_ok=True)
    # Jobs started side by side (both sync jobs) fetch the jars once, not in a race.
    with open(folder / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure(folder)


def _ensure(folder: Path) -> list[Path]:
    version = spark_version()
    props = _spark_properties(version, folder)
    wanted = [
        ("org.apache.spark", f"spark-sql-kafka-0-10_{SCALA}", version),
        (
            "org.apache.spark",
            f"spark-token-provider-kafka-0-10_{SCALA}",
            _token_provider_version(version, folder),
        ),
        ("org.apache.kafka", "kafka-clients", props["kafka.version"]),
        ("org.apache.commons", "commons-pool2", props["commons-pool2.version"]),
    ]
    return [_fetch_verified(_url(g, a, v, "jar"), folder / f"{a}-{v}.jar") for g, a, v in wanted]
