"""deploy/kubernetes: every manifest is valid against Kubernetes's own schemas (offline, the
schemas bundled with kubernetes-validate, strict: no unknown field), and the pieces fit together:
the probes hit /livez and /readyz on the port the ConfigMap's settings listen on, the Redis URL
comes from the Secret, the settings load as a node would load them, and the grace period outlasts
a graceful stop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from ingestion.config import load
from tests.support.deploy import DEPLOY

MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
K8S_VERSION = "1.30.0"  # the oldest version the manifests promise to fit


def resources() -> dict[str, dict[str, Any]]:
    out = {}
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            out[doc["kind"]] = doc
    return out


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_each_manifest_is_valid_against_the_kubernetes_schemas(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        for version in (K8S_VERSION, kubernetes_validate.latest_version()):
            kubernetes_validate.validate(doc, version, strict=True)


def test_a_deployment_of_three_probed_on_livez_and_readyz_with_the_redis_url_from_a_secret(
    tmp_path: Path,
) -> None:
    r = resources()
    assert set(r) == {"ConfigMap", "Secret", "Deployment", "PodDisruptionBudget"}
    deployment, pdb = r["Deployment"], r["PodDisruptionBudget"]
    assert deployment["spec"]["replicas"] == 3
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    [port] = [p for p in container["ports"] if p["name"] == "metrics"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    env = {e["name"]: e for e in container["env"]}
    secret_ref = env["INGESTION_REDIS_URL"]["valueFrom"]["secretKeyRef"]
    assert secret_ref["name"] == r["Secret"]["metadata"]["name"]
    assert secret_ref["key"] in r["Secret"]["stringData"]
    [config_volume] = [v for v in pod["volumes"] if "configMap" in v]
    assert config_volume["configMap"]["name"] == r["ConfigMap"]["metadata"]["name"]

    # The settings as the container's node would load them: the ConfigMap's file at --config,
    # the environment from the Deployment (the Secret's and the pod's values filled in).
    config = tmp_path / "config.toml"
    config.write_text(r["ConfigMap"]["data"]["config.toml"])
    assert container["args"] == ["run", "--config", "/etc/ingestion/config.toml"]
    environ = {"INGESTION_NODE_ID": "ingestion-5d9f-abcde",
               "INGESTION_REDIS_URL": r["Secret"]["stringData"][secret_ref["key"]]}  # fmt: skip
    settings = load(config, environ, {})
    assert settings.observe.metrics_port == port["containerPort"]
    assert settings.observe.listen_host == "0.0.0.0"  # the kubelet probes from outside the pod
    assert settings.redis.url == environ["INGESTION_REDIS_URL"]

    # A graceful stop is one in-flight commit and one release, each bounded by redis.timeout_ms;
    # the grace period must outlast it with room (and a whole lease TTL besides).
    drain_ms = 2 * settings.redis.timeout_ms + settings.lease.ttl_ms
    assert pod["terminationGracePeriodSeconds"] * 1000 > 2 * drain_ms

    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1  # two nodes left: one leads, one stands by
