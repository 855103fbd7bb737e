"""The deploy files, validated by parsing (no Docker engine or cluster here).

Dockerfile, compose.yaml and k8s/ are checked against what the code accepts: every command is a
``tessera`` subcommand, every ``TESSERA_*`` variable is one :mod:`shared.core.config` reads, every
service gets the required ones (and ``Settings.from_env`` accepts the result), and names,
labels, ports, Secrets and ConfigMaps refer to things that exist.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import shared.core.config
from proto import names as n
from proto.limits import NATS_MAX_PAYLOAD, NATS_MAX_PENDING
from services.cli import SERVICES, build_parser
from services.web.app import settings_from_env
from shared.core.config import Settings, variables
from shared.devstack import natsauth
from tests.deploy.conftest import REPO

REQUIRED = {"TESSERA_NATS_URL", "TESSERA_DATABASE_URL", "TESSERA_OBJECT_STORE"}
S3_REQUIRED = {"TESSERA_S3_ACCESS_KEY", "TESSERA_S3_SECRET_KEY"}
INTERPOLATION = re.compile(r"\$\{([A-Z0-9_]+)(?::?[-?][^}]*)?\}")
COMPOSE_TOP = {"services", "volumes", "networks", "configs", "secrets", "name"}
COMPOSE_SERVICE = {
    "image", "build", "command", "entrypoint", "environment", "depends_on", "healthcheck",
    "volumes", "deploy", "ports", "restart", "stop_grace_period",
}  # fmt: skip


def known_variables() -> set[str]:
    """Every TESSERA_* name shared/core/config/ reads: literals in its sources + every knob's."""
    package = Path(shared.core.config.__file__).parent
    source = "".join(p.read_text() for p in sorted(package.glob("*.py")))
    literals = set(re.findall(r"TESSERA_[A-Z0-9_]+", source))
    return literals | variables()


def subcommands() -> set[str]:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return set(action.choices)  # type: ignore[arg-type]


def test_the_known_variables_include_what_the_readme_documents() -> None:
    known = known_variables()
    assert REQUIRED | S3_REQUIRED | {"TESSERA_NODE", "TESSERA_S3_ENDPOINT"} <= known
    assert {"TESSERA_REPLICAS", "TESSERA_METRICS_PORT", "TESSERA_GRACE_PERIOD"} <= known
    assert set(SERVICES) <= subcommands()


def check_service_env(what: str, env: dict[str, str]) -> Settings:
    """Names known, required ones present, and the values accepted by Settings.from_env.

    The web console (``tessera-web``, compose ``web``) talks to the gateways over NATS only: it
    needs only the NATS URL and must get no PostgreSQL or S3 credentials.
    """
    tessera = {k for k in env if k.startswith("TESSERA_")}
    assert tessera <= known_variables(), f"{what}: unknown {sorted(tessera - known_variables())}"
    if what.removeprefix("tessera-") == "web":
        assert "TESSERA_NATS_URL" in tessera, what
        assert not {"TESSERA_DATABASE_URL", *S3_REQUIRED} & tessera, f"{what}: credentials"
        assert env.get("TESSERA_WEB_TOKEN"), f"{what}: no TESSERA_WEB_TOKEN"
        return settings_from_env(env)
    required = REQUIRED | (
        S3_REQUIRED if env.get("TESSERA_OBJECT_STORE", "").startswith("s3") else set()
    )
    assert required <= tessera, f"{what}: missing {sorted(required - tessera)}"
    return Settings.from_env(env)


# --- Dockerfile -----------------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [
        ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")
    ]
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1]) for ln in lines]


def test_the_dockerfile_builds_one_non_root_image_whose_command_picks_the_service() -> None:
    steps = dockerfile()
    assert steps[0] == ("FROM", "python:3.11-slim")
    users = [arg for op, arg in steps if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert ("ENTRYPOINT", '["tessera"]') in steps
    cmd = [arg for op, arg in steps if op == "CMD"][-1]
    assert yaml.safe_load(cmd)[0] in SERVICES
    runs = " ".join(arg for op, arg in steps if op == "RUN")
    assert "pip install" in runs and "warm_numba.py" in runs
    assert "pip install '.[render]'" in runs  # plain `.` is the client alone: no numba
    assert steps.index(("USER", users[-1])) > max(
        i for i, (op, _) in enumerate(steps) if op == "RUN"
    )
    ignored = (REPO / ".dockerignore").read_text().splitlines()
    for op, arg in steps:
        if op == "COPY":
            source = arg.split()[0]
            assert (REPO / source).exists(), source
            assert f"!{source}" in ignored or f"!{source}/" in ignored, (
                f".dockerignore drops {source}"
            )
    metrics = [arg for op, arg in steps if op == "ENV" and "TESSERA_METRICS_PORT" in arg]
    assert metrics and "9090" in metrics[0]


def test_the_numba_warm_up_script_renders_a_tile() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "deploy" / "warm_numba.py")],
        capture_output=True, text=True, timeout=120, check=False, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "numba cache warm" in done.stdout


# --- compose.yaml ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return dict(yaml.safe_load((REPO / "compose.yaml").read_text()))


def interpolated(value: str) -> str:
    """A compose value with every ${VAR...} replaced by a URL-safe stand-in."""
    return INTERPOLATION.sub(lambda m: f"x-{m.group(1).lower().replace('_', '-')}", value)


def tessera_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        k: s
        for k, s in compose["services"].items()
        if str(s.get("image", "")).startswith("tessera")
    }


def test_compose_uses_only_the_schema_essentials(compose: dict[str, Any]) -> None:
    assert {k for k in compose if not k.startswith("x-")} <= COMPOSE_TOP
    volumes = set(compose.get("volumes") or {})
    for name, svc in compose["services"].items():
        assert set(svc) <= COMPOSE_SERVICE, f"{name}: {set(svc) - COMPOSE_SERVICE}"
        assert "image" in svc or "build" in svc, name
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in compose["services"], f"{name} depends on unknown {dep}"
            assert cond["condition"] in (
                "service_started", "service_healthy", "service_completed_successfully"
            )  # fmt: skip
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in compose["services"][dep], f"{dep} has no healthcheck"
        for mount in svc.get("volumes") or []:
            source = mount.split(":")[0]
            if source.startswith("."):
                assert (REPO / source).exists(), f"{name}: {source}"
            else:
                assert source in volumes, f"{name}: undeclared volume {source}"
        health = svc.get("healthcheck")
        if health:
            assert health["test"][0] in ("CMD", "CMD-SHELL"), name


def test_compose_tessera_services_are_cli_commands_with_complete_settings(
    compose: dict[str, Any],
) -> None:
    services = tessera_services(compose)
    assert {s["command"][0] for s in services.values()} == set(SERVICES)
    assert set(SERVICES) <= subcommands()
    nats_env = compose["services"]["nats"]["environment"]
    for name, svc in services.items():
        role = svc["command"][0]
        env = {k: interpolated(str(v)) for k, v in svc["environment"].items()}
        settings = check_service_env(name, env)
        port = settings.process.metrics_port
        assert port > 0 and f"{port}/readyz" in " ".join(svc["healthcheck"]["test"])
        grace = float(str(svc["stop_grace_period"]).rstrip("s"))
        assert grace > settings.process.grace_period, name
        url = str(svc["environment"]["TESSERA_NATS_URL"])
        assert url.startswith(f"nats://{role}:${{TESSERA_NATS_PASSWORD_{role.upper()}"), url
        assert f"TESSERA_NATS_PASSWORD_{role.upper()}" in nats_env
        needs = svc["depends_on"]
        if role == "web":  # NATS and a gateway to answer it, nothing else
            assert set(needs) == {"nats", "gateway"}, name
            assert needs["gateway"]["condition"] == "service_healthy"
            continue
        assert {"nats", "postgres"} <= set(needs)
        if role != "scheduler":  # the topology owner declares first (shared/devstack/natsauth.py)
            assert needs["scheduler"]["condition"] == "service_healthy"
    assert services["worker"]["deploy"]["replicas"] >= 2


def test_compose_nats_runs_jetstream_on_a_volume_with_the_generated_users(
    compose: dict[str, Any],
) -> None:
    nats = compose["services"]["nats"]
    command = nats["command"]
    assert "-js" in command and command[command.index("-sd") + 1] == "/data"
    assert any(v.endswith(":/data") for v in nats["volumes"])
    config = command[command.index("-c") + 1]
    mount = next(v for v in nats["volumes"] if f":{config}" in v)
    text = (REPO / mount.split(":")[0]).read_text()
    assert set(re.findall(r"\$(TESSERA_NATS_PASSWORD_[A-Z]+)", text)) == set(nats["environment"])
    assert "monitor" in " ".join(nats["healthcheck"]["test"]) or "8222" in " ".join(
        nats["healthcheck"]["test"]
    )


# --- k8s/ -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def k8s() -> dict[str, list[dict[str, Any]]]:
    docs: dict[str, list[dict[str, Any]]] = {}
    for path in sorted((REPO / "k8s").glob("*.yaml")):
        if path.name == "nats-values.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                assert {"apiVersion", "kind"} <= set(doc), path
                docs.setdefault(doc["kind"], []).append(doc)
    return docs


def by_name(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs}


def test_kustomization_lists_every_manifest_but_the_example_secrets() -> None:
    kust = yaml.safe_load((REPO / "k8s" / "kustomization.yaml").read_text())
    present = {p.name for p in (REPO / "k8s").glob("*.yaml")}
    skip = {"kustomization.yaml", "nats-values.yaml", "secret.example.yaml"}
    assert set(kust["resources"]) == present - skip


def test_k8s_deployments_are_consistent(k8s: dict[str, list[dict[str, Any]]]) -> None:
    config = by_name(k8s["ConfigMap"])["tessera-config"]["data"]
    assert config["TESSERA_REPLICAS"] == "3"
    secrets = {s["metadata"]["name"]: s["stringData"] for s in k8s["Secret"]}
    deployments = by_name(k8s["Deployment"])
    assert set(deployments) == {f"tessera-{s}" for s in SERVICES}
    for name, dep in deployments.items():
        spec, pod = dep["spec"], dep["spec"]["template"]["spec"]
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert spec["selector"]["matchLabels"].items() <= labels.items(), name
        (container,) = pod["containers"]
        assert container["args"][0] == name.removeprefix("tessera-") in subcommands()
        env: dict[str, str] = {}
        for source in container["envFrom"]:
            env |= by_name(k8s["ConfigMap"])[source["configMapRef"]["name"]]["data"]
        for item in container["env"]:
            ref = item.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                env[item["name"]] = secrets[ref["name"]][ref["key"]]
            elif "fieldRef" in item.get("valueFrom", {}):
                env[item["name"]] = "pod-name"
            else:
                env[item["name"]] = item["value"]
        settings = check_service_env(name, env)
        role = container["args"][0]
        assert all(u.startswith(f"nats://{role}:") for u in settings.nats_urls), name
        assert len(settings.nats_urls) == 3, "every NATS node, so reconnects keep credentials"
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports[container["livenessProbe"]["httpGet"]["port"]] == settings.process.metrics_port
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert (
            ports[container["readinessProbe"]["httpGet"]["port"]] == settings.process.metrics_port
        )
        assert {"cpu", "memory"} <= set(container["resources"]["requests"])
        assert {"cpu", "memory"} <= set(container["resources"]["limits"])
        assert pod["terminationGracePeriodSeconds"] > settings.process.grace_period
        assert pod["securityContext"]["runAsNonRoot"] is True
    worker = deployments["tessera-worker"]["spec"]["template"]["spec"]["containers"][0]
    slots = next(e["value"] for e in worker["env"] if e["name"] == "TESSERA_WORKER_SLOTS")
    assert int(slots) == int(worker["resources"]["limits"]["cpu"]), "one tile per CPU of limit"


def selects(selector: dict[str, str], dep: dict[str, Any]) -> bool:
    return selector.items() <= dep["spec"]["template"]["metadata"]["labels"].items()


def test_k8s_services_pdb_and_keda_point_at_real_things(
    k8s: dict[str, list[dict[str, Any]]],
) -> None:
    deployments = by_name(k8s["Deployment"])
    for svc in k8s["Service"]:
        targets = [d for d in deployments.values() if selects(svc["spec"]["selector"], d)]
        assert len(targets) == 1, svc["metadata"]["name"]
        ports = {p["name"]: p["containerPort"] for p in
                 targets[0]["spec"]["template"]["spec"]["containers"][0]["ports"]}  # fmt: skip
        (port,) = svc["spec"]["ports"]
        assert port["targetPort"] in ports
        if svc["metadata"]["name"] == "tessera-web":  # the console itself, not metrics
            assert ports[port["targetPort"]] == port["port"] == 8470
            continue
        notes = svc["metadata"]["annotations"]
        assert notes["prometheus.io/scrape"] == "true"
        assert int(notes["prometheus.io/port"]) == ports[port["targetPort"]] == port["port"]
    (pdb,) = k8s["PodDisruptionBudget"]
    assert selects(pdb["spec"]["selector"]["matchLabels"], deployments["tessera-worker"])
    (scaled,) = k8s["ScaledObject"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == "tessera-worker"
    (trigger,) = scaled["spec"]["triggers"]
    meta = trigger["metadata"]
    assert trigger["type"] == "nats-jetstream" and meta["account"] == "$G"
    assert meta["stream"] == n.Names().stream(n.STREAM_TILES)
    assert meta["consumer"] == n.CONSUMER_WORKERS
    values = yaml.safe_load((REPO / "k8s" / "nats-values.yaml").read_text())
    host, port = meta["natsServerMonitoringEndpoint"].rsplit(":", 1)
    assert int(port) == values["config"]["monitor"]["port"]
    assert host.startswith("nats-headless.tessera.")


def test_the_nats_helm_values_run_three_jetstream_nodes_with_the_generated_users(
    k8s: dict[str, list[dict[str, Any]]],
) -> None:
    values = yaml.safe_load((REPO / "k8s" / "nats-values.yaml").read_text())
    config = values["config"]
    assert config["cluster"] == {"enabled": True, "replicas": 3}
    assert config["jetstream"]["enabled"] and config["jetstream"]["fileStore"]["enabled"]
    users = config["merge"]["authorization"]["users"]
    perms = natsauth.permissions()
    assert [u["user"] for u in users] == list(natsauth.ROLES)
    secrets = {s["metadata"]["name"]: s["stringData"] for s in k8s["Secret"]}
    env = values["container"]["env"]
    for user in users:
        want = perms[user["user"]]
        assert tuple(user["permissions"]["publish"]["allow"]) == want.publish, user["user"]
        assert tuple(user["permissions"]["subscribe"]["allow"]) == want.subscribe
        assert user["permissions"].get("allow_responses", False) == want.allow_responses
        var = re.fullmatch(r"<< \$(\w+) >>", user["password"])
        assert var, user["password"]
        ref = env[var.group(1)]["valueFrom"]["secretKeyRef"]
        assert ref["key"] in secrets[ref["name"]]


# --- max_payload: one constant for every shipped NATS configuration --------------------------


def test_every_shipped_nats_config_sets_max_payload_from_the_one_constant(
    compose: dict[str, Any],
) -> None:
    confs = sorted((REPO / "deploy" / "nats").glob("*.conf"))
    assert confs
    for conf in confs:
        found = re.findall(r"^\s*max_payload\s*[:=]\s*(\S+)", conf.read_text(), re.M)
        assert found == [str(NATS_MAX_PAYLOAD)], conf
        pending = re.findall(r"^\s*max_pending\s*[:=]\s*(\S+)", conf.read_text(), re.M)
        assert pending == [str(NATS_MAX_PENDING)], conf
    command = compose["services"]["nats"]["command"]
    mounted = command[command.index("-c") + 1]
    mount = next(v for v in compose["services"]["nats"]["volumes"] if f":{mounted}" in v)
    assert REPO / mount.split(":")[0].removeprefix("./") in confs
    values = yaml.safe_load((REPO / "k8s" / "nats-values.yaml").read_text())
    assert values["config"]["merge"]["max_payload"] == NATS_MAX_PAYLOAD
    assert values["config"]["merge"]["max_pending"] == NATS_MAX_PENDING
    assert natsauth.render_limits() in natsauth.render_config(natsauth.generate_passwords())
