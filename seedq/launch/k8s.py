"""`seedq launch k8s`: Kubernetes manifests for a run, rendered from its config.

    seedq launch k8s --accelerator tpu --tpu-type v5litepod-16 --image IMAGE [training flags] > run.yaml
    python -m seedq.launch.k8s --write launch/k8s     # regenerate the committed examples

What is rendered (core kinds only, so `kubernetes-validate` checks them offline):

- a ConfigMap holding the learner's run config as `config.json`; the learner
  starts with `seedq learner --config .../config.json --resume auto`, so a
  restarted (preempted) pod continues from the newest checkpoint by itself;
- the learner as an Indexed Job with a headless Service: one pod per TPU host
  (`seedq.launch.tpu`), stable DNS names `<name>-learner-<i>.<name>-learner`;
- the actors as Indexed Jobs (one pod per actor process; with a multi-host
  learner one Job per learner host, dialling that host's DNS name). An actor
  exits 0 when the learner tells it the run ended (docs/wire.md), which
  completes its index: the actors end with the run. (Deployments restart
  their pods for ever, and a learner that scales them to zero would need
  RBAC on the API server; a Job needs nothing.) An actor that finds no learner
  for ACTOR_RETRY_SECONDS exits 1, counted against the Job's backoffLimit;
- a PersistentVolumeClaim for the run directory.

Credentials are Secrets referenced by name (created with `kubectl create secret`,
launch/README.md), mounted read-only; no key material is ever rendered.

No RBAC objects: nothing here calls the Kubernetes API. On GKE TPU slices
`jax.distributed` finds its peers from the `TPU_WORKER_HOSTNAMES` /
`TPU_WORKER_ID` variables that GKE injects into Indexed Job pods with a
headless-Service subdomain; JAX's API-based Kubernetes detection (which would
need `get`/`list` on pods and jobs) only runs when the `kubernetes` package is
installed, which the image does not do. GPU and CPU learners are one pod.

Renders are deterministic: same flags, same bytes (no timestamps, sorted
config, an explicit run directory).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from seedq import extras

extras.require("launch", "yaml")

import yaml  # noqa: E402

from seedq.transport import channel
from seedq.process import exit_codes
from seedq import config as config_lib
from seedq.config import TrainConfig
from seedq.launch.options import K8sOptions
from seedq.launch.tpu import TpuSlice, tpu_slice

# Where the pods see their files.
CONFIG_DIR = "/etc/seedq/config"
TLS_DIR = "/etc/seedq/tls"
TOKEN_DIR = "/etc/seedq/token"
RUNS_DIR = "/runs"
# Keys inside the Secrets (kubectl create secret generic NAME --from-file=KEY=FILE).
TLS_CERT, TLS_KEY, TLS_CA = "tls.crt", "tls.key", "ca.crt"
TOKEN_KEY = "token"
# The image runs as this user (Dockerfile); fsGroup makes mounted files readable to it.
IMAGE_UID = 1000


# Fields of the run config that the render sets itself (from K8sOptions).
RENDER_OWNED = ("address", "tls.cert", "tls.key", "tls.client_ca", "auth.token_file")


def _labels(opts: K8sOptions, component: str) -> dict:
    return {
        "app.kubernetes.io/name": "seedq",
        "app.kubernetes.io/instance": opts.name,
        "app.kubernetes.io/component": component,
    }


def learner_slice(opts: K8sOptions) -> TpuSlice | None:
    return tpu_slice(opts.tpu_type) if opts.accelerator == "tpu" else None


def learner_hosts(opts: K8sOptions) -> int:
    tpu = learner_slice(opts)
    return tpu.hosts if tpu else 1


def run_dir(config: TrainConfig, opts: K8sOptions) -> str:
    """The run directory: the config's logdir, which must lie on the run volume."""
    logdir = config.logdir or f"{RUNS_DIR}/{opts.name}"
    if os.path.normpath(logdir) == RUNS_DIR or not os.path.normpath(logdir).startswith(RUNS_DIR + "/"):
        raise ValueError(f"--logdir {logdir}: must be a directory under {RUNS_DIR}/ (the run volume)")
    return logdir


def learner_config(config: TrainConfig, opts: K8sOptions) -> TrainConfig:
    """The run config the learner pods read: address, run directory and credential paths filled in."""
    tls = config_lib.TlsConfig()
    if opts.tls_mode != "none":
        tls = config_lib.TlsConfig(
            cert=f"{TLS_DIR}/{TLS_CERT}", key=f"{TLS_DIR}/{TLS_KEY}",
            client_ca=f"{TLS_DIR}/{TLS_CA}" if opts.tls_mode == "mutual" else "",
        )
    auth = config_lib.AuthConfig(token_file=f"{TOKEN_DIR}/{TOKEN_KEY}" if opts.token_secret else "")
    return dataclasses.replace(
        config, address=f"0.0.0.0:{opts.port}", logdir=run_dir(config, opts), tls=tls, auth=auth,
        server=dataclasses.replace(config.server, health_port=opts.health_port),
    )


def learner_host_name(opts: K8sOptions, index: int) -> str:
    """Stable DNS name of learner pod `index` (Indexed Job hostname + headless Service subdomain)."""
    return f"{opts.name}-learner-{index}.{opts.name}-learner"


def learner_command() -> list[str]:
    return ["seedq", "learner", "--config", f"{CONFIG_DIR}/config.json", "--resume", "auto"]


def actor_command(config: TrainConfig, opts: K8sOptions, host: int) -> list[str]:
    """One actor process dialling learner host `host`. $(POD_NAME) is expanded by Kubernetes."""
    command = "impala-actor" if config.architecture == "impala" else "actor"
    from seedq.flags import config_flags

    args = [
        "seedq", command,
        "--server", f"{learner_host_name(opts, host)}:{opts.port}",
        "--env", config.env,
        "--num-envs", str(config.envs_per_actor),
        # Stable across a pod's replacements (its completion index), so the
        # learner replaces the old run's state; it makes the env seeds differ.
        "--actor-id", f"{opts.name}-actor-{host}-$(JOB_COMPLETION_INDEX)",
        "--seed", str(config.seed * 1000 + host), "--seed-from-actor-id",
        "--retry-max-seconds", str(ACTOR_RETRY_SECONDS),
    ]
    args += config_flags(config.env_options, config_lib.EnvOptions)
    if opts.tls_mode != "none":
        args += ["--tls.ca", f"{TLS_DIR}/{TLS_CA}",
                 # The certificate names the Service; the pod DNS name differs per host.
                 "--tls.server-name", f"{opts.name}-learner"]
    if opts.tls_mode == "mutual":
        args += ["--tls.cert", f"{TLS_DIR}/{TLS_CERT}", "--tls.key", f"{TLS_DIR}/{TLS_KEY}"]
    if opts.token_secret:
        args += ["--auth.token-file", f"{TOKEN_DIR}/{TOKEN_KEY}"]
    return args


def _secret_volumes(opts: K8sOptions, tls_secret: str) -> tuple[list, list]:
    """Volumes and read-only mounts of the TLS and token Secrets (files mode 0440, group IMAGE_UID)."""
    volumes, mounts = [], []
    if opts.tls_mode != "none":
        volumes.append({"name": "tls", "secret": {"secretName": tls_secret, "defaultMode": 0o440}})
        mounts.append({"name": "tls", "mountPath": TLS_DIR, "readOnly": True})
    if opts.token_secret:
        volumes.append({"name": "token", "secret": {"secretName": opts.token_secret, "defaultMode": 0o440}})
        mounts.append({"name": "token", "mountPath": TOKEN_DIR, "readOnly": True})
    return volumes, mounts


def _pod_security() -> dict:
    return {"runAsNonRoot": True, "runAsUser": IMAGE_UID, "runAsGroup": IMAGE_UID, "fsGroup": IMAGE_UID}


def _probes(opts: K8sOptions) -> dict:
    """Kubernetes' native gRPC probe asks the standard health service (grpc.health.v1).
    The kubelet's gRPC probe cannot speak TLS (Kubernetes 1.30), so it asks the
    learner's plaintext health-only port (server.health_port), whatever the
    actor channel's credentials."""
    check = {"grpc": {"port": opts.health_port}}
    return {
        # JAX start-up and the first compile happen before the server listens: up to 10 minutes.
        "startupProbe": {**check, "periodSeconds": 10, "failureThreshold": 60},
        "readinessProbe": {**check, "periodSeconds": 10},
        "livenessProbe": {**check, "periodSeconds": 20, "timeoutSeconds": 5, "failureThreshold": 3},
    }


def config_map(config: TrainConfig, opts: K8sOptions) -> dict:
    text = json.dumps(config_lib.to_dict(learner_config(config, opts)), indent=2, sort_keys=True) + "\n"
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": f"{opts.name}-config", "labels": _labels(opts, "config")},
        "data": {"config.json": text},
    }


def run_volume_claim(opts: K8sOptions) -> dict:
    spec = {
        # Every learner host mounts the run directory: several nodes need ReadWriteMany.
        "accessModes": ["ReadWriteMany" if learner_hosts(opts) > 1 else "ReadWriteOnce"],
        "resources": {"requests": {"storage": opts.storage}},
    }
    if opts.storage_class:
        spec["storageClassName"] = opts.storage_class
    return {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": f"{opts.name}-runs", "labels": _labels(opts, "runs")},
        "spec": spec,
    }


def learner_service(opts: K8sOptions) -> dict:
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": f"{opts.name}-learner", "labels": _labels(opts, "learner")},
        "spec": {
            "clusterIP": "None",  # headless: one DNS name per learner pod
            # Peers and actors resolve a learner pod before it is ready
            # (jax.distributed meets its peers during start-up).
            "publishNotReadyAddresses": True,
            "selector": _labels(opts, "learner"),
            "ports": [{"name": "grpc", "port": opts.port, "targetPort": opts.port, "protocol": "TCP"}],
        },
    }


def _learner_placement(opts: K8sOptions) -> dict:
    """Resources, node selector and tolerations of a learner pod."""
    requests = {"cpu": opts.learner_cpu, "memory": opts.learner_memory}
    tpu = learner_slice(opts)
    if tpu:
        return {
            "resources": {"requests": requests, "limits": {"google.com/tpu": tpu.chips_per_host}},
            "nodeSelector": {
                "cloud.google.com/gke-tpu-accelerator": tpu.gke_accelerator,
                "cloud.google.com/gke-tpu-topology": tpu.topology,
            },
            "tolerations": [{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}],
        }
    if opts.accelerator == "gpu":
        placement = {
            "resources": {"requests": requests, "limits": {"nvidia.com/gpu": opts.gpus}},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        }
        if opts.gpu_type:
            placement["nodeSelector"] = {"cloud.google.com/gke-accelerator": opts.gpu_type}
        return placement
    return {"resources": {"requests": requests}}


def learner_job(config: TrainConfig, opts: K8sOptions) -> dict:
    hosts = learner_hosts(opts)
    placement = _learner_placement(opts)
    volumes, mounts = _secret_volumes(opts, opts.learner_tls_secret)
    container = {
        "name": "learner",
        "image": opts.image,
        "command": learner_command(),
        "ports": [
            {"name": "grpc", "containerPort": opts.port, "protocol": "TCP"},
            {"name": "health", "containerPort": opts.health_port, "protocol": "TCP"},
        ],
        "resources": placement["resources"],
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "runs", "mountPath": RUNS_DIR},
            *mounts,
        ],
        **_probes(opts),
    }
    pod_spec = {
        "subdomain": f"{opts.name}-learner",  # with the headless Service: stable per-pod DNS names
        "restartPolicy": "Never",  # a failed pod is replaced; --resume auto continues the run
        # SIGTERM (preemption, kubectl delete) makes the learner checkpoint before exiting.
        "terminationGracePeriodSeconds": 120,
        "securityContext": _pod_security(),
        "containers": [container],
        "volumes": [
            {"name": "config", "configMap": {"name": f"{opts.name}-config"}},
            {"name": "runs", "persistentVolumeClaim": {"claimName": f"{opts.name}-runs"}},
            *volumes,
        ],
    }
    for key in ("nodeSelector", "tolerations"):
        if key in placement:
            pod_spec[key] = placement[key]
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": f"{opts.name}-learner", "labels": _labels(opts, "learner")},
        "spec": {
            "completionMode": "Indexed",  # pod i is learner host i (TPU_WORKER_ID on GKE TPU)
            "completions": hosts,
            "parallelism": hosts,
            "backoffLimit": 20,
            "podFailurePolicy": learner_failure_policy(),
            "template": {"metadata": {"labels": _labels(opts, "learner")}, "spec": pod_spec},
        },
    }


def learner_failure_policy() -> dict:
    """How the learner Job treats a pod that ended (seedq.process.exit_codes):

    * preempted, evicted or its node drained (the DisruptionTarget condition),
      or stopped by SIGTERM / SIGINT after its checkpoint (exit 143 / 130, e.g.
      `kubectl delete pod`): replaced without counting against backoffLimit;
      the new pod continues the run (--resume auto);
    * a usage or config error (exit 2): the Job fails at once, since every
      retry would fail the same way;
    * anything else (1: a runtime failure, 3: a lost group member) counts
      against backoffLimit and is retried.
    Exit 0 (the run met its stop condition) completes the pod's index."""
    learner = {"containerName": "learner", "operator": "In"}
    return {"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "FailJob", "onExitCodes": {**learner, "values": [exit_codes.USAGE]}},
        {"action": "Ignore", "onExitCodes": {**learner, "values": [exit_codes.INTERRUPTED, exit_codes.TERMINATED]}},
    ]}


def actor_replicas(num_actors: int, hosts: int) -> list[int]:
    """Actor processes per learner host: as even as possible, the first hosts get the remainder."""
    base, extra = divmod(num_actors, hosts)
    return [base + (1 if i < extra else 0) for i in range(hosts)]


# An actor with no learner for this long exits 1 (a learner restart, even one
# waiting for TPU capacity, is normally shorter; a run that ended while the
# actor was away is over): once every actor has, the Job fails and stops.
ACTOR_RETRY_SECONDS = 3600


def actor_failure_policy() -> dict:
    """How an actor Job treats a pod that ended (seedq.process.exit_codes): exit 0 (the
    learner said the run ended) completes its index; preempted or evicted
    (DisruptionTarget): replaced without counting; refused by the learner
    (exit 2: credentials, another env): the Job fails at once; anything else
    (1: no learner for ACTOR_RETRY_SECONDS) counts against backoffLimit."""
    actor = {"containerName": "actor", "operator": "In"}
    return {"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "FailJob", "onExitCodes": {**actor, "values": [exit_codes.USAGE]}},
    ]}


def actor_job(config: TrainConfig, opts: K8sOptions, host: int, replicas: int) -> dict:
    hosts = learner_hosts(opts)
    name = f"{opts.name}-actors" if hosts == 1 else f"{opts.name}-actors-{host}"
    labels = {**_labels(opts, "actor"), "seedq.dev/learner-host": str(host)}
    volumes, mounts = _secret_volumes(opts, opts.actor_tls_secret)
    away_from_learner = {
        "labelSelector": {"matchLabels": _labels(opts, "learner")},
        "topologyKey": "kubernetes.io/hostname",
    }
    if opts.accelerator == "cpu":
        # A CPU learner may share a node with actors when the cluster is small.
        anti_affinity = {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": away_from_learner}]}
    else:
        # Accelerator nodes' CPUs feed the accelerator; actors go elsewhere.
        anti_affinity = {"requiredDuringSchedulingIgnoredDuringExecution": [away_from_learner]}
    container = {
        "name": "actor",
        "image": opts.image,
        "command": actor_command(config, opts, host),
        "env": [{"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}],
        "resources": {"requests": {"cpu": opts.actor_cpu, "memory": opts.actor_memory}},
        "volumeMounts": mounts,
    }
    pod_spec = {
        "restartPolicy": "Never",  # a failed pod is replaced (podFailurePolicy needs Never)
        "securityContext": _pod_security(),
        "affinity": {"podAntiAffinity": anti_affinity},
        "containers": [container],
        "volumes": volumes,
    }
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "completionMode": "Indexed",  # index i: actor process i of this learner host
            "completions": replicas,
            "parallelism": replicas,
            "backoffLimit": replicas,
            "podFailurePolicy": actor_failure_policy(),
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def render_objects(config: TrainConfig, opts: K8sOptions) -> list[dict]:
    """Every object of the run, in apply order. ValueError (one line) on bad input."""
    opts.validate()
    config.validate()
    hosts = learner_hosts(opts)
    if not (config.insecure or channel.authenticates_clients(
            client_ca=opts.tls_mode == "mutual", token=bool(opts.token_secret))):
        raise ValueError(channel.unauthenticated_exposure(
            "the learner Service", "give --tls-mode mutual (a client CA) and/or --token-secret NAME"))
    objects = [config_map(config, opts), run_volume_claim(opts), learner_service(opts), learner_job(config, opts)]
    for host, replicas in enumerate(actor_replicas(config.num_actors, hosts)):
        objects.append(actor_job(config, opts, host, replicas))
    return objects


class _Dumper(yaml.SafeDumper):
    """Block style, long strings kept on one line, multi-line strings (config.json)
    as literal blocks, and no &anchors/*aliases for repeated label maps."""

    def ignore_aliases(self, data) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, text: str):
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_Dumper.add_representer(str, _str)


def to_yaml(objects: list[dict]) -> str:
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1 << 16)


def render(config: TrainConfig, opts: K8sOptions) -> str:
    return to_yaml(render_objects(config, opts))


# --- the committed examples (launch/k8s/) ---

EXAMPLE_IMAGE = "us-docker.pkg.dev/PROJECT/seedq/seedq:0.1.0"


def examples() -> dict[str, tuple[TrainConfig, K8sOptions]]:
    """file name -> what it renders. The test suite compares these with launch/k8s/."""
    # Pong's defaults are the pixel ones, as `seedq launch k8s --env ALE/Pong-v5` resolves them.
    pixel_defaults = config_lib.defaults_for(continuous_actions=False, pixels=True)
    pong = dataclasses.replace(
        pixel_defaults, env="ALE/Pong-v5", num_actors=16, envs_per_actor=32,
        target_return=20.0, max_seconds=14400.0,
        vtrace=dataclasses.replace(pixel_defaults.vtrace, network="impala_cnn", unroll_length=20,
                                   batch_size=32, learning_rate=6e-4),
        server=dataclasses.replace(pixel_defaults.server, max_batch_size=1024),
    )
    return {
        "tpu-v5litepod-16.yaml": (
            dataclasses.replace(pong, logdir="/runs/pong-tpu"),
            K8sOptions(accelerator="tpu", tpu_type="v5litepod-16", image=EXAMPLE_IMAGE,
                       name="pong-tpu", storage_class="standard-rwx"),  # GKE Filestore (ReadWriteMany)
        ),
        "gpu.yaml": (
            dataclasses.replace(pong, logdir="/runs/pong-gpu"),
            K8sOptions(accelerator="gpu", gpus=1, gpu_type="nvidia-l4", image=EXAMPLE_IMAGE, name="pong-gpu",
                       tls_mode="none"),
        ),
        "cpu.yaml": (
            # CartPole's registered reward_threshold, as `seedq train --env CartPole-v1` takes it.
            dataclasses.replace(TrainConfig(), num_actors=4, target_return=475.0, logdir="/runs/cartpole"),
            K8sOptions(accelerator="cpu", image=EXAMPLE_IMAGE, name="cartpole", tls_mode="none",
                       learner_cpu="2", learner_memory="4Gi"),
        ),
    }


def example_command(file_name: str) -> str:
    """The `seedq launch k8s` command line that renders an example."""
    from seedq.flags import config_flags

    config, opts = examples()[file_name]
    words = ["seedq", "launch", "k8s"] + config_flags(opts, K8sOptions) + config_flags(config)
    return " ".join(words)


def example_files() -> dict[str, str]:
    return {
        name: f"# Rendered by: {example_command(name)}\n"
        "# Regenerate all examples: python -m seedq.launch.k8s --write launch/k8s\n"
        + render(config, opts)
        for name, (config, opts) in examples().items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seedq.launch.k8s", description="write the example renders")
    parser.add_argument("--write", metavar="DIR", required=True, help="directory to write the examples to")
    args = parser.parse_args(argv)
    os.makedirs(args.write, exist_ok=True)
    for name, text in example_files().items():
        with open(os.path.join(args.write, name), "w") as f:
            f.write(text)
        print(os.path.join(args.write, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
