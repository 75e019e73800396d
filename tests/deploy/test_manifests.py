"""The files under deploy/ are valid and agree with each other, the renderer and the CLI."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.nats import permissions
from deploy.nats.render import DEPLOY, EXAMPLE_NODES, EXAMPLE_TEAMS, examples, password_envs
from deploy.nats.secrets import write_secrets
from tests.deploy.launcher import nats_server_binary
from tests.deploy.pki import have_openssl, make_pki

YAML_FILES = sorted(p for ext in ("*.yml", "*.yaml") for p in DEPLOY.rglob(ext) if "secrets" not in p.parts)
CONF_FILES = sorted((DEPLOY / "nats").rglob("*.conf"))
ENV = {var: "example-password" for var in password_envs(EXAMPLE_NODES, EXAMPLE_TEAMS)}

def _rel(p: Path) -> str:
    return str(p.relative_to(DEPLOY))


def _docs(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


@pytest.mark.parametrize("path", YAML_FILES, ids=_rel)
def test_yaml_parses(path: Path) -> None:
    """Every YAML file under deploy/ parses (yaml.safe_load_all) and is not empty."""
    assert _docs(path)


def test_committed_examples_equal_a_fresh_render() -> None:
    """The configs in deploy/ are exactly what `python -m deploy.nats.render` writes: no hand edits
    that the tests (which render the same functions) would not see."""
    for rel, text in examples().items():
        assert (DEPLOY / rel).read_text() == text, f"deploy/{rel} is stale: run python -m deploy.nats.render"


@pytest.mark.parametrize("path", CONF_FILES, ids=_rel)
def test_nats_server_accepts_config(path: Path, tmp_path: Path) -> None:
    """nats-server itself parses every committed config (`-t`), includes and variables resolved."""
    conf = path
    if "tls {" in path.read_text():  # nats-server loads the certificates: give it real ones
        if not have_openssl():
            pytest.skip("needs openssl for certificates")
        pki = make_pki(tmp_path / "pki")
        conf = tmp_path / path.name
        conf.write_text(path.read_text().replace("/etc/corral/tls/", f"{pki.ca.parent}/"))
        shutil.copy(DEPLOY / "nats" / "accounts.conf", tmp_path / "accounts.conf")
    out = subprocess.run(
        [str(nats_server_binary()), "-t", "-c", str(conf)],
        env={**os.environ, **ENV}, capture_output=True, text=True, timeout=20, cwd=conf.parent,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr + out.stdout


def test_missing_password_variable_stops_the_server() -> None:
    """A password not set in the environment is an error at startup, never an empty password."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    out = subprocess.run(
        [str(nats_server_binary()), "-t", "-c", str(DEPLOY / "nats" / "single.conf")],
        env=env, capture_output=True, text=True, timeout=20,
    )  # fmt: skip
    assert out.returncode != 0 and "CORRAL_" in out.stderr + out.stdout


def test_secrets_cover_every_user_and_stay_private(tmp_path: Path) -> None:
    """deploy.nats.secrets writes a password for each variable the configs reference (0600 files),
    and keeps existing ones on a rerun."""
    out = tmp_path / "secrets"
    env = write_secrets(out, EXAMPLE_NODES, EXAMPLE_TEAMS)
    assert set(env) == set(ENV)
    assert all(len(v) >= 24 for v in env.values()) and len(set(env.values())) == len(env)
    assert (out / "nats-users.env").stat().st_mode & 0o077 == 0
    assert (out / "agent-node1.password").read_text().strip() == env["CORRAL_AGENT_NODE1_PASSWORD"]
    assert write_secrets(out, EXAMPLE_NODES, EXAMPLE_TEAMS) == env


# -- docker compose ------------------------------------------------------------

COMPOSE = DEPLOY / "docker-compose.yml"


def _compose() -> dict[str, Any]:
    (doc,) = _docs(COMPOSE)
    return doc


def _compose_cli() -> list[str] | None:
    """`docker compose` (the plugin), else `docker-compose` (v1: Debian's package where the plugin is not)."""
    if shutil.which("docker") is not None and subprocess.run(
            ["docker", "compose", "version"], capture_output=True, timeout=20).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") is not None else None


@pytest.mark.skipif(_compose_cli() is None, reason="no docker compose plugin, no docker-compose")
def test_docker_compose_config(tmp_path: Path) -> None:
    """`docker compose config` accepts the file (with the secrets it expects in place)."""
    cli = _compose_cli()
    assert cli is not None
    secrets_dir = DEPLOY / "secrets"
    made = not secrets_dir.exists()
    if made:
        write_secrets(secrets_dir, EXAMPLE_NODES, EXAMPLE_TEAMS)
    try:
        out = subprocess.run(
            [*cli, "-f", str(COMPOSE), "config", "--quiet"], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
    finally:
        if made:
            shutil.rmtree(secrets_dir)


def test_compose_runs_a_three_server_cluster() -> None:
    """Three NATS servers, distinct names and volumes, one shared config that routes to all three."""
    services = _compose()["services"]
    nats = {name: s for name, s in services.items() if name.startswith("nats-")}
    assert sorted(nats) == ["nats-1", "nats-2", "nats-3"]
    for name, svc in nats.items():
        assert svc["image"].startswith("nats:"), "NATS's official image"
        assert svc["command"][-2:] == ["--name", name]
        assert "/etc/nats/compose.conf" in svc["command"]
        assert f"{name}:/data" in svc["volumes"]
    conf = (DEPLOY / "nats" / "compose.conf").read_text()
    for name in nats:
        assert f"nats-route://{name}:6222" in conf


def test_admission_owns_exactly_the_rendered_teams() -> None:
    """Compose's admission service names the teams the rendered accounts have, as the admission user."""
    cmd = _compose()["services"]["admission"]["command"]
    teams = {cmd[i + 1].split("=")[0] for i, a in enumerate(cmd) if a == "--team"}
    assert teams == set(EXAMPLE_TEAMS)
    assert cmd[cmd.index("--user") + 1] == "admission"
    accounts = (DEPLOY / "nats" / "accounts.conf").read_text()
    assert all(f"TEAM_{t.upper()} {{" in accounts for t in teams)


def test_compose_agents_have_their_own_users() -> None:
    """Each agent logs in as agent-<its node id>, a user accounts.conf defines for that node."""
    accounts = (DEPLOY / "nats" / "accounts.conf").read_text()
    agents = {n: s for n, s in _compose()["services"].items() if n.startswith("agent-")}
    assert agents
    for svc in agents.values():
        cmd = svc["command"]
        node = cmd[cmd.index("--node-id") + 1]
        assert cmd[cmd.index("--user") + 1] == f"agent-{node}"
        assert f'"$KV.{permissions.HEARTBEATS}.{node}"' in accounts


def _agents() -> dict[str, dict[str, Any]]:
    return {n: s for n, s in _compose()["services"].items() if n.startswith("agent-")}


def _flag(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


def test_compose_agents_own_disjoint_gpu_sets() -> None:
    """Agents on one host never offer the same GPU: each reserves its own device ids, none `count: all`."""
    seen: dict[str, str] = {}
    for name, svc in _agents().items():
        (dev,) = svc["deploy"]["resources"]["reservations"]["devices"]
        assert "count" not in dev and dev["driver"] == "nvidia", name
        ids = dev["device_ids"]
        assert ids and all(isinstance(i, str) and i.isdigit() for i in ids), name
        for i in ids:
            assert i not in seen, f"GPU {i} is offered by {seen[i]} and {name}"
            seen[i] = name
    assert len(_agents()) >= 2


def test_compose_checkpoints_live_on_a_host_path_mounted_at_the_same_path() -> None:
    """The engine bind-mounts the agent's checkpoint paths into workers: they must be host paths, same inside.

    A named volume, or a host dir mounted elsewhere, hands the host's engine a path that is not
    the one the agent reads: the next attempt would find no checkpoint.
    """
    for name, svc in _agents().items():
        cmd = svc["command"]
        assert _flag(cmd, "--runtime") == "docker"
        root = Path(_flag(cmd, "--checkpoint-root"))
        binds = [v.split(":") for v in svc["volumes"]]
        covering = [(src, dst) for src, dst, *_ in binds if root.is_relative_to(dst)]
        assert covering, f"{name}: {root} is not on a mounted path"
        src, dst = covering[-1]
        assert src.startswith("/") and src == dst, f"{name}: {src}:{dst} is not a host path at the same path"
        assert ["/var/run/docker.sock", "/var/run/docker.sock"] in [b[:2] for b in binds], name


def test_compose_demo_runs_in_worker_containers() -> None:
    """The demo service submits as admin (it defines queues) with the image a service builds from --target worker."""
    services = _compose()["services"]
    demo = services["demo"]["command"]
    image = _flag(demo, "--image")
    (builder,) = [s for s in services.values() if s.get("image") == image]
    assert builder["build"]["target"] == "worker" and builder["build"]["dockerfile"] == "deploy/Dockerfile"
    assert "FROM python:3.11-slim AS worker" in (DEPLOY / "Dockerfile").read_text()
    assert "COPY orchestrator/demo_worker.py /opt/corral/worker.py" in (DEPLOY / "Dockerfile").read_text()
    assert "!orchestrator/" in (DEPLOY / "Dockerfile.dockerignore").read_text()
    assert _flag(demo, "--user") == "admin" and "admin" in services["demo"]["secrets"]
    assert services["demo"]["depends_on"]["worker-image"] == {"condition": "service_completed_successfully"}
    assert {f"agent-{n}" for n in EXAMPLE_NODES} <= set(services["demo"]["depends_on"])


def _volume_at(mounts: list[str], path: str) -> tuple[str, bool]:
    """(named volume, read-only) compose mounts at exactly `path`; fails if none or a host path."""
    found = [m.split(":") for m in mounts if m.split(":")[1] == path]
    assert len(found) == 1, f"{path} is not mounted once: {mounts}"
    src, _, *mode = found[0]
    assert not src.startswith(("/", ".")), f"{path} is on {src}, not a named volume"
    return src, mode == ["ro"]


def test_compose_runs_one_archiver_and_an_index_on_volumes() -> None:
    """The archiver (one: the archive's only writer) and the index log in as their own users; the archive's
    path and the index's data dir are named volumes; the index mounts that same archive read-only where its
    --archive points, so it rebuilds after retention."""
    compose = _compose()
    services = compose["services"]
    archivers = [s for s in services.values() if s.get("command", [None, None])[:2] == ["corral", "archive"]]
    assert len(archivers) == 1
    (arch,) = archivers
    cmd = arch["command"]
    assert _flag(cmd, "--user") == "archiver" and "archiver" in arch["secrets"]
    assert _flag(cmd, "--password-file") == "/run/secrets/archiver"
    assert "--retention" in cmd or "--max-bytes" in cmd, "retention is what the archiver is for"
    archive_vol, ro = _volume_at(arch["volumes"], _flag(cmd, "--path"))
    assert not ro

    idx = services["index"]
    cmd = idx["command"]
    assert cmd[:2] == ["corral", "index"]
    assert _flag(cmd, "--user") == "index" and "index" in idx["secrets"]
    assert _flag(cmd, "--password-file") == "/run/secrets/index"
    data_vol, ro = _volume_at(idx["volumes"], _flag(cmd, "--data-dir"))
    assert not ro and data_vol != archive_vol
    assert _volume_at(idx["volumes"], _flag(cmd, "--archive")) == (archive_vol, True)
    assert {archive_vol, data_vol} <= set(compose["volumes"])
    for user in ("archiver", "index"):
        assert compose["secrets"][user] == {"file": f"secrets/{user}.password"}
        assert f'user: "{user}"' in (DEPLOY / "nats" / "accounts.conf").read_text()
    text = (DEPLOY / "Dockerfile").read_text()
    assert "/var/lib/corral-archive /var/lib/corral-index" in text, "the mount points exist, owned by corral"


# -- Kubernetes ----------------------------------------------------------------

K8S = DEPLOY / "k8s"


def _objects() -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in _docs(path):
            if "kind" in doc and "apiVersion" in doc and doc["kind"] != "Kustomization":
                out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def test_kustomization_lists_existing_files() -> None:
    """kubectl apply -k deploy/k8s finds every file it names."""
    (kust,) = _docs(K8S / "kustomization.yaml")
    for res in kust["resources"]:
        assert (K8S / res).is_file(), res


def test_scheduler_runs_twice_and_agents_on_every_gpu_node() -> None:
    """2 scheduler replicas (the lease picks one); one agent per GPU node with the NVIDIA runtime."""
    objs = _objects()
    sched = objs[("Deployment", "corral-scheduler")]
    assert sched["spec"]["replicas"] == 2
    agent = objs[("DaemonSet", "corral-agent")]["spec"]["template"]["spec"]
    assert agent["runtimeClassName"] == "nvidia"
    assert agent["nodeSelector"] == {"nvidia.com/gpu.present": "true", "corral.dev/gpu-node": "true"}
    cmd = agent["containers"][0]["command"]
    assert cmd[cmd.index("--node-id") + 1] == "$(NODE_NAME)"
    assert cmd[cmd.index("--runtime") + 1] == "docker"
    assert ("ServiceAccount", "corral") in objs and ("ConfigMap", "corral-config") in objs


def test_agent_runs_only_on_nodes_handed_to_corral_with_host_paths_at_the_same_path() -> None:
    """The agent's nodes are labelled and tainted for corral (GPUs not shared with the device plugin);
    every path it hands the node's engine is a hostPath mounted at the same path."""
    agent = _objects()[("DaemonSet", "corral-agent")]["spec"]["template"]["spec"]
    assert {"key": "corral.dev/gpu-node", "operator": "Exists", "effect": "NoSchedule"} in agent["tolerations"]
    text = (K8S / "agent.yaml").read_text()
    assert "nvidia.com/gpu.deploy.device-plugin=false" in text and "kubectl taint node" in text
    (c,) = agent["containers"]
    volumes = {v["name"]: v for v in agent["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    cmd = c["command"]
    for flag in ("--checkpoint-root", "--data-dir"):
        path = cmd[cmd.index(flag) + 1]
        assert volumes[mounts[path]]["hostPath"]["path"] == path, flag
    assert "resources" not in c or "nvidia.com/gpu" not in str(c["resources"]), "corral, not the kubelet, assigns GPUs"


def _pod(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the pod spec, its one container) of the Deployment `name`."""
    spec = _objects()[("Deployment", name)]["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    return spec, c


def _claim_at(pod: dict[str, Any], c: dict[str, Any], path: str) -> tuple[str, bool]:
    """(the PVC mounted at `path`, read-only)."""
    (m,) = [m for m in c["volumeMounts"] if m["mountPath"] == path]
    (v,) = [v for v in pod["volumes"] if v["name"] == m["name"]]
    claim = v["persistentVolumeClaim"]
    assert ("PersistentVolumeClaim", claim["claimName"]) in _objects(), claim
    return claim["claimName"], bool(m.get("readOnly") or claim.get("readOnly"))


def test_k8s_runs_one_archiver_and_an_index_on_volumes() -> None:
    """One archiver (Recreate: no two writers during a rollout) with its archive on a PVC, the index with its
    data dir on another and the archive's claim mounted read-only where --archive points; each logs in as its
    user with its own Secret, writable by the non-root user (fsGroup)."""
    objs = _objects()
    deploy = objs[("Deployment", "corral-archiver")]["spec"]
    assert deploy["replicas"] == 1 and deploy["strategy"] == {"type": "Recreate"}
    pod, c = _pod("corral-archiver")
    cmd = c["command"]
    assert cmd[:2] == ["corral", "archive"] and _flag(cmd, "--user") == "archiver"
    archive, ro = _claim_at(pod, c, _flag(cmd, "--path"))
    assert not ro and pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"]
    secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert "corral-archiver-nats" in secrets

    pod, c = _pod("corral-index")
    cmd = c["command"]
    assert cmd[:2] == ["corral", "index"] and _flag(cmd, "--user") == "index"
    data, ro = _claim_at(pod, c, _flag(cmd, "--data-dir"))
    assert not ro and data != archive and pod["securityContext"]["fsGroup"] == 10001
    assert _claim_at(pod, c, _flag(cmd, "--archive")) == (archive, True)
    assert "ReadWriteMany" in objs[("PersistentVolumeClaim", archive)]["spec"]["accessModes"], \
        "the archiver writes and the index reads it from two pods"
    assert "corral-index-nats" in {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    readme = (DEPLOY / "README.md").read_text()
    for secret in ("corral-archiver-nats", "corral-index-nats"):
        assert f"create secret generic {secret} " in readme


def test_nats_chart_values_cluster_of_three_with_jetstream() -> None:
    """The chart runs 3 JetStream servers on persistent volumes, with corral's accounts merged in."""
    (values,) = _docs(K8S / "nats-values.yaml")
    cfg = values["config"]
    assert cfg["cluster"]["enabled"] and cfg["cluster"]["replicas"] == 3
    assert cfg["jetstream"]["enabled"] and cfg["jetstream"]["fileStore"]["pvc"]["enabled"]
    users = {u["user"] for u in cfg["merge"]["accounts"]["CORRAL"]["users"]}
    assert {"scheduler", "ops", "agent-node1"} <= users
    assert set(values["container"]["env"]) == set(ENV)


# -- every command is one the CLI understands --------------------------------


def _commands() -> list[tuple[str, list[str]]]:
    out = [(f"compose:{name}", svc["command"]) for name, svc in _compose()["services"].items()
           if svc.get("image") == "corral:dev"]
    for (kind, name), obj in _objects().items():
        if kind in ("Deployment", "DaemonSet"):
            for c in obj["spec"]["template"]["spec"]["containers"]:
                out.append((f"k8s:{name}/{c['name']}", c["command"]))
    return out


def _substituted(argv: list[str]) -> list[str]:
    """Kubernetes $(VAR) and compose ${VAR} filled with sample values."""
    return [re.sub(r"\$[({]([A-Z_]+)[)}]", lambda m: f"sample-{m.group(1).lower()}", a) for a in argv]


@pytest.mark.parametrize(("where", "argv"), _commands(), ids=[w for w, _ in _commands()])
def test_command_parses_with_the_cli(where: str, argv: list[str]) -> None:
    """`corral scheduler|agent|admission|archive|index ...` in compose and k8s is accepted by the real argument parser."""
    cli = pytest.importorskip("orchestrator.cli")
    assert argv[0] == "corral" and argv[1] in ("scheduler", "agent", "admission", "demo", "archive", "index")
    args = _substituted(argv[1:])
    try:
        ns = cli.build_parser().parse_args(args)
    except SystemExit:
        pytest.fail(f"{where}: `corral {shlex.join(args)}` is not a valid command")
    # The connection flags land where `connected` reads them.
    for flag in ("--user", "--password-file", "--tls-ca", "--replicas"):
        if flag in args:
            value = args[args.index(flag) + 1]
            assert str(getattr(ns, flag[2:].replace("-", "_"))) == value, flag
