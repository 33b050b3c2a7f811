"""deploy/k8s: the manifests parse, validate against the Kubernetes API schemas (strict: no
unknown field), and agree with voxgate itself: its flags, its metrics, its drain time. No
cluster is used: they are untested against a real one."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gateway import cli
from gateway.metrics import GatewayMetrics
from gateway.ws_handler import CLOSE_GRACE_S
from tests.conftest import ROOT

K8S = ROOT / "deploy" / "k8s"
_KUBERNETES_VERSION = "1.30.0"  # the first with lifecycle.preStop.sleep on by default
_ENGINE_STOP_S = 5.0  # EngineSupervisor.stop: the engine's join before it is killed


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d is not None]


def _manifests() -> dict[str, dict[str, Any]]:
    """The resources kustomization.yaml lists, by kind."""
    kustomization = _docs("kustomization.yaml")[0]
    out: dict[str, dict[str, Any]] = {}
    for name in kustomization["resources"]:
        for doc in _docs(name):
            assert doc["kind"] not in out, f"two {doc['kind']} manifests"
            out[doc["kind"]] = doc
    return out


def _container() -> dict[str, Any]:
    containers = _manifests()["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def _serve_args() -> Any:
    container = _container()
    assert container["command"] == ["voxgate", "serve"]
    return cli.build_parser().parse_args(["serve", *container["args"]])


def test_every_yaml_file_parses_and_kustomization_lists_the_manifests() -> None:
    """Each file is YAML; kustomization.yaml names every Kubernetes manifest of the folder."""
    files = sorted(p.name for p in K8S.glob("*.yaml"))
    for name in files:
        assert _docs(name), name
    listed = set(_docs("kustomization.yaml")[0]["resources"])
    assert listed == {"deployment.yaml", "service.yaml", "hpa.yaml"}
    assert set(files) - listed == {"kustomization.yaml", "prometheus-adapter-values.yaml"}


@pytest.mark.parametrize("kind", ["Deployment", "Service", "HorizontalPodAutoscaler"])
def test_manifests_validate_against_the_kubernetes_schemas(kind: str) -> None:
    """Strict validation against the API schemas of Kubernetes 1.30 (kubernetes-validate)."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    manifest = _manifests()[kind]
    kubernetes_validate.validate(manifest, _KUBERNETES_VERSION, True)  # raises when invalid


def test_the_container_runs_voxgate_with_flags_it_accepts() -> None:
    """The args are `voxgate serve` flags that map onto valid configs: one engine on the GPU
    the pod requests, on every interface, the port the probes and the Service use."""
    args = _serve_args()
    gateway, engine = cli.configs_from_args(args)
    container = _container()
    gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
    assert len(gateway.gpus) == gpus == int(container["resources"]["requests"]["nvidia.com/gpu"])
    assert engine.device == "cuda" and gateway.host == "0.0.0.0"
    port = next(p for p in container["ports"] if p["name"] == "http")["containerPort"]
    assert gateway.port == port


def test_probes_ask_health_on_the_served_port() -> None:
    """Startup, readiness and liveness all GET /health on the named port; start-up allows the
    engine's own start timeout; liveness tolerates an engine restart far longer than readiness."""
    container = _container()
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert (get["path"], get["port"]) == ("/health", "http"), probe
    startup = container["startupProbe"]
    gateway, _ = cli.configs_from_args(_serve_args())
    assert startup["periodSeconds"] * startup["failureThreshold"] >= min(gateway.engine_start_timeout_s, 900)
    ready, live = container["readinessProbe"], container["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] > 10 * ready["periodSeconds"] * ready["failureThreshold"]


def test_the_grace_period_covers_prestop_the_drain_and_the_close() -> None:
    """terminationGracePeriodSeconds >= the preStop pause + --drain-timeout-s + the close grace
    and the engine's stop, so that a drain is never cut by SIGKILL."""
    pod = _manifests()["Deployment"]["spec"]["template"]["spec"]
    pause = _container()["lifecycle"]["preStop"]["sleep"]["seconds"]
    gateway, _ = cli.configs_from_args(_serve_args())
    assert gateway.drain_timeout_s > 0
    assert pod["terminationGracePeriodSeconds"] >= pause + gateway.drain_timeout_s + CLOSE_GRACE_S + _ENGINE_STOP_S


def test_shared_memory_is_large_enough_for_the_engine_queues() -> None:
    """/dev/shm is a memory volume with room for two 32 MiB queues per engine (a container's
    default 64 MiB is not)."""
    pod = _manifests()["Deployment"]["spec"]["template"]["spec"]
    mount = next(m for m in _container()["volumeMounts"] if m["mountPath"] == "/dev/shm")
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["emptyDir"]["medium"] == "Memory"
    size = volume["emptyDir"]["sizeLimit"]
    assert size.endswith("Gi") and float(size[:-2]) * 1024 >= 2 * 32 * len(cli.configs_from_args(_serve_args())[0].gpus) + 64


def test_service_and_autoscaler_point_at_the_deployment() -> None:
    """The Service selects the pods and targets their named port; the autoscaler scales the
    Deployment on a metric voxgate exports, which the adapter values serve."""
    m = _manifests()
    labels = m["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert m["Deployment"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert m["Service"]["spec"]["selector"].items() <= labels.items()
    assert m["Service"]["spec"]["ports"][0]["targetPort"] == "http"
    hpa = m["HorizontalPodAutoscaler"]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                     "name": m["Deployment"]["metadata"]["name"]}
    exported = GatewayMetrics().render().decode()
    adapter = _docs("prometheus-adapter-values.yaml")[0]["rules"]["custom"]
    served = {rule["name"]["as"] for rule in adapter}
    for metric in hpa["metrics"]:
        name = metric["pods"]["metric"]["name"]
        assert f"# TYPE {name} gauge" in exported and name in served
    for name in served:
        assert f"# TYPE {name} gauge" in exported


def test_deploy_doc_explains_every_field_the_manifests_set() -> None:
    """docs/deploy.md names each leaf field of the manifests (by its key)."""
    doc = (ROOT / "docs" / "deploy.md").read_text()
    missing = sorted({key for kind in _manifests().values() for key in _leaf_keys(kind)
                      if f"`{key}`" not in doc and f".{key}`" not in doc})
    assert missing == []


def _leaf_keys(node: Any) -> set[str]:
    keys: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, (dict, list)) and value:
                keys |= _leaf_keys(value)
            elif key not in ("name", "key", "value"):  # names and env pairs are said as values
                keys.add(key)
    elif isinstance(node, list):
        for item in node:
            keys |= _leaf_keys(item)
    return keys


def test_files_are_where_the_docs_say() -> None:
    """The files docs/deploy.md names exist."""
    doc = (ROOT / "docs" / "deploy.md").read_text()
    assert "`deploy/k8s/`" in doc and "`deploy/haproxy/haproxy.cfg`" in doc
    assert (ROOT / "deploy" / "haproxy" / "haproxy.cfg").is_file()
    for path in K8S.glob("*.yaml"):
        assert f"`{path.name}`" in doc, path.name
