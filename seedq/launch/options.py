"""The launchers' own options (flags of `seedq launch ...`), apart from the run config.

Plain dataclasses like seedq.config's: the CLI derives one flag per field and
the comment above a field is its help. Kept free of heavy imports, since
every `seedq` command builds the parser.
"""

from __future__ import annotations

import dataclasses
import re

from seedq.launch.tpu import tpu_slice

ACCELERATORS = ("tpu", "gpu", "cpu")
TLS_MODES = ("none", "server", "mutual")
# TPU software versions (Cloud TPU "TPU software versions" page) per generation.
RUNTIME_VERSIONS = {"v4": "tpu-ubuntu2204-base", "v5litepod": "v2-alpha-tpuv5-lite",
                    "v5p": "v2-alpha-tpuv5", "v6e": "v2-alpha-tpuv6e"}


@dataclasses.dataclass(frozen=True)
class K8sOptions:
    """What the manifests need besides the run config (`seedq launch k8s` flags)."""

    # Learner hardware: tpu (a GKE TPU slice), gpu (one node's GPUs) or cpu.
    accelerator: str = ""
    # Cloud TPU type, e.g. v5litepod-16 (with --accelerator tpu).
    tpu_type: str = ""
    # GPUs of the learner pod (with --accelerator gpu).
    gpus: int = 1
    # GKE GPU node label cloud.google.com/gke-accelerator, e.g. nvidia-l4 ("" : any GPU node).
    gpu_type: str = ""
    # Container image with seedq installed (Dockerfile), e.g. us-docker.pkg.dev/PROJECT/seedq/seedq:0.1.0.
    image: str = ""
    # Prefix of every object's name.
    name: str = "seedq"
    # Port the learner serves actors on.
    port: int = 50051
    # Plaintext port that answers gRPC health checks only (server.health_port):
    # the kubelet's gRPC probes cannot speak TLS.
    health_port: int = 50052
    # Actor channel: mutual (learner and actor certificates), server (learner
    # certificate only) or none; see the note on probes in launch/README.md.
    tls_mode: str = "mutual"
    # Secret with tls.crt, tls.key (the learner's certificate) and ca.crt.
    learner_tls_secret: str = "seedq-learner-tls"
    # Secret with ca.crt (and tls.crt, tls.key: the actors' client certificate for mutual TLS).
    actor_tls_secret: str = "seedq-actor-tls"
    # Secret with the bearer token under the key `token` ("" : no token).
    token_secret: str = "seedq-token"
    # PersistentVolumeClaim size for the run directory.
    storage: str = "20Gi"
    # StorageClass of the run volume ("" : the cluster default; a multi-host
    # learner needs one that supports ReadWriteMany, e.g. GKE Filestore).
    storage_class: str = ""
    # CPU request of each learner pod (TPU hosts have many more cores).
    learner_cpu: str = "8"
    # Memory request of each learner pod.
    learner_memory: str = "32Gi"
    # CPU request of each actor pod (one actor process each).
    actor_cpu: str = "1"
    # Memory request of each actor pod.
    actor_memory: str = "1Gi"

    def validate(self) -> None:
        if self.accelerator not in ACCELERATORS:
            raise ValueError(f"--accelerator {self.accelerator or '(missing)'}: choose one of {', '.join(ACCELERATORS)}")
        if self.accelerator == "tpu":
            tpu_slice(self.tpu_type)
        elif self.tpu_type:
            raise ValueError(f"--tpu-type needs --accelerator tpu (got --accelerator {self.accelerator})")
        if self.accelerator == "gpu" and self.gpus <= 0:
            raise ValueError(f"--gpus {self.gpus}: must be > 0")
        # Pod hostnames are <name>-learner-<index>: a DNS label of at most 63 characters.
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?", self.name):
            raise ValueError(f"--name {self.name!r}: up to 40 lower-case letters, digits and dashes (a DNS label)")
        if not self.image:
            raise ValueError("--image is required (an image with seedq installed; see the Dockerfile)")
        if self.tls_mode not in TLS_MODES:
            raise ValueError(f"--tls-mode {self.tls_mode}: choose one of {', '.join(TLS_MODES)}")
        for flag, port in (("--port", self.port), ("--health-port", self.health_port)):
            if not 0 < port < 65536:
                raise ValueError(f"{flag} {port}: must be in 1..65535")
        if self.health_port == self.port:
            raise ValueError(f"--health-port {self.health_port}: must differ from --port")



@dataclasses.dataclass(frozen=True)
class VmOptions:
    """Where and how to run (flags of `seedq launch tpu-vm` and `seedq launch gpu-vm`)."""

    # Prefix of every resource's name (VM, queued resource, template, group, secrets, firewall rule).
    name: str = "seedq"
    # Compute zone, e.g. us-central2-b (required).
    zone: str = ""
    # Project ("" : gcloud's configured project).
    project: str = ""
    # What the VMs `pip install`: "" builds a wheel of this seedq checkout
    # (into --wheel-dir) and copies it to the VMs (the actors fetch it from a
    # Cloud Storage bucket of the run); or a local wheel file (copied the
    # same way), a package spec from the index (seedq==0.1.0), or a wheel URL.
    install: str = ""
    # Where the wheel of the checkout is built (relative: to the current directory).
    wheel_dir: str = "dist"
    # Service account of the learner VM ("" : the project's default compute
    # account). When the run ends it resizes the actor group to zero, which
    # needs compute.instanceGroupManagers.update (roles/compute.instanceAdmin.v1).
    learner_service_account: str = ""
    # Port the learner serves actors on.
    port: int = 50051
    # Network of the VMs and the firewall rule.
    network: str = "default"
    # Machine type of the actor VMs.
    actor_machine_type: str = "n2-standard-32"
    # Actor processes per VM: the group has ceil(num_actors / this) VMs.
    actor_processes_per_vm: int = 30
    # TPU accelerator type (v5litepod-16, v4-8, v5p-8, v6e-8, ...).
    tpu_type: str = "v5litepod-8"
    # TPU software version ("" : the generation's base image: v2-alpha-tpuv5-lite,
    # tpu-ubuntu2204-base for v4, v2-alpha-tpuv5 for v5p, v2-alpha-tpuv6e).
    runtime_version: str = ""
    # Machine type of the GPU learner VM.
    machine_type: str = "g2-standard-16"
    # GPU accelerator type of the learner VM (gcloud --accelerator type=...).
    gpu_type: str = "nvidia-l4"
    # GPUs on the learner VM.
    gpus: int = 1
    # Boot image family of the GPU VM (a Deep Learning VM image with the NVIDIA driver).
    image_family: str = "common-cu128-ubuntu-2204-nvidia-570"
    # Project of that image family.
    image_project: str = "deeplearning-platform-release"
    # Spot (preemptible) VMs; the learner resumes with --resume auto when recreated.
    spot: bool = False
    # TPU: use the project's reservation (queued-resources --reserved).
    reserved: bool = False
    # File here: the CA the actors trust (the learner's own TLS files are --tls.cert/--tls.key/--tls.client-ca).
    actor_tls_ca: str = ""
    # File here: the client certificate the actors present (mutual TLS).
    actor_tls_cert: str = ""
    # File here: the key of --actor-tls-cert.
    actor_tls_key: str = ""
    # Name the actors expect in the learner's certificate (they dial its IP address).
    tls_server_name: str = ""

    def validate(self, kind: str) -> None:
        if not self.zone:
            raise ValueError("--zone is required (e.g. --zone us-central2-b)")
        # <name>-actor also names the actors' service account: 6 to 30 characters.
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,22}[a-z0-9])?", self.name):
            raise ValueError(f"--name {self.name!r}: up to 24 lower-case letters, digits and dashes "
                             "(GCE resource and service account names)")
        if self.spot and self.reserved:
            raise ValueError("--spot and --reserved exclude each other")
        if self.reserved and kind != "tpu":
            raise ValueError("--reserved is for TPU queued resources (GPU VMs: use a reservation affinity by hand)")
        if self.actor_processes_per_vm <= 0:
            raise ValueError(f"--actor-processes-per-vm {self.actor_processes_per_vm}: must be > 0")
        if kind == "gpu" and self.gpus <= 0:
            raise ValueError(f"--gpus {self.gpus}: must be > 0")
        if bool(self.actor_tls_cert) != bool(self.actor_tls_key):
            raise ValueError("--actor-tls-cert and --actor-tls-key go together")
