"""Every Kubernetes document in docs/deploy/ is valid as the API server would take it, unknown fields refused
(`kubectl apply --validate=strict`): core objects and every pod template against Kubernetes' own JSON schemas
(kubernetes-validate, strict), the RayCluster and RayJob against KubeRay's v1 CRD schemas (tests/deploy/crd/).

No cluster runs here: a typo such as `nodeselector:` or an option under the wrong key is caught in CI instead of
being dropped silently by the API server (KubeRay's CRDs prune unknown fields) or refused at apply time.
"""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "docs" / "deploy"
CRD = Path(__file__).resolve().parent / "crd"
# The oldest Kubernetes minor the recipe is checked against, and the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
CORE_DOCUMENTS = ["share.yaml"]  # core API objects, checked whole
CUSTOM = {"RayCluster": "raycluster-v1.schema.json.gz", "RayJob": "rayjob-v1.schema.json.gz"}


def _documents(name: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all((DEPLOY / name).read_text()) if doc is not None]


def _ray_documents() -> list[tuple[str, dict]]:
    return [(name, doc) for name in ("raycluster.yaml", "rayjob.yaml") for doc in _documents(name)]


def strict(schema: dict) -> dict:
    """An OpenAPI v3 CRD schema as a JSON Schema that refuses unknown fields, as the API server does for a
    structural schema under strict field validation: every object that lists its properties allows no others."""
    schema = copy.deepcopy(schema)

    def close(node):
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node \
                    and not node.get("x-kubernetes-preserve-unknown-fields"):
                node["additionalProperties"] = False
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for value in node:
                close(value)

    close(schema)
    return schema


def _crd_schema(kind: str) -> dict:
    return strict(json.loads(gzip.decompress((CRD / CUSTOM[kind]).read_bytes())))


def _problems(validator: jsonschema.Draft7Validator, doc: dict) -> list[str]:
    return [f"{'.'.join(map(str, error.absolute_path)) or '(top)'}: {error.message}"
            for error in validator.iter_errors(doc)]


def pod_templates(doc: dict) -> dict[str, dict]:
    """Where a pod template sits in a RayCluster or RayJob -> the template."""
    spec = doc["spec"]
    if doc["kind"] == "RayJob":
        found = {"spec.submitterPodTemplate": spec["submitterPodTemplate"]} if "submitterPodTemplate" in spec else {}
        if "rayClusterSpec" in spec:
            inner = pod_templates({"kind": "RayCluster", "spec": spec["rayClusterSpec"]})
            found |= {f"spec.rayClusterSpec.{where}": template for where, template in inner.items()}
        return found
    found = {"spec.headGroupSpec.template": spec["headGroupSpec"]["template"]}
    for i, group in enumerate(spec.get("workerGroupSpecs", [])):
        found[f"spec.workerGroupSpecs[{i}].template"] = group["template"]
    return found


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", CORE_DOCUMENTS)
def test_core_objects_validate_strictly_against_the_kubernetes_schemas(name, version):
    for doc in _documents(name):
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_pod_template_validates_strictly_against_the_kubernetes_schemas(version):
    checked = 0
    for name, doc in _ray_documents():
        for where, template in pod_templates(doc).items():
            wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "check"}, "template": template}
            try:
                kubernetes_validate.validate(wrapped, version, strict=True)
            except kubernetes_validate.ValidationError as err:
                pytest.fail(f"{name}: {where}.{'.'.join(map(str, list(err.path)[1:]))}: {err.message}")
            checked += 1
    assert checked >= 3  # head, GPU workers, the RayJob's submitter


@pytest.mark.parametrize("name, doc", _ray_documents(), ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_ray_objects_validate_strictly_against_kuberays_v1_crds(name, doc):
    assert doc["apiVersion"] == "ray.io/v1", f"{name}: KubeRay's served and stored version is ray.io/v1"
    validator = jsonschema.Draft7Validator(_crd_schema(doc["kind"]))
    assert _problems(validator, doc) == [], name


@pytest.mark.parametrize("kind", CUSTOM)
def test_the_strict_crd_check_refuses_an_unknown_field_and_a_wrong_type(kind):
    """The check itself: a misspelt field deep in a pod template and a field of the wrong type are found."""
    (doc,) = [d for _, d in _ray_documents() if d["kind"] == kind]
    validator = jsonschema.Draft7Validator(_crd_schema(kind))
    bad = copy.deepcopy(doc)
    template = next(iter(pod_templates(bad).values()))
    template["spec"]["nodeselector"] = {"a": "b"}
    bad["spec"]["suspend"] = "yes"
    problems = _problems(validator, bad)
    assert any("'nodeselector' was unexpected" in p for p in problems), problems
    assert any(p.startswith("spec.suspend:") for p in problems), problems
