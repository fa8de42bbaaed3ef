"""The deploy files name only settings, flags, extras, paths and routes that exist, and
the image installs what the README's first command and its video line install. (No Docker engine or
Kubernetes cluster runs here: these checks are what can be proved without one.)"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.docs import ADD_VIDEO, INSTALL_AND_SERVE

from gateway.cli import settings_from_args
from gateway.settings import ENGINES, ENV_PREFIX, Settings, setting_names
from gateway.store.redis_url import parse_redis_url

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SETTINGS = {ENV_PREFIX + name.upper() for name in setting_names()}
ROUTES = {"/healthz", "/readyz", "/metrics", "/v1/models", "/v1/realtime", "/v1/realtime/video"}


def env_names(text: str) -> set[str]:
    return set(re.findall(r"\bOMNI_GATEWAY_[A-Z_]+\b", text))


def extras(spec: str) -> set[str]:
    match = re.search(r"\.\[([\w,]+)\]", spec)
    return set(match.group(1).split(",")) if match else set()


def test_every_environment_variable_the_deploy_files_name_is_a_setting() -> None:
    for path in [*DEPLOY.glob("*"), *DEPLOY.glob("k8s/*")]:
        if path.is_file() and path.suffix != ".py":
            unknown = env_names(path.read_text()) - SETTINGS
            assert not unknown, f"{path.relative_to(ROOT)} names settings that do not exist: {sorted(unknown)}"


def test_the_image_installs_what_the_readme_installs() -> None:
    """The first command's extras and the video line's (torch from the CPU index, as the README
    says), and the MCP client a deployment's sessions may call."""
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    installs = [line for line in dockerfile.splitlines() if "pip install" in line and "'." in line]
    assert len(installs) == 1, installs
    assert extras(INSTALL_AND_SERVE) == {"cpu", "webrtc"} and extras(ADD_VIDEO) == {"video"}
    assert extras(installs[0]) == extras(INSTALL_AND_SERVE) | extras(ADD_VIDEO) | {"mcp"}
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras(installs[0]) <= declared.keys()
    index = re.search(r"--index-url (\S+)", ADD_VIDEO)
    assert index and re.search(rf"pip install --index-url {re.escape(index.group(1))} 'torch==[\d.]+'", dockerfile)
    copied = set(re.findall(r"^COPY (\S+) ", dockerfile, re.M))
    for package in ("gateway", "orchestrator", "omni_gateway_client", "web_demo"):  # web_demo: the pages it serves
        assert package in copied, f"the image lacks {package}/"
        assert (ROOT / package).is_dir()


def deployment() -> dict[str, Any]:
    documents = yaml.safe_load_all((DEPLOY / "k8s/deployment.yaml").read_text())
    found: dict[str, Any] = next(d for d in documents if d and d.get("kind") == "Deployment")
    return found


def _cmd(dockerfile: str) -> list[str]:
    match = re.search(r"^CMD (\[.*\])$", dockerfile, re.M)
    assert match
    argv: list[str] = yaml.safe_load(match.group(1))
    return argv


def test_the_commands_the_image_and_the_manifests_run_are_valid() -> None:
    argv = _cmd((DEPLOY / "Dockerfile").read_text())
    container: dict[str, Any] = deployment()["spec"]["template"]["spec"]["containers"][0]
    for command in (argv, container["args"]):
        assert command[0] == "omni-gateway"
        settings_from_args(command[1:], environ={})  # argparse exits 2 on an unknown flag or choice
    for env in container["env"]:
        if env["name"] == "OMNI_GATEWAY_ENGINE":
            assert env["value"] in ENGINES


@pytest.mark.parametrize("name", ["compose.yaml", "compose.sentinel.yaml", "compose.cluster.yaml"])
def test_compose_names_real_settings_and_engines(name: str) -> None:
    compose = yaml.safe_load((DEPLOY / name).read_text())
    for service in compose["services"].values():
        environment = service.get("environment") or {}
        for key, value in environment.items():
            assert key in SETTINGS, key
            if key == "OMNI_GATEWAY_ENGINE":
                default = re.sub(r"^\$\{\w+:-(\w+)\}$", r"\1", str(value))
                assert default in ENGINES, value
        build = service.get("build")
        if build:
            assert (DEPLOY / build["context"] / build["dockerfile"]).is_file()


def test_the_manifests_probe_routes_the_gateway_serves() -> None:
    container = deployment()["spec"]["template"]["spec"]["containers"][0]
    probes = [
        container[k]["httpGet"]["path"] for k in ("livenessProbe", "readinessProbe", "startupProbe") if k in container
    ]
    assert probes and set(probes) <= ROUTES
    healthcheck = re.search(r"HEALTHCHECK.*?(/\w+)'", (DEPLOY / "Dockerfile").read_text(), re.S)
    assert healthcheck and healthcheck.group(1) in ROUTES


def test_a_rolling_update_lets_every_replica_drain_before_it_is_killed() -> None:
    """Kubernetes: a new pod is ready before an old one goes; the old one leaves the endpoints
    (preStop) before its drain, and the grace period outlasts both, so the kubelet's SIGKILL
    never cuts an answer the drain window would have let finish; readiness is /readyz, which
    a draining replica answers 503. Compose: stop_grace_period outlasts the drain too, and
    roll.sh replaces the replicas one at a time, waiting for each to be healthy."""
    drain = float(Settings().drain_window_s)
    spec = deployment()["spec"]
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] >= float(pre_stop[1]) + drain + 10
    readiness = container["readinessProbe"]
    assert readiness["httpGet"]["path"] == "/readyz" and readiness["periodSeconds"] * readiness["failureThreshold"] <= 5
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for name in ("gateway-1", "gateway-2"):
        grace = compose["services"][name]["stop_grace_period"]
        assert grace.endswith("s") and float(grace[:-1]) >= drain + 10, grace
    roll = (DEPLOY / "roll.sh").read_text()
    assert "gateway-1 gateway-2" in roll and "--wait" in roll and " stop " in roll
    subprocess.run(["bash", "-n", str(DEPLOY / "roll.sh")], check=True)


# --- the Redis topologies (compose.sentinel.yaml, compose.cluster.yaml, k8s/redis-*.yaml) ---


def compose_with(override: str) -> dict[str, Any]:
    """compose.yaml with ``override`` laid over it (services merged by name, keys replaced)."""
    base: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    over = yaml.safe_load((DEPLOY / override).read_text())
    for name, service in over["services"].items():
        merged = base["services"].setdefault(name, {})
        for key, value in service.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
    return base


def gateway_urls(compose: dict[str, Any]) -> set[str]:
    return {
        s["environment"]["OMNI_GATEWAY_REDIS_URL"] for n, s in compose["services"].items() if n.startswith("gateway")
    }


def test_the_sentinel_compose_points_every_gateway_at_its_sentinels_and_waits_for_every_replica() -> None:
    compose = compose_with("compose.sentinel.yaml")
    (url,) = gateway_urls(compose)
    target = parse_redis_url(url)
    services = compose["services"]
    sentinels = {n for n, s in services.items() if "--sentinel" in str(s.get("command"))}
    replicas = {n for n, s in services.items() if "--replicaof" in (s.get("command") or [])}
    assert target.topology == "sentinel" and {h for h, _ in target.nodes} == sentinels and len(sentinels) == 3
    assert all(p == 26379 for _, p in target.nodes)
    for name in sentinels:
        conf = services[name]["command"][0]
        assert f"sentinel monitor {target.master} redis 6379 2" in conf  # the master's name, quorum 2 of 3
        assert "exec redis-server /tmp/sentinel.conf --sentinel" in conf
        subprocess.run(["sh", "-n", "-c", conf.replace("$$", "$")], check=True)  # (compose's $$ is a $)
    assert target.wait_replicas == len(replicas) == 2  # whichever replica is promoted has every write
    for name in replicas:
        command = services[name]["command"]
        assert command[command.index("--replicaof") + 1] == "redis"
    for name, service in services.items():
        if name.startswith("gateway"):
            assert sentinels <= set(service["depends_on"])


def test_the_cluster_compose_points_every_gateway_at_cluster_nodes() -> None:
    compose = compose_with("compose.cluster.yaml")
    (url,) = gateway_urls(compose)
    target = parse_redis_url(url)
    services = compose["services"]
    nodes = {n for n, s in services.items() if "--cluster-enabled" in (s.get("command") or [])}
    assert target.topology == "cluster" and {h for h, _ in target.nodes} <= nodes
    init = services["redis-cluster-init"]["command"][0]
    replicas = int(re.search(r"--cluster-replicas (\d+)", init).group(1))  # type: ignore[union-attr]
    listed = re.search(r"for n in ([\w -]+); do echo", init).group(1).split()  # type: ignore[union-attr]
    assert set(listed) == nodes and len(nodes) == 3 * (1 + replicas) and replicas >= 1  # 3 masters, a replica each
    subprocess.run(["sh", "-n", "-c", init.replace("$$", "$")], check=True)
    for name, service in services.items():
        if name.startswith("gateway"):
            assert service["depends_on"]["redis-cluster-init"]["condition"] == "service_completed_successfully"


def manifests(name: str) -> dict[str, dict[str, Any]]:
    docs = yaml.safe_load_all((DEPLOY / "k8s" / name).read_text())
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs if d}


def secret_url(name: str) -> str:
    found = re.search(r"--from-literal=redis-url='([^']+)'", (DEPLOY / "k8s" / name).read_text())
    assert found, f"k8s/{name} says which redis-url to give the gateway"
    return found.group(1)


def test_the_kubernetes_sentinel_url_names_the_sentinel_pods_and_waits_for_every_replica() -> None:
    found = manifests("redis-sentinel.yaml")
    target = parse_redis_url(secret_url("redis-sentinel.yaml"))
    sentinels = found["StatefulSet/redis-sentinel"]["spec"]
    data = found["StatefulSet/redis"]["spec"]
    assert target.topology == "sentinel"
    assert [h for h, _ in target.nodes] == [f"redis-sentinel-{i}.redis-sentinel" for i in range(sentinels["replicas"])]
    assert sentinels["serviceName"] == "redis-sentinel" and "Service/redis-sentinel" in found
    assert data["serviceName"] == "redis" and "Service/redis" in found
    assert target.wait_replicas == data["replicas"] - 1  # every replica of the master
    scripts = found["ConfigMap/redis-sentinel-scripts"]["data"]
    assert f"sentinel monitor {target.master} $master 6379 2" in scripts["sentinel.sh"]
    assert f"get-master-addr-by-name {target.master}" in scripts["redis.sh"]
    subprocess.run(["sh", "-n", "-c", scripts["redis.sh"]], check=True)
    subprocess.run(["sh", "-n", "-c", scripts["sentinel.sh"]], check=True)


def test_the_kubernetes_cluster_url_names_cluster_pods_and_the_job_makes_three_masters_with_replicas() -> None:
    found = manifests("redis-cluster.yaml")
    target = parse_redis_url(secret_url("redis-cluster.yaml"))
    nodes = found["StatefulSet/redis-cluster"]["spec"]
    assert target.topology == "cluster" and nodes["serviceName"] == "redis-cluster"
    pods = {f"redis-cluster-{i}.redis-cluster" for i in range(nodes["replicas"])}
    assert {h for h, _ in target.nodes} <= pods
    assert "--cluster-enabled yes" in nodes["template"]["spec"]["containers"][0]["args"][0]
    job = found["Job/redis-cluster-init"]["spec"]["template"]["spec"]["containers"][0]["args"][0]
    replicas = int(re.search(r"--cluster-replicas (\d+)", job).group(1))  # type: ignore[union-attr]
    listed = re.search(r"for i in ([\d ]+); do", job).group(1).split()  # type: ignore[union-attr]
    assert len(listed) == nodes["replicas"] == 3 * (1 + replicas) and replicas >= 1
    subprocess.run(["sh", "-n", "-c", job], check=True)
