"""The Kubernetes manifests in docs/ are consistent with themselves."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from .stop_statement import ROOT

PAGES = ["docs/deploy.md", "docs/scaling.md"]


def _manifests(page: str) -> list[list[dict[str, Any]]]:
    """Each ```yaml block of ``page`` that holds Kubernetes objects, as its documents."""
    blocks = re.findall(r"```yaml\n(.*?)```", (ROOT / page).read_text(), flags=re.DOTALL)
    objects = []
    for block in blocks:
        docs = [d for d in yaml.safe_load_all(block) if isinstance(d, dict) and "kind" in d]
        if docs:
            objects.append(docs)
    return objects


def _statefulset_problems(docs: list[dict[str, Any]]) -> list[str]:
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    problems = []
    for sts in (d for d in docs if d["kind"] == "StatefulSet"):
        name = sts["spec"]["serviceName"]
        service = services.get(name)
        labels = sts["spec"]["template"]["metadata"]["labels"]
        if service is None:
            problems.append(f"{sts['metadata']['name']}: serviceName {name} is not in the block")
        elif service["spec"].get("clusterIP") != "None":
            problems.append(f"{sts['metadata']['name']}: serviceName {name} is not headless")
        elif service["spec"]["selector"] != labels:
            problems.append(f"{sts['metadata']['name']}: {name} selects other pods")
    return problems


@pytest.mark.parametrize("page", PAGES)
def test_a_statefulset_names_a_headless_service_that_selects_its_pods(page: str) -> None:
    blocks = [docs for docs in _manifests(page) if any(d["kind"] == "StatefulSet" for d in docs)]
    assert blocks, f"{page} has a StatefulSet"
    assert [p for docs in blocks for p in _statefulset_problems(docs)] == []


def test_the_manifest_check_rejects_a_statefulset_behind_an_ordinary_service() -> None:
    sts = {
        "kind": "StatefulSet",
        "metadata": {"name": "s"},
        "spec": {"serviceName": "svc", "template": {"metadata": {"labels": {"app": "a"}}}},
    }
    plain = {"kind": "Service", "metadata": {"name": "svc"}, "spec": {"selector": {"app": "a"}}}
    assert _statefulset_problems([sts, plain]) == ["s: serviceName svc is not headless"]
