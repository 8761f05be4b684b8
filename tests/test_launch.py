"""`seedq launch`: Kubernetes renders validate offline and their command lines
parse with seedq's own CLI; the committed examples are fresh; the gcloud
plans use the documented forms and carry the token and address through."""

import contextlib
import copy
import dataclasses
import io
import json
import os
import pathlib
import re
import shlex
import stat
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from seedq import cli
from seedq.launch import k8s
from seedq.launch.options import K8sOptions
from seedq.launch.tpu import tpu_slice

REPO = pathlib.Path(__file__).resolve().parents[1]
K8S_VERSION = "1.30.0"


def run_cli(argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def render_cli(*flags) -> list[dict]:
    code, out, err = run_cli(["launch", "k8s", *flags])
    assert code == 0, err
    return [doc for doc in yaml.safe_load_all(out) if doc]


# Renders beyond the committed examples: other slice shapes, IMPALA and R2D2 actors, server TLS.
EXTRA_RENDERS = {
    "v4-16 impala": ["--accelerator", "tpu", "--tpu-type", "v4-16", "--image", "img:1",
                     "--architecture", "impala", "--num-actors", "5", "--tls-mode", "server"],
    "v6e-8 single host": ["--accelerator", "tpu", "--tpu-type", "v6e-8", "--image", "img:1"],
    "gpu x8 r2d2": ["--accelerator", "gpu", "--gpus", "8", "--image", "img:1", "--agent", "r2d2",
                    "--env", "ALE/Breakout-v5", "--atari.screen-size", "64", "--token-secret", ""],
    "cpu insecure": ["--accelerator", "cpu", "--image", "img:1", "--tls-mode", "none",
                     "--token-secret", "", "--insecure"],
}


def all_renders() -> dict[str, list[dict]]:
    renders = {name: [d for d in yaml.safe_load_all(text) if d] for name, text in k8s.example_files().items()}
    renders.update({name: render_cli(*flags) for name, flags in EXTRA_RENDERS.items()})
    return renders


@pytest.fixture(scope="module")
def renders():
    return all_renders()


@pytest.mark.unit
def test_every_render_validates_strictly_for_kubernetes_1_30(renders):
    for name, docs in renders.items():
        for doc in docs:
            # Raises on a schema error; a missing schema (what the CLI prints as a
            # warning) raises SchemaNotFoundError, so "no warnings" is asserted too.
            assert kubernetes_validate.validate(doc, K8S_VERSION, strict=True) == "1.30", name
    # The check has teeth: an unknown field and a wrong type are refused.
    job = copy.deepcopy(learner_job(renders["tpu-v5litepod-16.yaml"]))
    job["spec"]["template"]["spec"]["containers"][0]["gpuCount"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    job = copy.deepcopy(learner_job(renders["tpu-v5litepod-16.yaml"]))
    job["spec"]["completions"] = "four"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)


@pytest.mark.unit
def test_the_learner_job_restarts_after_a_disruption_or_sigterm_without_spending_its_backoff(renders):
    """A drained node or a preemption (DisruptionTarget) and a learner stopped
    by SIGTERM after its checkpoint (exit 143) are replaced without counting;
    a usage error (exit 2) fails the Job; exit 0 (stop condition met) completes."""
    from seedq.process import exit_codes

    for name, docs in renders.items():
        job = learner_job(docs)
        rules = job["spec"]["podFailurePolicy"]["rules"]
        by_code = {code: rule["action"] for rule in rules if "onExitCodes" in rule
                   for code in rule["onExitCodes"]["values"]}
        assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]} in rules
        assert by_code == {exit_codes.TERMINATED: "Ignore", exit_codes.INTERRUPTED: "Ignore",
                           exit_codes.USAGE: "FailJob"}, name
        assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


@pytest.mark.e2e
def test_committed_examples_validate_with_the_cli_and_are_fresh():
    for name, text in k8s.example_files().items():
        path = REPO / "launch" / "k8s" / name
        assert path.read_text() == text, (
            f"{path} is stale: regenerate with `python -m seedq.launch.k8s --write launch/k8s`")
    result = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "-k", K8S_VERSION,
         *sorted(str(p) for p in (REPO / "launch" / "k8s").glob("*.yaml"))],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARN" not in result.stdout and "ERROR" not in result.stdout, result.stdout
    # The header's command reproduces the example byte for byte (after the two comment lines).
    header = (REPO / "launch" / "k8s" / "gpu.yaml").read_text().splitlines()[0]
    argv = shlex.split(header.removeprefix("# Rendered by: "))[1:]
    code, out, err = run_cli(argv)
    assert code == 0, err
    assert out == "".join(k8s.example_files()["gpu.yaml"].splitlines(keepends=True)[2:])


@pytest.mark.unit
def test_the_regeneration_command_writes_the_committed_files(tmp_path):
    assert k8s.main(["--write", str(tmp_path)]) == 0
    written = {p.name: p.read_text() for p in tmp_path.iterdir()}
    committed = {p.name: p.read_text() for p in (REPO / "launch" / "k8s").iterdir()}
    assert written == committed


@pytest.mark.unit
def test_tpu_v5litepod_16_is_four_hosts_with_one_actor_job_each(renders):
    docs = renders["tpu-v5litepod-16.yaml"]
    kinds = [d["kind"] for d in docs]
    assert kinds == ["ConfigMap", "PersistentVolumeClaim", "Service", "Job"] + ["Job"] * 4
    assert "Secret" not in kinds and not any("Role" in k for k in kinds)
    service = docs[2]
    assert service["spec"]["clusterIP"] == "None"
    job = docs[3]
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 4
    pod = job["spec"]["template"]["spec"]
    assert pod["subdomain"] == service["metadata"]["name"] == "pong-tpu-learner"
    assert pod["nodeSelector"] == {"cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
                                   "cloud.google.com/gke-tpu-topology": "4x4"}
    assert pod["containers"][0]["resources"]["limits"] == {"google.com/tpu": 4}
    assert docs[1]["spec"]["accessModes"] == ["ReadWriteMany"]
    deployments = docs[4:]
    assert deployments == actor_jobs(docs) and learner_job(docs) is job
    assert sum(d["spec"]["completions"] for d in deployments) == 16  # the config's num_actors
    servers = [d["spec"]["template"]["spec"]["containers"][0]["command"] for d in deployments]
    assert [c[c.index("--server") + 1] for c in servers] == [
        f"pong-tpu-learner-{i}.pong-tpu-learner:50051" for i in range(4)]
    for d in deployments:
        anti = d["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
        assert anti["requiredDuringSchedulingIgnoredDuringExecution"][0]["labelSelector"]["matchLabels"] == \
            service["spec"]["selector"]


@pytest.mark.unit
def test_gpu_and_cpu_renders(renders):
    job = learner_job(renders["gpu x8 r2d2"])
    pod = job["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 8}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert job["spec"]["completions"] == 1
    gpu = learner_job(renders["gpu.yaml"])["spec"]["template"]["spec"]
    assert gpu["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    # The native gRPC probe asks the plaintext health-only port, with or without TLS on the actor port.
    tpu = learner_job(renders["tpu-v5litepod-16.yaml"])["spec"]["template"]["spec"]
    for pod in (gpu, tpu):
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert pod["containers"][0][probe]["grpc"] == {"port": 50052}, probe
    config_map = next(d for d in renders["tpu-v5litepod-16.yaml"] if d["kind"] == "ConfigMap")
    assert json.loads(config_map["data"]["config.json"])["server"]["health_port"] == 50052
    cpu = learner_job(renders["cpu.yaml"])["spec"]["template"]["spec"]
    assert "limits" not in cpu["containers"][0]["resources"] and "nodeSelector" not in cpu


@pytest.mark.unit
def test_renders_are_deterministic_and_hold_no_key_material(renders):
    flags = EXTRA_RENDERS["v4-16 impala"]
    first = run_cli(["launch", "k8s", *flags])[1]
    assert first == run_cli(["launch", "k8s", *flags])[1]
    for name, docs in renders.items():
        text = yaml.safe_dump_all(docs)
        assert "BEGIN" not in text and "PRIVATE KEY" not in text, name
        for doc in docs:
            for volume in _pod(doc).get("volumes", []) if _pod(doc) else []:
                if "secret" in volume:
                    assert set(volume["secret"]) == {"secretName", "defaultMode"}, name


def _pod(doc: dict) -> dict | None:
    return doc["spec"]["template"]["spec"] if doc["kind"] == "Job" else None


def learner_job(docs: list[dict]) -> dict:
    return next(d for d in docs if d["kind"] == "Job" and d["metadata"]["labels"]["app.kubernetes.io/component"] == "learner")


def actor_jobs(docs: list[dict]) -> list[dict]:
    return [d for d in docs if d["kind"] == "Job" and d["metadata"]["labels"]["app.kubernetes.io/component"] == "actor"]


# Files each Secret provides (launch/README.md's `kubectl create secret` commands).
SECRET_KEYS = {"tls": (k8s.TLS_CERT, k8s.TLS_KEY, k8s.TLS_CA), "token": (k8s.TOKEN_KEY,)}


def _stub_pod_files(doc: dict, root: pathlib.Path, docs: list[dict]) -> dict[str, str]:
    """Creates under `root` the files a pod of `doc` would see at its mounts;
    returns {path in the pod: path here}."""
    pod = _pod(doc)
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mapping = {}
    for mount in container["volumeMounts"]:
        here = root / mount["mountPath"].lstrip("/")
        here.mkdir(parents=True, exist_ok=True)
        mapping[mount["mountPath"]] = str(here)
        volume = volumes[mount["name"]]
        if "secret" in volume:
            for key in SECRET_KEYS[mount["name"]]:
                (here / key).write_text("stub\n")
        if "configMap" in volume:
            (config_map,) = [d for d in docs if d["kind"] == "ConfigMap"
                             and d["metadata"]["name"] == volume["configMap"]["name"]]
            for key, text in config_map["data"].items():
                (here / key).write_text(text)
    return mapping


def _localise(words: list[str], mapping: dict[str, str], index: str = "7") -> list[str]:
    out = []
    for word in words:
        for pod_path, here in sorted(mapping.items(), key=lambda kv: -len(kv[0])):
            word = re.sub(re.escape(pod_path) + r"(?=/|$)", here, word)
        out.append(word.replace("$(JOB_COMPLETION_INDEX)", index))
    return out


@pytest.mark.unit
def test_rendered_command_lines_parse_with_seedq_print_config(renders, tmp_path):
    for name, docs in renders.items():
        for doc in (d for d in docs if d["kind"] == "Job"):
            root = tmp_path / f"{name}-{doc['metadata']['name']}".replace(" ", "_")
            mapping = _stub_pod_files(doc, root, docs)
            (container,) = _pod(doc)["containers"]
            command = container["command"]
            assert command[0] == "seedq"
            is_learner = doc is learner_job(docs)
            if is_learner:
                # The run config is read from the ConfigMap, with pod paths: localise them too.
                config_path = pathlib.Path(mapping[k8s.CONFIG_DIR]) / "config.json"
                config_path.write_text("\n".join(_localise(config_path.read_text().split("\n"),
                                                           {**mapping, k8s.RUNS_DIR: str(root / "runs")})))
            code, out, err = run_cli(_localise(command[1:], mapping) + ["--print-config"])
            assert code == 0, f"{name} {doc['metadata']['name']}: {err}"
            printed = json.loads(out)
            if is_learner:
                assert command[1:] == ["learner", "--config", f"{k8s.CONFIG_DIR}/config.json", "--resume", "auto"]
                assert printed["address"] == "0.0.0.0:50051"
                assert printed["logdir"].startswith(str(root / "runs"))
                for path in (printed["tls"]["cert"], printed["tls"]["key"], printed["tls"]["client_ca"],
                             printed["auth"]["token_file"]):
                    assert not path or os.path.isfile(path), f"{name}: {path} is not in a mounted Secret"
                tls = next((m for m in container["volumeMounts"] if m["name"] == "tls"), None)
                assert bool(printed["tls"]["cert"]) == bool(tls)
            else:
                assert printed["command"] in ("actor", "impala-actor")
                assert re.fullmatch(r"[a-z0-9-]+-actor-\d+-7", printed["actor_id"]), printed["actor_id"]
                env = container["env"][0]
                assert env["name"] == "JOB_COMPLETION_INDEX" and "job-completion-index" in env["valueFrom"]["fieldRef"]["fieldPath"]
                host, port = printed["server"].rsplit(":", 1)
                assert re.fullmatch(r"[a-z0-9-]+-learner-\d+\.[a-z0-9-]+-learner", host) and port == "50051", host
                config = json.loads(next(d for d in docs if d["kind"] == "ConfigMap")["data"]["config.json"])
                assert printed["env"] == config["env"]
                assert printed["num_envs"] == config["envs_per_actor"]
                assert printed["env_options"] == {"atari": config["atari"], "dmc": config["dmc"]}
                assert bool(printed["channel"]["auth"]["token_file"]) == bool(config["auth"]["token_file"])
                assert bool(printed["channel"]["tls"]["ca"]) == bool(config["tls"]["cert"])
                assert bool(printed["channel"]["tls"]["cert"]) == bool(config["tls"]["client_ca"])
                assert (printed["command"] == "impala-actor") == (config["architecture"] == "impala")
                # Two indexes of the Job: one command line, different env seeds.
                code, out, err = run_cli(_localise(command[1:], mapping, "8") + ["--print-config"])
                assert code == 0, err
                assert json.loads(out)["env_seed"] != printed["env_seed"]


@pytest.mark.unit
@pytest.mark.parametrize("flags, message", [
    (["--accelerator", "tpu", "--tpu-type", "v5litepod-12", "--image", "i"], "not a slice size"),
    (["--accelerator", "tpu", "--tpu-type", "v9-8", "--image", "i"], "expected v5litepod-N"),
    (["--accelerator", "gpu"], "--image is required"),
    (["--accelerator", "quantum", "--image", "i"], "--accelerator quantum"),
    (["--accelerator", "cpu", "--image", "i", "--address", "0.0.0.0:1"], "--address is set by the render"),
    (["--accelerator", "cpu", "--image", "i", "--tls-mode", "none", "--token-secret", ""], "--insecure"),
    (["--accelerator", "cpu", "--image", "i", "--tls-mode", "server", "--token-secret", ""],
     "--tls-mode mutual"),
    (["--accelerator", "cpu", "--image", "i", "--logdir", "runs/x"], "under /runs/"),
    (["--accelerator", "cpu", "--image", "i", "--name", "Pong_TPU"], "a DNS label"),
])
def test_bad_launch_input_is_one_line(flags, message):
    code, out, err = run_cli(["launch", "k8s", *flags])
    assert code == 2 and out == ""
    assert message in err and err.count("\n") == 1, err


@pytest.mark.unit
def test_tpu_slice_table():
    assert (tpu_slice("v5litepod-16").hosts, tpu_slice("v5litepod-16").topology) == (4, "4x4")
    assert (tpu_slice("v5litepod-8").hosts, tpu_slice("v5litepod-8").chips_per_host) == (1, 8)
    assert (tpu_slice("v4-8").chips, tpu_slice("v4-8").hosts, tpu_slice("v4-8").topology) == (4, 1, "2x2x1")
    assert (tpu_slice("v4-16").hosts, tpu_slice("v4-16").topology) == (2, "2x2x2")
    assert (tpu_slice("v5p-128").hosts, tpu_slice("v5p-128").gke_accelerator) == (16, "tpu-v5p-slice")
    assert (tpu_slice("v6e-256").hosts, tpu_slice("v6e-256").topology) == (64, "16x16")
    with pytest.raises(ValueError, match="v4-8, v4-16"):
        tpu_slice("v4-12")


@pytest.mark.unit
def test_actor_replicas_spread_over_hosts():
    assert k8s.actor_replicas(10, 4) == [3, 3, 2, 2]
    assert k8s.actor_replicas(3, 1) == [3]


# --- gcloud plans ---

@pytest.fixture
def token(tmp_path):
    path = tmp_path / "token"
    path.write_text("s3cret-token\n")
    return str(path)


@pytest.fixture(autouse=True)
def given_wheel(tmp_path_factory, monkeypatch):
    """A local file named like seedq's wheel: what `--install` passes to the
    plans below (only test_the_default_install_is_a_wheel_of_this_checkout builds a real one)."""
    path = tmp_path_factory.mktemp("wheels") / "seedq-0.1.0-py3-none-any.whl"
    path.write_bytes(b"stands in for a wheel")
    monkeypatch.setattr(sys.modules[__name__], "GIVEN_WHEEL", str(path))
    return str(path)


GIVEN_WHEEL = ""


def dry_run(kind, *flags) -> str:
    install = [] if "--install" in flags else ["--install", GIVEN_WHEEL]
    code, out, err = run_cli(["launch", kind, "--dry-run", *install, *flags])
    assert code == 0, err
    return out


def learner_line(command: list[str]) -> str:
    """The shell line the learner VM runs in the background (the learner, then the group's resize)."""
    remote = next(w for w in command if w.startswith("--command=")).removeprefix("--command=")
    return shlex.split(remote.split("nohup ", 1)[1].split(" > ", 1)[0])[2]


def _commands(script: str) -> list[list[str]]:
    """The plan's command lines (shell words), without heredoc bodies and comments."""
    commands, in_heredoc = [], False
    for line in script.splitlines():
        if in_heredoc:
            in_heredoc = line != "EOF"
            continue
        if line.startswith("cat > "):
            in_heredoc = True
            continue
        if line.startswith("#") or line.startswith("set "):
            continue
        line = re.sub(r"^(\w+)=\$\((.*)\)$", r"\2", line)
        line = re.sub(r'^until \[ "\$\((.*)\)" = \w+ \]; do sleep \d+; done$', r"\1", line)
        commands.append(shlex.split(line))
    return commands


def _heredoc(script: str) -> str:
    return script.split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]


@pytest.mark.e2e
def test_tpu_vm_dry_run_uses_documented_forms_and_carries_the_token(token, tmp_path):
    script = dry_run("tpu-vm", "--zone", "us-central2-b", "--project", "proj", "--tpu-type", "v4-16",
                     "--spot", "--auth.token-file", token, "--env", "CartPole-v1", "--num-actors", "40",
                     "--actor-processes-per-vm", "16")
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    commands = _commands(script)
    create = commands[0]
    assert create[:5] == ["gcloud", "compute", "tpus", "queued-resources", "create"]
    for flag in ("--node-id=seedq", "--accelerator-type=v4-16", "--runtime-version=tpu-ubuntu2204-base",
                 "--spot"):
        assert flag in create
    assert create[-4:] == ["--zone", "us-central2-b", "--project", "proj"]
    scp = next(c for c in commands if c[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"])
    assert scp[5:8] == [token, "seedq:seedq/token", "--worker=all"]
    start = [c for c in commands if c[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh"]][-1]
    assert "--worker=all" in start
    learner = shlex.split(learner_line(start).split("; code=$?", 1)[0])
    assert learner[:2] == ["seedq/venv/bin/seedq", "learner"]
    assert learner[learner.index("--auth.token-file") + 1] == "seedq/token"
    assert learner[-2:] == ["--resume", "auto"]
    # The learner command parses with seedq's CLI, the token at its copied path.
    (tmp_path / "seedq").mkdir()
    (tmp_path / "seedq" / "token").write_text("x\n")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        code, out, err = run_cli(learner[1:] + ["--print-config"])
    finally:
        os.chdir(cwd)
    assert code == 0, err
    printed = json.loads(out)
    assert printed["address"] == "0.0.0.0:50051" and printed["auth"]["token_file"] == "seedq/token"
    assert printed["num_actors"] == 40
    # The token goes to Secret Manager for the actor VMs, the learner's address to their metadata.
    assert ["gcloud", "secrets", "create", "seedq-token", f"--data-file={token}", "--project", "proj"] in commands
    template = next(c for c in commands if c[:4] == ["gcloud", "compute", "instance-templates", "create"])
    assert "--metadata=seedq-learner=${LEARNER_IP}:50051,seedq-wheel=gs://proj-seedq-seedq/seedq-0.1.0-py3-none-any.whl" \
        in template
    assert "--metadata-from-file=startup-script=seedq-actor-startup.sh" in template
    assert '"--metadata=seedq-learner=${LEARNER_IP}:50051,seedq-wheel=' in script  # the shell expands it
    describe = next(c for c in commands if c[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "describe"])
    assert "LEARNER_IP=$(" + shlex.join(describe) + ")" in script
    group = next(c for c in commands if c[:5] == ["gcloud", "compute", "instance-groups", "managed", "create"])
    assert "--size=3" in group and "--template=seedq-actor" in group  # ceil(40 / 16)
    firewall = next(c for c in commands if c[:4] == ["gcloud", "compute", "firewall-rules", "create"])
    assert "--allow=tcp:50051" in firewall and "--source-tags=seedq-actor" in firewall


@pytest.mark.e2e
def test_the_learner_vm_restricts_its_copied_credentials_even_when_the_install_fails(token, tmp_path):
    """scp leaves the token world-readable; the learner host's shell makes it
    0600 before anything that can fail under `set -e` (apt-get's install,
    failing here) could skip the chmod."""
    script = dry_run("gpu-vm", "--zone", "z", "--project", "proj", "--auth.token-file", token)
    ssh = [c for c in _commands(script)
           if c[:3] == ["gcloud", "compute", "ssh"] and any(w.startswith("--command=") for w in c)][-1]
    remote = next(w for w in ssh if w.startswith("--command=")).removeprefix("--command=")
    host = tmp_path / "host"
    (host / "seedq").mkdir(parents=True)
    copied = host / "seedq" / "token"
    copied.write_text("s3cret-token\n")
    copied.chmod(0o644)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # apt-get install fails (no network, a held dpkg lock): the last command of its && list, so set -e stops there.
    (bin_dir / "sudo").write_text('#!/bin/sh\ncase "$*" in *install*) exit 100;; esac\n')
    (bin_dir / "sudo").chmod(0o755)
    result = subprocess.run(["bash", "-c", remote], cwd=host, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert result.returncode == 100, result.stderr
    assert stat.S_IMODE(copied.stat().st_mode) == 0o600
    assert not (host / "seedq" / "venv").exists()  # set -e stopped it at the failed install


@pytest.mark.unit
def test_actor_vms_hold_the_least_they_need(token):
    """Their own service account (one role: reading the run's secrets), not the
    project's default account; actors as an unprivileged user; one pinned
    install (the launch's wheel, checked against its hash), not `pip install seedq`
    of whatever the index has at every boot."""
    from seedq.launch import gcloud

    script = dry_run("gpu-vm", "--zone", "z", "--project", "proj", "--auth.token-file", token)
    commands = _commands(script)
    template = next(c for c in commands if c[:4] == ["gcloud", "compute", "instance-templates", "create"])
    account = "seedq-actor@proj.iam.gserviceaccount.com"
    assert f"--service-account={account}" in template
    assert ["gcloud", "secrets", "add-iam-policy-binding", "seedq-token", f"--member=serviceAccount:{account}",
            "--role=roles/secretmanager.secretAccessor", "--project", "proj"] in commands
    startup = _heredoc(script)
    subprocess.run(["bash", "-n"], input=startup, text=True, check=True)
    assert "User=seedq" in startup.splitlines()
    digest = gcloud.sha256_of(GIVEN_WHEEL)
    assert f"INSTALLED={digest}" in startup.splitlines()
    assert f"  echo '{digest}  /opt/seedq-wheel/seedq-0.1.0-py3-none-any.whl' | sha256sum -c -" in startup.splitlines()
    # The wheel comes from the run's bucket, which only the actors' account may read.
    assert ["gcloud", "storage", "cp", GIVEN_WHEEL, "gs://proj-seedq-seedq/"] in commands
    assert ["gcloud", "storage", "buckets", "add-iam-policy-binding", "gs://proj-seedq-seedq",
            f"--member=serviceAccount:{account}", "--role=roles/storage.objectViewer", "--project", "proj"] in commands
    assert "--metadata=seedq-learner=${LEARNER_IP}:50051,seedq-wheel=gs://proj-seedq-seedq/seedq-0.1.0-py3-none-any.whl" \
        in template
    assert 'if [ "$(cat /opt/seedq/installed 2>/dev/null)" != "$INSTALLED" ]; then' in startup
    down = _commands(dry_run("gpu-vm", "--zone", "z", "--project", "proj", "--auth.token-file", token, "--down"))
    assert ["gcloud", "iam", "service-accounts", "delete", account, "--quiet", "--project", "proj"] in down
    assert ["gcloud", "storage", "rm", "--recursive", "gs://proj-seedq-seedq", "--quiet"] in down
    # Without secrets or a wheel to read, the VMs get no account at all.
    insecure = _commands(dry_run("gpu-vm", "--zone", "z", "--insecure", "--install", "seedq==0.1.0"))
    template = next(c for c in insecure if c[:4] == ["gcloud", "compute", "instance-templates", "create"])
    assert "--no-service-account" in template and "--no-scopes" in template


@pytest.mark.e2e
def test_actor_startup_script_runs_actors_against_the_learner_with_the_token(token, tmp_path):
    script = dry_run("gpu-vm", "--zone", "europe-west4-a", "--auth.token-file", token,
                     "--env", "ALE/Pong-v5", "--envs-per-actor", "24", "--atari.screen-size", "64")
    startup = _heredoc(script)
    subprocess.run(["bash", "-n"], input=startup, text=True, check=True)
    assert "gcloud secrets versions access latest --secret=seedq-token > /etc/seedq/seedq-token" in startup
    assert "instance/attributes/seedq-learner" in startup
    exec_start = next(l for l in startup.splitlines() if l.startswith("ExecStart="))
    words = shlex.split(exec_start.removeprefix("ExecStart="))
    assert words[:4] == ["/opt/seedq/bin/seedq", "actor", "--server", "${LEARNER}"]
    # As systemd would run it: ${LEARNER} from learner.env, %H the host, %i the unit instance.
    (tmp_path / "seedq-token").write_text("x\n")
    argv = [w.replace("${LEARNER}", "10.128.0.7:50051").replace("%H", "actor-vm-1").replace("%i", "3")
            .replace("/etc/seedq/", f"{tmp_path}/") for w in words[1:]]
    code, out, err = run_cli(argv + ["--print-config"])
    assert code == 0, err
    printed = json.loads(out)
    assert printed["server"] == "10.128.0.7:50051" and printed["actor_id"] == "actor-vm-1-3"
    assert printed["channel"]["auth"]["token_file"] == f"{tmp_path}/seedq-token"
    assert printed["num_envs"] == 24 and printed["env_options"]["atari"]["screen_size"] == 64
    # The same unit on another VM of the template steps other episodes.
    code, out, err = run_cli([w.replace("actor-vm-1", "actor-vm-2") for w in argv] + ["--print-config"])
    assert code == 0, err
    assert json.loads(out)["env_seed"] != printed["env_seed"]
    commands = _commands(script)
    create = commands[0]
    assert create[:5] == ["gcloud", "compute", "instances", "create", "seedq-learner"]
    for flag in ("--accelerator=type=nvidia-l4,count=1", "--maintenance-policy=TERMINATE",
                 "--image-family=common-cu128-ubuntu-2204-nvidia-570",
                 "--image-project=deeplearning-platform-release"):
        assert flag in create
    assert ["gcloud", "compute", "scp", token, "seedq-learner:seedq/token", "--zone", "europe-west4-a"] in commands
    assert any("jax[cuda12]" in word for command in commands for word in command)


@pytest.mark.unit
def test_teardown_and_refusals(token):
    down = _commands(dry_run("tpu-vm", "--zone", "z", "--down", "--auth.token-file", token))
    assert down[0][:5] == ["gcloud", "compute", "instance-groups", "managed", "delete"]
    assert ["gcloud", "secrets", "delete", "seedq-token", "--quiet"] in down
    assert down[-1][:5] == ["gcloud", "compute", "tpus", "queued-resources", "delete"]
    assert "--force" in down[-1]
    code, out, err = run_cli(["launch", "tpu-vm", "--zone", "z", "--dry-run"])
    assert code == 2 and "--auth.token-file" in err and err.count("\n") == 1
    code, out, err = run_cli(["launch", "gpu-vm", "--zone", "z", "--dry-run", "--auth.token-file", "/no/such"])
    assert code == 2 and "/no/such: no such file" in err
    # Server-only TLS authenticates no actor: refused like no credentials at all.
    code, out, err = run_cli(["launch", "gpu-vm", "--zone", "z", "--dry-run", "--tls.cert", token, "--tls.key", token])
    assert code == 2 and "--tls.client-ca" in err and "--auth.token-file" in err and err.count("\n") == 1


@pytest.mark.e2e
def test_without_dry_run_the_commands_run_and_stop_at_the_first_failure(token, tmp_path, monkeypatch):
    """A stand-in `gcloud` on PATH records its argv; it answers the describe calls and fails
    creating the instance group."""
    log = tmp_path / "calls.jsonl"
    fake = tmp_path / "bin" / "gcloud"
    fake.parent.mkdir()
    fake.write_text(f"""#!{sys.executable}
import json, sys
args = sys.argv[1:]
with open({str(log)!r}, "a") as f:
    f.write(json.dumps(args) + "\\n")
if "--format=value(state.state)" in args:
    print("ACTIVE")
if "--format=value(networkEndpoints[0].ipAddress)" in args:
    print("10.130.0.9")
sys.exit(3 if args[:3] == ["compute", "instance-groups", "managed"] else 0)
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["launch", "tpu-vm", "--zone", "z", "--auth.token-file", token, "--yes",
                              "--install", GIVEN_WHEEL])
    assert code == 3
    assert err.splitlines()[-1].startswith("seedq launch tpu-vm: failed (exit 3): gcloud compute instance-groups")
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert calls[-1][:4] == ["compute", "instance-groups", "managed", "create"]
    template = next(c for c in calls if c[:2] == ["compute", "instance-templates"])
    assert any(w.startswith("--metadata=seedq-learner=10.130.0.9:50051,") for w in template)  # the captured address
    assert (tmp_path / "seedq-actor-startup.sh").read_text().startswith("#!/bin/bash")


def fake_gcloud(tmp_path, monkeypatch, exit_code: int = 0) -> pathlib.Path:
    """A `gcloud` on PATH that records its argv (one JSON line a call) and exits `exit_code`."""
    log = tmp_path / "gcloud-calls.jsonl"
    fake = tmp_path / "fakebin" / "gcloud"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(f"""#!{sys.executable}
import json, sys
with open({str(log)!r}, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
sys.exit({exit_code})
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    return log


@pytest.mark.e2e
@pytest.mark.parametrize("extra", [[], ["--down"]], ids=["create", "down"])
def test_without_yes_and_without_a_terminal_the_launch_refuses_in_one_line_and_runs_no_gcloud(
        token, tmp_path, monkeypatch, extra):
    calls = fake_gcloud(tmp_path, monkeypatch)
    result = subprocess.run(
        [sys.executable, "-m", "seedq.cli", "launch", "gpu-vm", "--zone", "z", "--auth.token-file", token, *extra],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "--yes" in result.stderr and "Traceback" not in result.stderr
    assert not calls.exists()  # no gcloud command ran
    assert not (tmp_path / "dist").exists()  # nor was a wheel built


class Terminal(io.StringIO):
    """Standard input as a terminal that types `answer`."""

    def isatty(self) -> bool:
        return True


@pytest.mark.e2e
def test_the_plan_with_its_estimate_is_printed_and_nothing_runs_without_a_yes(token, tmp_path, monkeypatch):
    calls = fake_gcloud(tmp_path, monkeypatch, exit_code=3)  # a yes runs the first command only
    monkeypatch.chdir(tmp_path)
    flags = ["launch", "tpu-vm", "--zone", "us-central2-b", "--project", "proj", "--tpu-type", "v5litepod-8",
             "--auth.token-file", token, "--num-actors", "64", "--install", GIVEN_WHEEL]
    monkeypatch.setattr(sys, "stdin", Terminal("n\n"))
    code, out, err = run_cli(flags)
    assert code == 1 and "nothing done" in err and not calls.exists()
    from seedq.launch import prices

    plan = out.splitlines()
    assert plan[0].startswith("will create (installing seedq-0.1.0-py3-none-any.whl")
    tpu = prices.tpu_hourly("v5litepod-8", 8)
    group = 3 * prices.machine_hourly("n2-standard-32")  # ceil(64 / 30) VMs
    assert any(line.strip().startswith("TPU v5litepod-8 (8 chips") and f"~${tpu:,.2f}/h" in line for line in plan)
    assert any("3 x n2-standard-32" in line and f"~${group:,.2f}/h" in line for line in plan)
    estimate = next(line for line in plan if line.strip().startswith("estimate:"))
    assert f"~${tpu + group:,.2f}/h" in estimate and "not a quote" in estimate
    assert "bucket gs://proj-seedq-seedq" in out and "secret seedq-token" in out
    # A yes runs the commands.
    monkeypatch.setattr(sys, "stdin", Terminal("y\n"))
    assert run_cli(flags)[0] == 3
    assert json.loads(calls.read_text().splitlines()[0])[:4] == ["compute", "tpus", "queued-resources", "create"]
    # --down lists what it deletes before asking.
    calls.unlink()
    monkeypatch.setattr(sys, "stdin", Terminal("no\n"))
    code, out, err = run_cli(["launch", "tpu-vm", "--zone", "z", "--project", "proj", "--down",
                              "--auth.token-file", token])
    assert code == 1 and not calls.exists()
    assert out.splitlines()[0] == "will delete:"
    for thing in ("instance-groups managed seedq-actors", "secrets seedq-token", "bucket gs://proj-seedq-seedq",
                  "tpus queued-resources seedq-qr"):
        assert any(line.strip().startswith(thing) for line in out.splitlines()), (thing, out)


@pytest.mark.e2e
@pytest.mark.parametrize("learner_exit, resized", [(0, True), (1, True), (143, False)])
def test_the_learner_vm_resizes_the_actor_group_to_zero_when_the_run_ends(
        token, tmp_path, monkeypatch, learner_exit, resized):
    """The learner VM's background line, run here with a stub learner and a
    recording `gcloud`: the group goes to zero unless SIGTERM stopped the
    learner to be restarted (exit 143)."""
    script = dry_run("gpu-vm", "--zone", "europe-west4-a", "--project", "proj", "--auth.token-file", token)
    start = [c for c in _commands(script) if c[:3] == ["gcloud", "compute", "ssh"]][-1]
    line = learner_line(start)
    learner = tmp_path / "seedq" / "venv" / "bin" / "seedq"
    learner.parent.mkdir(parents=True)
    learner.write_text(f"#!/bin/sh\nexit {learner_exit}\n")
    learner.chmod(0o755)
    calls = fake_gcloud(tmp_path, monkeypatch)
    result = subprocess.run(["bash", "-c", line], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == learner_exit
    recorded = [json.loads(c) for c in calls.read_text().splitlines()] if calls.exists() else []
    expected = ["compute", "instance-groups", "managed", "resize", "seedq-actors", "--size=0",
                "--zone", "europe-west4-a", "--project", "proj"]
    assert recorded == ([expected] if resized else [])


@pytest.mark.e2e
def test_the_default_install_is_a_wheel_of_this_checkout_that_installs_in_a_fresh_venv(token, tmp_path, monkeypatch):
    """Acceptance: the dry-run plans name a wheel of this checkout (its commit in
    the run config); the learner's own install line, run in a fresh venv here
    (with --no-deps: the dependencies come from this environment), installs it,
    and its `seedq --version` is the checkout's."""
    import seedq
    import sysconfig

    monkeypatch.chdir(tmp_path)
    wheel = "seedq-0.1.0-py3-none-any.whl"
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    scripts = {kind: dry_run(kind, "--zone", "us-central2-b", "--auth.token-file", token, "--install", "")
               for kind in ("tpu-vm", "gpu-vm")}
    for kind, script in scripts.items():
        assert script.startswith("#!/bin/bash\n")  # the plan stays a script: its summary follows the shebang
        header = script.splitlines()[1]
        assert header == f"# will create (installing seedq {seedq.__version__}, wheel of commit " \
            f"{commit}{'+dirty' if '+dirty' in header else ''}):", header
        commands = _commands(script)
        assert any("scp" in c and f"dist/{wheel}" in c for c in commands), kind  # the wheel goes to the learner
        start = [c for c in commands if "ssh" in c and any("nohup" in w for w in c)][-1]
        learner = shlex.split(learner_line(start).split("; code=$?", 1)[0])
        assert learner[learner.index("--code-source") + 1].startswith(f"seedq {seedq.__version__}, wheel of commit {commit}")
    remote = next(w for w in start if w.startswith("--command=")).removeprefix("--command=")
    install = next(part.strip() for part in re.split(r";|&&", remote) if "pip install seedq/" in part)
    assert install == f"seedq/venv/bin/pip install seedq/{wheel}"
    # As on the VM: the copied wheel and a fresh venv, then the plan's install line.
    vm = tmp_path / "vm"
    (vm / "seedq").mkdir(parents=True)
    (vm / "seedq" / wheel).write_bytes((tmp_path / "dist" / wheel).read_bytes())
    bare = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # (this checkout must not count as installed)
    subprocess.run([sys.executable, "-m", "venv", "seedq/venv"], cwd=vm, check=True, timeout=300, env=bare)
    subprocess.run(shlex.split(install) + ["--no-deps", "--no-index", "-q"], cwd=vm, check=True, timeout=300, env=bare)
    deps = {**bare, "PYTHONPATH": sysconfig.get_paths()["purelib"]}
    version = subprocess.run([str(vm / "seedq" / "venv" / "bin" / "seedq"), "--version"], cwd=vm, env=deps,
                             capture_output=True, text=True, timeout=120)
    assert version.stdout == f"seedq {seedq.__version__}\n", version.stderr
    where = subprocess.run([str(vm / "seedq" / "venv" / "bin" / "python"), "-c", "import seedq; print(seedq.__file__)"],
                           env=deps, capture_output=True, text=True, timeout=60).stdout
    assert where.startswith(str(vm / "seedq" / "venv")), where  # the wheel's seedq, not this checkout's


# --- launch/README.md and the image ---

def _readme_commands(prefix: str) -> list[list[str]]:
    """The README's shell commands starting with `prefix` (continuation lines joined)."""
    text = (REPO / "launch" / "README.md").read_text().replace("\\\n", " ")
    return [shlex.split(line.split(" > ")[0].split(" | ")[0].strip())
            for line in text.splitlines() if line.strip().startswith(prefix)]


@pytest.mark.unit
def test_readme_gke_command_renders_the_committed_tpu_example():
    (command,) = _readme_commands("seedq launch k8s")
    code, out, err = run_cli(command[1:])
    assert code == 0, err
    committed = (REPO / "launch" / "k8s" / "tpu-v5litepod-16.yaml").read_text()
    assert out == "".join(committed.splitlines(keepends=True)[2:])


@pytest.mark.unit
def test_readme_learner_and_actor_examples_follow_the_credentials_rule():
    learners = _readme_commands("seedq learner")
    actors = _readme_commands("seedq actor") + _readme_commands("seedq impala-actor")
    assert learners and actors
    for command in learners:
        if "--address" in command and not command[command.index("--address") + 1].startswith(("unix:", "127.")):
            assert {"--auth.token-file", "--tls.cert", "--insecure"} & set(command), command
    for command in actors:
        assert {"--auth.token-file", "--tls.ca"} & set(command), command


@pytest.mark.unit
def test_dockerfile_installs_like_the_readme():
    dockerfile = (REPO / "Dockerfile").read_text()
    readme = (REPO / "launch" / "README.md").read_text()
    instructions = "\n".join(line for line in dockerfile.splitlines() if not line.lstrip().startswith("#"))
    pip_lines = re.findall(r"pip install [^&\n\\;]+", instructions)
    assert [line.strip() for line in pip_lines] == ["pip install .", 'pip install -U "$JAX_EXTRA"']
    # The README's install commands, with the build argument's two values.
    assert "\npip install .\n" in readme
    assert 'pip install -U "jax[tpu]"' in readme and 'pip install -U "jax[cuda12]"' in readme
    assert re.search(r"ARG JAX_EXTRA=", dockerfile) and "jax[cuda12]" in dockerfile and "jax[tpu]" in dockerfile
    assert ".venv" in (REPO / ".dockerignore").read_text().split()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.e2e
def test_rendered_learner_and_actor_train_together_with_the_readme_secrets(tmp_path):
    """The CPU render with mutual TLS and a token, run for real on loopback: the
    Secrets hold `seedq certs` files under the keys launch/README.md gives them."""
    config = k8s.examples()["cpu.yaml"][0]
    config = dataclasses.replace(config, num_actors=1, envs_per_actor=8, eval_episodes=0)
    opts = K8sOptions(accelerator="cpu", image="img:1", name="cartpole", tls_mode="mutual")
    docs = k8s.render_objects(config, opts)
    code, _, err = run_cli(["certs", "--out", tmp_path / "certs", "--hosts", "cartpole-learner"])
    assert code == 0, err
    certs = tmp_path / "certs"
    # kubectl create secret generic ... --from-file=KEY=FILE, as in the README.
    secrets = {"cartpole-learner": {"tls.crt": "server.pem", "tls.key": "server-key.pem", "ca.crt": "ca.pem"},
               "cartpole-actors": {"tls.crt": "client.pem", "tls.key": "client-key.pem", "ca.crt": "ca.pem"}}
    port = _free_port()
    commands = {}
    for doc in (d for d in docs if d["kind"] == "Job"):
        role = doc["metadata"]["labels"]["app.kubernetes.io/component"]
        root = tmp_path / doc["metadata"]["name"]
        mapping = _stub_pod_files(doc, root, docs)
        for key, source in secrets[doc["metadata"]["name"]].items():
            (pathlib.Path(mapping[k8s.TLS_DIR]) / key).write_bytes((certs / source).read_bytes())
        (pathlib.Path(mapping[k8s.TOKEN_DIR]) / "token").write_bytes((certs / "token").read_bytes())
        (container,) = _pod(doc)["containers"]
        argv = _localise(container["command"][1:], mapping)
        if role == "learner":
            config_path = pathlib.Path(mapping[k8s.CONFIG_DIR]) / "config.json"
            config_path.write_text("\n".join(_localise(config_path.read_text().split("\n"),
                                                       {**mapping, k8s.RUNS_DIR: str(root / "runs")})))
            # Loopback instead of the pod's 0.0.0.0; a run bounded by frames, not
            # seconds, whatever the machine's speed (flags override the file).
            argv += ["--address", f"127.0.0.1:{port}", "--server.health-port", str(_free_port()),
                     "--max-frames", "4000", "--max-seconds", "0", "--quiet"]
        else:
            argv[argv.index("--server") + 1] = f"127.0.0.1:{port}"  # the pod DNS name, resolved
        commands[role] = argv
    learner = subprocess.Popen([sys.executable, "-m", "seedq.cli", *commands["learner"]],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    actor = subprocess.Popen([sys.executable, "-m", "seedq.cli", *commands["actor"]],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = learner.communicate(timeout=240)
        # The learner told the actor that the run ended: it exits 0, which completes
        # its index of the actor Job (the actors end with the run).
        actor_code = actor.wait(10)
    finally:
        for p in (learner, actor):
            if p.poll() is None:
                p.terminate()
        actor_out = actor.communicate(timeout=30)[0]
    assert learner.returncode == 0, out + "\n--- actor ---\n" + actor_out
    assert actor_code == 0 and "ended (max_frames)" in actor_out, actor_out
    run = tmp_path / "cartpole-learner" / "runs" / "cartpole"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["frames"] >= 4000 and summary["stop_reason"] == "max_frames", summary
    assert json.loads((run / "config.json").read_text())["tls"]["client_ca"].endswith("/tls/ca.crt")


@pytest.mark.unit
def test_actor_env_seed_mixes_in_the_actor_id_only_when_asked():
    def env_seed(*flags):
        code, out, err = run_cli(["actor", "--server", "localhost:1", "--env", "CartPole-v1", *flags, "--print-config"])
        assert code == 0, err
        return json.loads(out)["env_seed"]

    assert env_seed("--seed", "7", "--actor-id", "a-1") == 7
    mixed = env_seed("--seed", "7", "--actor-id", "a-1", "--seed-from-actor-id")
    assert mixed == env_seed("--seed", "7", "--actor-id", "a-1", "--seed-from-actor-id")  # stable across processes
    assert mixed not in (7, env_seed("--seed", "7", "--actor-id", "a-2", "--seed-from-actor-id"),
                         env_seed("--seed", "8", "--actor-id", "a-1", "--seed-from-actor-id"))
