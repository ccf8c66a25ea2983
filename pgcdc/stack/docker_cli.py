"""Command line of ``scripts/docker``: prepare, images, up, down, status, engine."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from pgcdc.core.ports import KAFKA_CONTROLLER_PORT, OPTIONAL_PORTS, PORTS, REGISTRY_MANAGEMENT_PORT
from pgcdc.stack import common, docker
from pgcdc.stack.versions import IMAGES, PROFILE_IMAGES

HELP = f"""\
The compose stack (docker-compose.yml): PostgreSQL, Kafka, Redis, OpenSearch, the reader and
both sync jobs, from images the project builds from one Debian base. Each step runs only
when something is missing:

  engine   a Docker engine that answers; as root, Debian's docker.io is installed and
           dockerd started when none answers (log: STACK_DIR/docker/dockerd.log)
  compose  Compose v2 as a docker CLI plugin (Debian 13's package, else built with Go)
  base     {docker.BASE_IMAGE}: pulled, or made with debootstrap when no registry answers
  images   {", ".join(IMAGES.values())}
           (the first is the others' base: it trusts the host's extra CA certificates,
           PGCDC_EXTRA_CA_CERTS, default: /usr/local/share/ca-certificates/*.crt; the
           last runs only under compose's profile `registry`: `up` builds it with --registry)

`up` runs `docker compose up -d --wait` on the native stack's host ports (postgres
{PORTS["postgres"]}, kafka {PORTS["kafka"]} and {KAFKA_CONTROLLER_PORT}, redis {PORTS["redis"]}, opensearch
{PORTS["opensearch"]}); stop the native stack first (scripts/stack down), or move the
ports with PGCDC_POSTGRES_PORT, PGCDC_KAFKA_PORT, PGCDC_KAFKA_CONTROLLER_PORT,
PGCDC_REDIS_PORT, PGCDC_OPENSEARCH_PORT. `up --registry` adds the schema registry for
Avro (the profile `registry`: Apicurio Registry, Confluent's API at
http://127.0.0.1:{OPTIONAL_PORTS["registry"]}/apis/ccompat/v7, inside the network
http://registry:8081/apis/ccompat/v7; health on {REGISTRY_MANAGEMENT_PORT}; PGCDC_REGISTRY_PORT,
PGCDC_REGISTRY_MANAGEMENT_PORT move them). `down` is `docker compose down -v`: containers
(any profile's), network and volumes go; the images and the engine stay (`engine stop` ends
a dockerd this command started).
"""


def _timed(what: str, took: dict[str, float]) -> None:
    common.say(what + ": " + ", ".join(f"{k} {v:.0f}s" for k, v in took.items()))


def cmd_up(build: bool, profiles: tuple[str, ...]) -> int:
    took = docker.prepare(common.paths(), profiles=profiles)
    if build:
        rebuilt = docker.build_images(profiles=profiles)
        took.update({f"rebuild {k}": v for k, v in rebuilt.items()})
    t0 = time.monotonic()
    docker.compose("up", "-d", "--wait", profiles=profiles, timeout=1800, stream=True)
    took["up --wait"] = time.monotonic() - t0
    _timed("ready", took)
    table = "table {{.Service}}\t{{.Status}}\t{{.Ports}}"
    print(docker.compose("ps", "--format", table, profiles=profiles).stdout)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(
        prog="scripts/docker",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("prepare", help="engine, Compose v2 and the base image (no builds)")
    images = sub.add_parser(
        "images", help="prepare, then build the images that are missing (every profile's)"
    )
    images.add_argument(
        "--rebuild", action="store_true", help="build every image (cached steps stay)"
    )
    images.add_argument(
        "--background",
        action="store_true",
        help="run detached at the lowest CPU priority (make test: overlaps the suite)",
    )
    up = sub.add_parser("up", help="prepare, build what is missing, docker compose up -d --wait")
    up.add_argument("--build", action="store_true", help="rebuild the images first (cache kept)")
    up.add_argument(
        "--registry",
        action="store_true",
        help="with the schema registry for Avro (compose's profile `registry`)",
    )
    sub.add_parser("down", help="docker compose down -v: containers, network and volumes")
    sub.add_parser("status", help="docker compose ps")
    engine = sub.add_parser("engine", help="start or stop the Docker engine")
    engine.add_argument("action", choices=("start", "stop", "status"))
    args = parser.parse_args(argv)
    paths = common.paths()
    try:
        if args.cmd == "prepare":
            _timed("prepared", docker.prepare(paths, images=False))
        elif args.cmd == "images" and args.background:
            print(
                f"preparing the Docker images in the background (log {docker.prepare_in_background(paths)})"
            )
        elif args.cmd == "images":
            took = docker.prepare(paths, profiles=PROFILE_IMAGES)
            if os.environ.get("PGCDC_DOCKER_RENICE") == "1":
                docker.renice_engine()
            if args.rebuild:
                took.update(docker.build_images(profiles=PROFILE_IMAGES))
            _timed("images", took)
        elif args.cmd == "up":
            return cmd_up(args.build, ("registry",) if args.registry else ())
        elif args.cmd == "down":
            if not docker.engine_answers():
                print("no Docker engine answers: nothing to take down")
                return 0
            # With every profile: down leaves a running profile's containers otherwise.
            docker.compose(
                "down", "-v", "--remove-orphans", profiles=PROFILE_IMAGES, timeout=600, stream=True
            )
            print("removed the compose project's containers, network and volumes")
        elif args.cmd == "status":
            if not docker.engine_answers():
                print("no Docker engine answers")
                return 1
            out = docker.compose("ps", "--all", profiles=PROFILE_IMAGES, check=False)
            print(out.stdout or out.stderr)
        elif args.action == "start":
            started = docker.start_engine(paths)
            print("dockerd started" if started else "a Docker engine already answers")
        elif args.action == "stop":
            print(
                "dockerd stopped" if docker.stop_engine(paths) else "no dockerd started here runs"
            )
        else:
            answers = docker.engine_answers()
            print("a Docker engine answers" if answers else "no Docker engine answers")
            return 0 if answers else 1
    except common.StackError as e:
        print(f"docker: error: {e}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, subprocess.TimeoutExpired):
        return 130
    return 0
