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
import time

from seedq import channel
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


def _local_wheel(opts: VmOptions) -> bool:
    return os.path.isfile(opts.install)


def install_source(opts: VmOptions) -> str:
    """What the VMs `pip install`: the package pinned to this seedq's version
    by default (actors and learner of one version, not whatever the index has
    at a VM's boot), or the wheel or URL given."""
    if _local_wheel(opts):
        return f"{VM_DIR}/{os.path.basename(opts.install)}"
    if opts.install == "seedq":
        import seedq

        return f"seedq=={seedq.__version__}"
    return opts.install


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


def _start_learner_shell(config: TrainConfig, opts: VmOptions, jax_extra: str) -> str:
    """What runs over ssh on each learner host: install, then the learner in the background."""
    learner = shlex.join(learner_command(config, opts))
    # scp leaves the copied credentials world-readable (umask): only the ssh user may read them.
    private = " ".join(f"{VM_DIR}/{name}" for name in learner_files(config).values())
    return (
        "set -e; sudo apt-get update -q && sudo apt-get install -yq python3-venv; "
        + (f"chmod 0600 {private}; " if private else "")
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
    return "\n".join([
        "#!/bin/bash",
        "# Startup script of the seedq actor VMs (rendered by `seedq launch`); runs as root at every boot.",
        "# It installs seedq once (the pinned version), and runs the actors as an unprivileged user.",
        "set -euo pipefail",
        f"INSTALLED={shlex.quote(install_source(opts))}",
        'if [ "$(cat /opt/seedq/installed 2>/dev/null)" != "$INSTALLED" ]; then',
        "  apt-get update -q && apt-get install -yq python3-venv",
        "  python3 -m venv /opt/seedq",
        "  " + _install_words(opts, "/opt/seedq/bin/pip", ""),
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
    if secrets:
        if not opts.project:
            steps.append(Step(("gcloud", "config", "get-value", "project"), capture="PROJECT"))
        steps.append(Step(("gcloud", "iam", "service-accounts", "create", f"{opts.name}-actor",
                           "--display-name=seedq actors (reads the run's secrets only)", *project)))
    for secret, (path, _) in secrets.items():
        steps.append(Step(("gcloud", "secrets", "create", secret, f"--data-file={path}", *project)))
        steps.append(Step(("gcloud", "secrets", "add-iam-policy-binding", secret,
                           f"--member=serviceAccount:{account}", "--role=roles/secretmanager.secretAccessor",
                           *project)))
    # Secret Manager's API takes the cloud-platform scope only; the account's
    # single role is the bound. Without secrets the VMs get no account at all.
    identity = ([f"--service-account={account}", "--scopes=cloud-platform"] if secrets
                else ["--no-service-account", "--no-scopes"])
    steps += [
        Step(("gcloud", "compute", "firewall-rules", "create", f"{opts.name}-learner", f"--network={opts.network}",
              f"--allow=tcp:{opts.port}", f"--source-tags={opts.name}-actor", f"--target-tags={opts.name}-learner",
              *project),
             comment="Only the actor VMs reach the learner port."),
        Step(write_path=script_path, write_text=actor_startup_script(config, opts)),
        Step(("gcloud", "compute", "instance-templates", "create", f"{opts.name}-actor",
              f"--machine-type={opts.actor_machine_type}", "--image-family=debian-12", "--image-project=debian-cloud",
              *identity, f"--tags={opts.name}-actor", f"--network={opts.network}",
              f"--metadata=seedq-learner={address}", f"--metadata-from-file=startup-script={script_path}",
              *(["--provisioning-model=SPOT"] if opts.spot else []), *project)),
        Step(("gcloud", "compute", "instance-groups", "managed", "create", f"{opts.name}-actors",
              f"--template={opts.name}-actor", f"--size={actor_vms(config, opts)}", *scope),
             comment=f"{config.num_actors} actor processes (--num-actors; docs/scaling.md gives the count "
                     f"one learner can feed): {actor_vms(config, opts)} VMs of "
                     f"{opts.actor_processes_per_vm}. Scale with: gcloud compute instance-groups managed "
                     f"resize {opts.name}-actors --size=N --zone={opts.zone}"),
    ]
    return steps


def check_credentials(config: TrainConfig) -> None:
    if not (config.insecure or channel.authenticates_clients(
            client_ca=bool(config.tls.client_ca), token=bool(config.auth.token_file))):
        raise ValueError(channel.unauthenticated_exposure(
            "the learner on its VM's network",
            "give a token (--auth.token-file FILE) and/or a client CA (--tls.client-ca with --tls.cert/--tls.key)"))
    for path in learner_files(config):
        if not os.path.isfile(path):
            raise ValueError(f"{path}: no such file (a credential to copy to the VMs)")


def tpu_vm_plan(config: TrainConfig, opts: VmOptions) -> list[Step]:
    """Create the TPU VM (queued resource), start the learner on every worker, then the actor group."""
    from seedq.launch.tpu import tpu_slice

    opts.validate("tpu")
    config.validate()
    tpu = tpu_slice(opts.tpu_type)
    check_credentials(config)
    scope = _scope(opts)
    node = opts.name
    capacity = ["--spot"] if opts.spot else ["--reserved"] if opts.reserved else []
    steps = [
        Step(("gcloud", "compute", "tpus", "queued-resources", "create", f"{node}-qr", f"--node-id={node}",
              f"--accelerator-type={opts.tpu_type}", f"--runtime-version={opts.runtime_version or RUNTIME_VERSIONS[opts.tpu_type.split('-')[0]]}",
              f"--tags={opts.name}-learner", f"--network={opts.network}", *capacity, *scope),
             comment=f"{opts.tpu_type}: {tpu.chips} chips, {tpu.hosts} host(s). The queued resource "
                     "waits for capacity; the next steps need it ACTIVE."),
        Step(("gcloud", "compute", "tpus", "queued-resources", "describe", f"{node}-qr", "--format=value(state.state)",
              *scope), until="ACTIVE"),
    ]
    ssh = ("gcloud", "compute", "tpus", "tpu-vm", "ssh", node, "--worker=all", *scope)
    steps.append(Step((*ssh, f"--command=mkdir -p {VM_DIR}")))
    copies = dict(learner_files(config))
    if _local_wheel(opts):
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
    opts.validate("gpu")
    config.validate()
    check_credentials(config)
    scope = _scope(opts)
    vm = f"{opts.name}-learner"
    steps = [
        Step(("gcloud", "compute", "instances", "create", vm, f"--machine-type={opts.machine_type}",
              f"--accelerator=type={opts.gpu_type},count={opts.gpus}", "--maintenance-policy=TERMINATE",
              f"--image-family={opts.image_family}", f"--image-project={opts.image_project}",
              "--boot-disk-size=200GB", "--metadata=install-nvidia-driver=True", f"--tags={opts.name}-learner",
              f"--network={opts.network}", *(["--provisioning-model=SPOT"] if opts.spot else []), *scope)),
    ]
    ssh = ("gcloud", "compute", "ssh", vm, *scope)
    steps.append(Step((*ssh, f"--command=mkdir -p {VM_DIR}")))
    copies = dict(learner_files(config))
    if _local_wheel(opts):
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
    if actor_secrets(config, opts):
        if not opts.project:
            steps.append(Step(("gcloud", "config", "get-value", "project"), capture="PROJECT"))
        steps.append(Step(("gcloud", "iam", "service-accounts", "delete", actor_service_account(opts),
                           "--quiet", *project)))
    if kind == "tpu":
        steps.append(Step(("gcloud", "compute", "tpus", "queued-resources", "delete", f"{opts.name}-qr",
                           "--force", "--quiet", *scope)))
    else:
        steps.append(Step(("gcloud", "compute", "instances", "delete", f"{opts.name}-learner", "--quiet", *scope)))
    return steps


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
