"""The testcontainers path runs docker-compose.yml's images, and ``make test`` leaves the
native stack down when it is taken."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from tests.conftest import IMAGES

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
IMAGE_LITERAL = re.compile(r"^[a-z0-9][a-z0-9./_-]*:[0-9][0-9A-Za-z._-]*$")


def test_testcontainers_images_are_compose_images() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert {name: services[name]["image"] for name in IMAGES} == IMAGES
    assert set(IMAGES) == {"postgres", "kafka", "redis", "opensearch"}


def test_conftest_names_no_other_image() -> None:
    tree = ast.parse((ROOT / "tests" / "conftest.py").read_text())
    literals = {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and IMAGE_LITERAL.match(node.value)
    }
    assert literals == set(IMAGES.values())


def test_make_test_starts_the_native_stack_only_without_docker() -> None:
    makefile = (ROOT / "Makefile").read_text()
    target = re.search(r"^test:(.*)\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert target is not None
    prerequisites, recipe = target.group(1).split(), target.group(2)
    assert "stack" not in prerequisites
    # The same test as tests/conftest.py's _docker_answers: CDC_TEST_NATIVE, then docker info.
    docker_check = recipe.index("docker info")
    assert "CDC_TEST_NATIVE" in recipe[:docker_check]
    assert recipe.index("scripts/stack up") > recipe.index("else")
