"""`seedq launch tpu-vm` / `seedq launch gpu-vm`: the `gcloud` commands of a run on plain VMs.

A plan is a list of steps (a `gcloud` command, or a local file to write),
rendered by pure functions from the run config and the VM options. `--dry-run`
prints the plan as a shell script; otherwise `run_plan` runs it step by step
and stops at the first failure. The forms follow the gcloud reference:

- TPU: `gcloud compute tpus queued-resources create QR --node-id N --zone Z
  --accelerator-type T --runtime-version V [--spot | --reserved]`, then
  `gcloud compute tpus tpu-vm scp|ssh N --zone Z --worker=all` to copy the
  credentials, install seedq and start the learner on every worker;
- GPU: `gcloud compute instances create N --accelerator=type=T,count=C
  --maintenance-policy=TERMINATE --image-family F --image-project P`, then
  `gcloud compute scp|ssh`;
- actors: the token (and TLS files) in Secret Manager, a firewall rule from the
  actor VMs to the learner port, an instance template whose startup script
  fetches them and runs one systemd `seedq actor` unit per process against the
  learner's internal address (instance metadata `seedq-learner`), and a
  managed instance group of those VMs (`gcloud compute instance-groups managed
  resize` scales it while training runs).

Teardown (`--down`) deletes all of it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shlex
import subprocess
import tempfile
import time

from seedq.transport import channel
from seedq.config import TrainConfig
from seedq.launch.options import RUNTIME_VERSIONS, VmOptions

# On the learner VM (relative to the ssh user's home): credentials and the venv.
VM_DIR = "seedq"
# On the actor VMs (the startup script runs as root; the actors as ACTOR_USER).
ACTOR_DIR = "/etc/seedq"
ACTOR_USER = "seedq"


POLL_SECONDS = 30


@dataclasses.dataclass(frozen=True)
class Step:
    """A command (argv; words may use ${VAR} of an earlier `capture`), or a file to write."""

    argv: tuple[str, ...] = ()
    capture: str = ""  # store the command's stripped stdout in this variable
    until: str = ""  # repeat the command every POLL_SECONDS until its stdout is this
    write_path: str = ""
    write_text: str = ""
    comment: str = ""


def _scope(opts: VmOptions) -> list[str]:
    return ["--zone", opts.zone] + (["--project", opts.project] if opts.project else [])


def install_is_local_wheel(opts: VmOptions) -> bool:
    return opts.install.endswith(".whl") and os.path.isfile(opts.install)


def install_source(opts: VmOptions) -> str:
    """What the learner VM `pip install`s: a local wheel at its copied path
    (`seedq launch` builds one of this checkout when --install is empty), or
    the package spec or URL given."""
    if not opts.install:
        raise ValueError("--install: empty (the launch builds a wheel of this checkout first)")
    if install_is_local_wheel(opts):
        return f"{VM_DIR}/{os.path.basename(opts.install)}"
    return opts.install


@dataclasses.dataclass(frozen=True)
class Wheel:
    """A wheel of seedq built from this checkout."""

    path: str
    version: str
    commit: str  # "" where git cannot tell; a "+dirty" suffix: uncommitted changes went in

    def describe(self) -> str:
        return f"seedq {self.version}, wheel of commit {self.commit or 'unknown'}"


def checkout_root() -> str:
    """The source tree this seedq is imported from; ValueError when it is an installed package."""
    import seedq

    root = os.path.dirname(os.path.dirname(os.path.abspath(seedq.__file__)))
    try:
        with open(os.path.join(root, "pyproject.toml")) as f:
            if re.search(r'^name = "seedq"$', f.read(), re.MULTILINE):
                return root
    except OSError:
        pass
    raise ValueError("--install: this seedq is an installed package, not a checkout; give --install a "
                     "wheel file, a wheel URL or a package spec (seedq==VERSION)")


def checkout_commit(root: str) -> str:
    """HEAD of the checkout (with "+dirty" when files differ from it); "" without git."""
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        status = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return ""
    return head.stdout.strip() + ("+dirty" if status.stdout.strip() else "")


def copy_tracked_files(root: str, dest: str) -> None:
    """The checkout's git-tracked files (all of the tree where git cannot list them) into `dest`."""
    import shutil

    try:
        listed = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True, check=True).stdout
        files = [name for name in listed.decode().split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        files = []
    if not files:
        shutil.copytree(root, dest, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__"))
        return
    for name in files:
        if os.path.isfile(os.path.join(root, name)):  # (a tracked file deleted in the work tree is left out)
            os.makedirs(os.path.dirname(os.path.join(dest, name)), exist_ok=True)
            shutil.copy2(os.path.join(root, name), os.path.join(dest, name))


def build_checkout_wheel(out_dir: str) -> Wheel:
    """`pip wheel` of this checkout (no dependencies) into `out_dir`; ValueError in one line on failure."""
    import importlib.util
    import sys
    import seedq

    root = checkout_root()
    os.makedirs(out_dir, exist_ok=True)
    name = f"seedq-{seedq.__version__}-py3-none-any.whl"
    path = os.path.join(out_dir, name)
    if os.path.exists(path):
        os.remove(path)  # an older build of the same version: never installed by mistake
    # Without build isolation where setuptools is here: no package index needed.
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    with tempfile.TemporaryDirectory(prefix="seedq-wheel-") as source:
        # Built from a copy of the files git tracks (as they are now): nothing
        # untracked goes in, and setuptools' build/ and egg-info stay out of the checkout.
        copy_tracked_files(root, source)
        result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q", "-w",
                                 os.path.abspath(out_dir), source], capture_output=True, text=True)
    if result.returncode != 0 or not os.path.isfile(path):
        last = (result.stderr.strip().splitlines() or ["no wheel written"])[-1]
        raise ValueError(f"--install: building a wheel of {root} failed ({last})")
    return Wheel(path, seedq.__version__, checkout_commit(root))


def wheel_bucket(opts: VmOptions) -> str:
    """The run's Cloud Storage bucket the actor VMs fetch a local wheel from
    (the project id keeps the global name unique)."""
    return f"gs://{opts.project or '${PROJECT}'}-{opts.name}-seedq"


def uses_wheel_bucket(opts: VmOptions) -> bool:
    """Whether the launch made a wheel bucket: a local wheel, or the default (a wheel of the checkout)."""
    return not opts.install or install_is_local_wheel(opts)


def wheel_url(opts: VmOptions) -> str:
    return f"{wheel_bucket(opts)}/{os.path.basename(opts.install)}"


def _region(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def sha256_of(path: str) -> str:
    import hashlib

    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _install_words(opts: VmOptions, pip: str, extra: str) -> str:
    """The shell commands that install seedq (as in the README) plus the accelerator's jax build."""
    words = f"{pip} install {shlex.quote(install_source(opts))}"
    if extra:
        words += f" && {pip} install -U {shlex.quote(extra)}"
    return words


# Credential fields of the learner config: (section, field) -> file name on the learner VM.
_LEARNER_FILES = {("tls", "cert"): "server.crt", ("tls", "key"): "server.key",
                  ("tls", "client_ca"): "client-ca.crt", ("auth", "token_file"): "token"}


def learner_files(config: TrainConfig) -> dict[str, str]:
    """{local path: file name on the learner VM} of the learner's credentials."""
    files = {}
    for (section, field), remote in _LEARNER_FILES.items():
        path = getattr(getattr(config, section), field)
        if path:
            files[path] = remote
    return files


def learner_command(config: TrainConfig, opts: VmOptions) -> list[str]:
    """`seedq learner` on the VM: every config flag, credentials at their copied paths, --resume auto."""
    from seedq.flags import config_flags

    replace = {}
    for (section, field), remote in _LEARNER_FILES.items():
        if getattr(getattr(config, section), field):
            replace.setdefault(section, {})[field] = f"{VM_DIR}/{remote}"
    vm_config = dataclasses.replace(
        config, address=f"0.0.0.0:{opts.port}", logdir=config.logdir or f"{VM_DIR}/runs/{opts.name}",
        **{s: dataclasses.replace(getattr(config, s), **f) for s, f in replace.items()},
    )
    return [f"{VM_DIR}/venv/bin/seedq", "learner", *config_flags(vm_config), "--resume", "auto"]


def learner_then_stop_actors(config: TrainConfig, opts: VmOptions) -> str:
    """The learner's shell line on its VM: the learner, then (unless SIGTERM
    stopped it to be restarted: exit 143) the actor group resized to zero, so
    that the actor VMs stop billing once the run is over (a managed group
    recreates VMs that merely shut down). Needs compute.instanceGroupManagers.update."""
    from seedq.process import exit_codes

    learner = shlex.join(learner_command(config, opts))
    resize = shlex.join(["gcloud", "compute", "instance-groups", "managed", "resize", f"{opts.name}-actors",
                         "--size=0", *_scope(opts)])
    return (f"{learner}; code=$?; if [ $code -ne {exit_codes.TERMINATED} ]; then "
            f'echo "learner exit $code: the run is over, resizing the actor group to zero"; {resize}; fi; '
            "exit $code")


def _start_learner_shell(config: TrainConfig, opts: VmOptions, jax_extra: str) -> str:
    """What runs over ssh on each learner host: install, then the learner in the background."""
    learner = "bash -c " + shlex.quote(learner_then_stop_actors(config, opts))
    # scp leaves the copied credentials world-readable (umask): only the ssh user may read them,
    # restricted first, so that no failing step after it (set -e) leaves them readable.
    private = " ".join(f"{VM_DIR}/{name}" for name in learner_files(config).values())
    return (
        "set -e; "
        + (f"chmod 0600 {private}; " if private else "")
        + "sudo apt-get update -q && sudo apt-get install -yq python3-venv; "
        + f"mkdir -p {VM_DIR}; python3 -m venv {VM_DIR}/venv; "
        + _install_words(opts, f"{VM_DIR}/venv/bin/pip", jax_extra)
        + f"; nohup {learner} > {VM_DIR}/learner.log 2>&1 < /dev/null &"
    )


def actor_secrets(config: TrainConfig, opts: VmOptions) -> dict[str, tuple[str, str]]:
    """{secret name: (local file, actor flag)}: the files the actor VMs fetch from Secret Manager."""
    secrets = {}
    if config.auth.token_file:
        secrets[f"{opts.name}-token"] = (config.auth.token_file, "--auth.token-file")
    for suffix, path, flag in (("ca", opts.actor_tls_ca, "--tls.ca"), ("client-cert", opts.actor_tls_cert, "--tls.cert"),
                               ("client-key", opts.actor_tls_key, "--tls.key")):
        if path:
            secrets[f"{opts.name}-{suffix}"] = (path, flag)
    return secrets


def actor_startup_script(config: TrainConfig, opts: VmOptions) -> str:
    """The actor VMs' startup script: install seedq, fetch the credentials, one systemd unit per process."""
    from seedq.flags import config_flags
    from seedq.config import EnvOptions

    command = "impala-actor" if config.architecture == "impala" else "actor"
    flags = ["--env", config.env, "--num-envs", str(config.envs_per_actor), *config_flags(config.env_options, EnvOptions)]
    fetch = []
    for secret, (_, flag) in actor_secrets(config, opts).items():
        # Readable by the actors' user (group), by no one else.
        fetch.append(f"(umask 0137; gcloud secrets versions access latest --secret={secret} > {ACTOR_DIR}/{secret})"
                     f" && chgrp {ACTOR_USER} {ACTOR_DIR}/{secret}")
        flags += [flag, f"{ACTOR_DIR}/{secret}"]
    if opts.tls_server_name:
        flags += ["--tls.server-name", opts.tls_server_name]
    exec_start = (
        # Every VM of the template runs these units: the actor id (host, unit)
        # makes their env seeds differ.
        f"/opt/seedq/bin/seedq {command} --server ${{LEARNER}} --actor-id %H-%i "
        f"--seed {config.seed} --seed-from-actor-id "
        + shlex.join(flags)
    )
    if install_is_local_wheel(opts):
        # The wheel from the run's bucket (its URL in the instance metadata),
        # checked against the hash of the one this launch built.
        wheel = f"/opt/seedq-wheel/{os.path.basename(opts.install)}"
        installed = sha256_of(opts.install)
        install = [
            "  WHEEL_URL=$(curl -sf -H 'Metadata-Flavor: Google' "
            "http://metadata.google.internal/computeMetadata/v1/instance/attributes/seedq-wheel)",
            "  mkdir -p /opt/seedq-wheel && gcloud storage cp \"$WHEEL_URL\" /opt/seedq-wheel/",
            f"  echo {shlex.quote(f'{installed}  {wheel}')} | sha256sum -c -",
            f"  /opt/seedq/bin/pip install {shlex.quote(wheel)}",
        ]
    else:
        installed = install_source(opts)
        install = ["  " + _install_words(opts, "/opt/seedq/bin/pip", "")]
    return "\n".join([
        "#!/bin/bash",
        "# Startup script of the seedq actor VMs (rendered by `seedq launch`); runs as root at every boot.",
        "# It installs seedq once (the launch's wheel, or the package given), and runs the actors",
        "# as an unprivileged user.",
        "set -euo pipefail",
        f"INSTALLED={shlex.quote(installed)}",
        'if [ "$(cat /opt/seedq/installed 2>/dev/null)" != "$INSTALLED" ]; then',
        "  apt-get update -q && apt-get install -yq python3-venv",
        "  python3 -m venv /opt/seedq",
        *install,
        '  echo "$INSTALLED" > /opt/seedq/installed',
        "fi",
        f"id -u {ACTOR_USER} >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin {ACTOR_USER}",
        f"install -d -m 0750 -g {ACTOR_USER} {ACTOR_DIR}",
        *fetch,
        "LEARNER=$(curl -sf -H 'Metadata-Flavor: Google' "
        "http://metadata.google.internal/computeMetadata/v1/instance/attributes/seedq-learner)",
        f"echo \"LEARNER=$LEARNER\" > {ACTOR_DIR}/learner.env",
        "cat > /etc/systemd/system/seedq-actor@.service <<'UNIT'",
        "[Unit]",
        "Description=seedq actor %i",
        "After=network-online.target",
        "[Service]",
        f"EnvironmentFile={ACTOR_DIR}/learner.env",
        f"User={ACTOR_USER}",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        f"ExecStart={exec_start}",
        "Restart=always",
        "RestartSec=5",
        "[Install]",
        "WantedBy=multi-user.target",
        "UNIT",
        "systemctl daemon-reload",
        f"systemctl enable --now $(seq -f 'seedq-actor@%g' 0 {opts.actor_processes_per_vm - 1})",
        "",
    ])


def actor_service_account(opts: VmOptions) -> str:
    """The actor VMs' own service account (its project: --project, or gcloud's, captured as ${PROJECT})."""
    project = opts.project or "${PROJECT}"
    return f"{opts.name}-actor@{project}.iam.gserviceaccount.com"


def actor_vms(config: TrainConfig, opts: VmOptions) -> int:
    return math.ceil(config.num_actors / opts.actor_processes_per_vm)


def _actor_steps(config: TrainConfig, opts: VmOptions, address: str) -> list[Step]:
    scope = _scope(opts)
    project = ["--project", opts.project] if opts.project else []
    script_path = f"{opts.name}-actor-startup.sh"
    secrets = actor_secrets(config, opts)
    steps = [Step(comment="Credentials for the actor VMs, in Secret Manager, readable by the actors' own "
                          "service account, which has no other role.")]
    account = actor_service_account(opts)
    wheel = install_is_local_wheel(opts)
    if secrets or wheel:
        if not opts.project:
            steps.append(Step(("gcloud", "config", "get-value", "project"), capture="PROJECT"))
        steps.append(Step(("gcloud", "iam", "service-accounts", "create", f"{opts.name}-actor",
                           "--display-name=seedq actors (reads the run's secrets and wheel only)", *project)))
    if wheel:
        bucket = wheel_bucket(opts)
        steps += [
            Step(("gcloud", "storage", "buckets", "create", bucket, f"--location={_region(opts.zone)}",
                  "--uniform-bucket-level-access", *project),
                 comment="The seedq wheel for the actor VMs, readable by their account alone."),
            Step(("gcloud", "storage", "cp", opts.install, f"{bucket}/")),
            Step(("gcloud", "storage", "buckets", "add-iam-policy-binding", bucket,
                  f"--member=serviceAccount:{account}", "--role=roles/storage.objectViewer", *project)),
        ]
    for secret, (path, _) in secrets.items():
        steps.append(Step(("gcloud", "secrets", "create", secret, f"--data-file={path}", *project)))
        steps.append(Step(("gcloud", "secrets", "add-iam-policy-binding", secret,
                           f"--member=serviceAccount:{account}", "--role=roles/secretmanager.secretAccessor",
                           *project)))
    # Secret Manager's API takes the cloud-platform scope only; the account's
    # single role is the bound. Without secrets the VMs get no account at all.
    identity = ([f"--service-account={account}", "--scopes=cloud-platform"] if secrets or wheel
                else ["--no-service-account", "--no-scopes"])
    metadata = f"--metadata=seedq-learner={address}" + (f",seedq-wheel={wheel_url(opts)}" if wheel else "")
    steps += [
        Step(("gcloud", "compute", "firewall-rules", "create", f"{opts.name}-learner", f"--network={opts.network}",
              f"--allow=tcp:{opts.port}", f"--source-tags={opts.name}-actor", f"--target-tags={opts.name}-learner",
              *project),
             comment="Only the actor VMs reach the learner port."),
        Step(write_path=script_path, write_text=actor_startup_script(config, opts)),
        Step(("gcloud", "compute", "instance-templates", "create", f"{opts.name}-actor",
              f"--machine-type={opts.actor_machine_type}", "--image-family=debian-12", "--image-project=debian-cloud",
              *identity, f"--tags={opts.name}-actor", f"--network={opts.network}",
              metadata, f"--metadata-from-file=startup-script={script_path}",
              *(["--provisioning-model=SPOT"] if opts.spot else []), *project)),
        Step(("gcloud", "compute", "instance-groups", "managed", "create", f"{opts.name}-actors",
              f"--template={opts.name}-actor", f"--size={actor_vms(config, opts)}", *scope),
             comment=f"{config.num_actors} actor processes (--num-actors; docs/scaling.md gives the count "
                     f"one learner can feed): {actor_vms(config, opts)} VMs of "
                     f"{opts.actor_processes_per_vm}. Scale with: gcloud compute instance-groups managed "
                     f"resize {opts.name}-actors --size=N --zone={opts.zone}"),
    ]
    return steps


def _learner_identity(opts: VmOptions) -> list[str]:
    """The learner VM's account and scope: it resizes the actor group when the run ends."""
    account = [f"--service-account={opts.learner_service_account}"] if opts.learner_service_account else []
    return [*account, "--scopes=cloud-platform"]


def check_credentials(config: TrainConfig) -> None:
    if not (config.insecure or channel.authenticates_clients(
            client_ca=bool(config.tls.client_ca), token=bool(config.auth.token_file))):
        raise ValueError(channel.unauthenticated_exposure(
            "the learner on its VM's network",
            "give a token (--auth.token-file FILE) and/or a client CA (--tls.client-ca with --tls.cert/--tls.key)"))
    for path in learner_files(config):
        if not os.path.isfile(path):
            raise ValueError(f"{path}: no such file (a credential to copy to the VMs)")


def check_inputs(config: TrainConfig, opts: VmOptions, kind: str) -> None:
    """ValueError (one line) for options, config or credentials a plan of `kind` refuses."""
    from seedq.launch.tpu import tpu_slice

    opts.validate(kind)
    config.validate()
    if kind == "tpu":
        tpu_slice(opts.tpu_type)
    check_credentials(config)


def tpu_vm_plan(config: TrainConfig, opts: VmOptions) -> list[Step]:
    """Create the TPU VM (queued resource), start the learner on every worker, then the actor group."""
    from seedq.launch.tpu import tpu_slice

    check_inputs(config, opts, "tpu")
    tpu = tpu_slice(opts.tpu_type)
    scope = _scope(opts)
    node = opts.name
    capacity = ["--spot"] if opts.spot else ["--reserved"] if opts.reserved else []
    steps = [
        Step(("gcloud", "compute", "tpus", "queued-resources", "create", f"{node}-qr", f"--node-id={node}",
              f"--accelerator-type={opts.tpu_type}", f"--runtime-version={opts.runtime_version or RUNTIME_VERSIONS[opts.tpu_type.split('-')[0]]}",
              f"--tags={opts.name}-learner", f"--network={opts.network}", *capacity, *_learner_identity(opts),
              *scope),
             comment=f"{opts.tpu_type}: {tpu.chips} chips, {tpu.hosts} host(s). The queued resource "
                     "waits for capacity; the next steps need it ACTIVE."),
        Step(("gcloud", "compute", "tpus", "queued-resources", "describe", f"{node}-qr", "--format=value(state.state)",
              *scope), until="ACTIVE"),
    ]
    ssh = ("gcloud", "compute", "tpus", "tpu-vm", "ssh", node, "--worker=all", *scope)
    steps.append(Step((*ssh, f"--command=mkdir -p {VM_DIR}")))
    copies = dict(learner_files(config))
    if install_is_local_wheel(opts):
        copies[opts.install] = os.path.basename(opts.install)
    for local, remote in copies.items():
        steps.append(Step(("gcloud", "compute", "tpus", "tpu-vm", "scp", local, f"{node}:{VM_DIR}/{remote}",
                           "--worker=all", *scope)))
    if tpu.hosts > 1:
        # A learner group needs a run directory every worker sees and actors on
        # every worker (`seedq launch k8s` renders both); the VMs here have
        # neither, so each worker's learner stays on its own (no auto-detected
        # group, which would wait for batches from workers without actors).
        config = dataclasses.replace(
            config, distributed=dataclasses.replace(config.distributed, auto_detect=False))
    steps.append(Step((*ssh, "--command=" + _start_learner_shell(config, opts, "jax[tpu]")),
                      comment="Install seedq and start the learner on every worker; the actors use "
                              "worker 0 (a multi-host learner group: seedq launch k8s, docs/devices.md)."))
    steps.append(Step(("gcloud", "compute", "tpus", "tpu-vm", "describe", node,
                       "--format=value(networkEndpoints[0].ipAddress)", *scope), capture="LEARNER_IP"))
    steps += _actor_steps(config, opts, f"${{LEARNER_IP}}:{opts.port}")
    return steps


def gpu_vm_plan(config: TrainConfig, opts: VmOptions) -> list[Step]:
    """Create the GPU VM, start the learner on it, then the actor group."""
    check_inputs(config, opts, "gpu")
    scope = _scope(opts)
    vm = f"{opts.name}-learner"
    steps = [
        Step(("gcloud", "compute", "instances", "create", vm, f"--machine-type={opts.machine_type}",
              f"--accelerator=type={opts.gpu_type},count={opts.gpus}", "--maintenance-policy=TERMINATE",
              f"--image-family={opts.image_family}", f"--image-project={opts.image_project}",
              "--boot-disk-size=200GB", "--metadata=install-nvidia-driver=True", f"--tags={opts.name}-learner",
              f"--network={opts.network}", *(["--provisioning-model=SPOT"] if opts.spot else []),
              *_learner_identity(opts), *scope)),
    ]
    ssh = ("gcloud", "compute", "ssh", vm, *scope)
    steps.append(Step((*ssh, f"--command=mkdir -p {VM_DIR}")))
    copies = dict(learner_files(config))
    if install_is_local_wheel(opts):
        copies[opts.install] = os.path.basename(opts.install)
    for local, remote in copies.items():
        steps.append(Step(("gcloud", "compute", "scp", local, f"{vm}:{VM_DIR}/{remote}", *scope)))
    steps.append(Step((*ssh, "--command=" + _start_learner_shell(config, opts, "jax[cuda12]")),
                      comment="Install seedq and start the learner."))
    steps.append(Step(("gcloud", "compute", "instances", "describe", vm,
                       "--format=value(networkInterfaces[0].networkIP)", *scope), capture="LEARNER_IP"))
    steps += _actor_steps(config, opts, f"${{LEARNER_IP}}:{opts.port}")
    return steps


def teardown_plan(config: TrainConfig, opts: VmOptions, kind: str) -> list[Step]:
    """Delete everything the plan created (actors first, so they stop dialling)."""
    scope = _scope(opts)
    project = ["--project", opts.project] if opts.project else []
    steps = [
        Step(("gcloud", "compute", "instance-groups", "managed", "delete", f"{opts.name}-actors", "--quiet", *scope)),
        Step(("gcloud", "compute", "instance-templates", "delete", f"{opts.name}-actor", "--quiet", *project)),
        Step(("gcloud", "compute", "firewall-rules", "delete", f"{opts.name}-learner", "--quiet", *project)),
    ]
    for secret in actor_secrets(config, opts):
        steps.append(Step(("gcloud", "secrets", "delete", secret, "--quiet", *project)))
    if not opts.project and (actor_secrets(config, opts) or uses_wheel_bucket(opts)):
        steps.append(Step(("gcloud", "config", "get-value", "project"), capture="PROJECT"))
    if uses_wheel_bucket(opts):
        steps.append(Step(("gcloud", "storage", "rm", "--recursive", wheel_bucket(opts), "--quiet")))
    if actor_secrets(config, opts) or uses_wheel_bucket(opts):
        steps.append(Step(("gcloud", "iam", "service-accounts", "delete", actor_service_account(opts),
                           "--quiet", *project)))
    if kind == "tpu":
        steps.append(Step(("gcloud", "compute", "tpus", "queued-resources", "delete", f"{opts.name}-qr",
                           "--force", "--quiet", *scope)))
    else:
        steps.append(Step(("gcloud", "compute", "instances", "delete", f"{opts.name}-learner", "--quiet", *scope)))
    return steps


def _money(hourly: float | None) -> str:
    return "price not known" if hourly is None else f"~${hourly:,.2f}/h"


def plan_summary(config: TrainConfig, opts: VmOptions, kind: str) -> list[str]:
    """What a launch creates, one resource a line with its hourly estimate,
    then the total (public on-demand list prices, seedq.launch.prices)."""
    from seedq.launch import prices
    from seedq.launch.tpu import tpu_slice

    lines, total, unknown = [], 0.0, False
    if kind == "tpu":
        tpu = tpu_slice(opts.tpu_type)
        hourly = prices.tpu_hourly(opts.tpu_type, tpu.chips)
        lines.append(f"TPU {opts.tpu_type} ({tpu.chips} chips, {tpu.hosts} host(s)) {opts.name}, queued resource "
                     f"{opts.name}-qr{' (spot)' if opts.spot else ''}: {_money(hourly)}")
    else:
        hourly = None  # GPU VM prices vary by type and region: not in the table
        lines.append(f"GPU VM {opts.name}-learner: {opts.machine_type} with {opts.gpus} x {opts.gpu_type}"
                     f"{' (spot)' if opts.spot else ''}: {_money(hourly)}")
    total += hourly or 0.0
    unknown |= hourly is None
    vms = actor_vms(config, opts)
    each = prices.machine_hourly(opts.actor_machine_type)
    group = None if each is None else each * vms
    lines.append(f"actor VMs: managed instance group {opts.name}-actors of {vms} x {opts.actor_machine_type} "
                 f"({config.num_actors} actor processes){' (spot)' if opts.spot else ''}: {_money(group)}")
    total += group or 0.0
    unknown |= group is None
    extras = [f"firewall rule {opts.name}-learner", f"instance template {opts.name}-actor"]
    if actor_secrets(config, opts) or uses_wheel_bucket(opts):
        extras.append(f"service account {opts.name}-actor")
    extras += [f"secret {name}" for name in actor_secrets(config, opts)]
    if uses_wheel_bucket(opts):
        extras.append(f"bucket {wheel_bucket(opts)} (the wheel)")
    lines.append("also: " + ", ".join(extras))
    estimate = f"~${total:,.2f}/h" + (" plus the resources whose price is not known" if unknown else "")
    spot = "; spot VMs cost less" if opts.spot else ""
    lines.append(f"estimate: {estimate} (on-demand list prices of us-central1, not a quote: regions, discounts "
                 f"and disks differ{spot})")
    return lines


def teardown_summary(steps: list[Step]) -> list[str]:
    """What a teardown deletes, one resource a line (from its delete commands)."""
    lines = []
    for step in steps:
        words = list(step.argv)
        if "delete" in words:
            at = words.index("delete")
            lines.append(" ".join(words[1:at]).replace("compute ", "") + " " + words[at + 1])
        elif words[1:3] == ["storage", "rm"]:
            lines.append(f"bucket {words[-2]} and its objects")
    return lines


def _shell_word(word: str) -> str:
    """Quoted for a POSIX shell; ${VAR} references stay expandable (double quotes)."""
    if "${" in word:
        return '"' + re.sub(r'(["\\`])', r"\\\1", word) + '"'
    return shlex.quote(word)


def to_shell(steps: list[Step]) -> str:
    """The plan as a shell script (what --dry-run prints)."""
    lines = ["#!/bin/bash", "set -euo pipefail"]
    for step in steps:
        if step.comment:
            lines.append("# " + step.comment)
        if step.write_path:
            lines += [f"cat > {shlex.quote(step.write_path)} <<'EOF'", step.write_text.rstrip("\n"), "EOF"]
        elif step.until:
            command = " ".join(_shell_word(w) for w in step.argv)
            lines.append(f'until [ "$({command})" = {shlex.quote(step.until)} ]; do sleep {POLL_SECONDS}; done')
        elif step.capture:
            lines.append(f"{step.capture}=$({' '.join(_shell_word(w) for w in step.argv)})")
        elif step.argv:
            lines.append(" ".join(_shell_word(w) for w in step.argv))
    return "\n".join(lines) + "\n"


def run_plan(steps: list[Step], log=print) -> int:
    """Runs the steps in order; at the first failure prints one line and returns its exit code."""
    values: dict[str, str] = {}
    for step in steps:
        if step.write_path:
            with open(step.write_path, "w") as f:
                f.write(step.write_text)
            continue
        if not step.argv:  # a comment only
            continue
        argv = [re.sub(r"\$\{(\w+)\}", lambda m: values.get(m.group(1), m.group(0)), w) for w in step.argv]
        log("+ " + shlex.join(argv))
        while True:
            try:
                result = subprocess.run(argv, stdout=subprocess.PIPE if step.capture or step.until else None,
                                        text=True)
            except FileNotFoundError:
                log(f"{argv[0]}: not found (install the Google Cloud CLI, or use --dry-run)")
                return 127
            if result.returncode != 0:
                log(f"failed (exit {result.returncode}): {shlex.join(argv)}")
                return result.returncode
            if not step.until or result.stdout.strip() == step.until:
                break
            if result.stdout.strip() in ("FAILED", "SUSPENDED"):
                log(f"state {result.stdout.strip()} (expected {step.until}): {shlex.join(argv)}")
                return 1
            time.sleep(POLL_SECONDS)
        if step.capture:
            values[step.capture] = result.stdout.strip()
    return 0
