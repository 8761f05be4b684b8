"""The learner's server and the actor channel: batching, TLS, token, keepalive."""

from __future__ import annotations

import dataclasses

from seedq.process.exit_codes import UsageError
from seedq.config.checks import check_channel, check_choice, check_non_negative, check_positive


# The inference batcher's rules (seedq.server.batching).
BATCHING_RULES = ("auto", "wait", "greedy")
# What the inference loop does when the unroll queue is full (ServerConfig.queue_full).
QUEUE_FULL_RULES = ("wait", "drop_oldest", "pace")


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """Central inference server (dynamic batcher) settings."""

    # Largest number of env steps run through one inference call.
    max_batch_size: int = 256
    # How long the batcher waits for more streams once it holds a request
    # (under the `wait` rule).
    batch_timeout_ms: float = 0.5
    # The batcher's rule: `wait` for the streams the last batch answered (up to
    # batch_timeout_ms), `greedy` (run what is queued at once), or `auto`: the
    # one that measured more env steps/s in this run, re-measured every minute
    # and when actors come or go (seedq.server.batching).
    batching: str = "auto"
    # Unrolls held between the server and the learner; when full, inference
    # waits for training (backpressure) instead of memory growing. The last
    # inference batch's unrolls may take it past this by one batch (a strict
    # bound could deadlock: seedq.server.unrolls.UnrollQueue).
    queue_capacity_unrolls: int = 256
    # When that queue is full: `wait` (backpressure: the actors go at the
    # learner's pace, and round trips wait for train steps), `drop_oldest`
    # (inference never waits; the oldest unrolls are dropped and the learner
    # trains on the freshest it can keep up with), or `pace`: from two learner
    # batches queued, the batch loop slows to the rate the learner takes
    # unrolls, so every round trip grows a little instead of one in a few
    # waiting out a train step, and the learner trains on fresh unrolls
    # (seedq.server.pacing; in IMPALA mode the acknowledgements of pushed
    # unrolls are paced alike); a full queue still waits. `pace` for pixel envs.
    queue_full: str = "wait"
    # Handshakes declaring more envs are refused (bounds learner memory).
    max_envs_per_actor: int = 4096
    # Env slots of all actors together: a handshake that would pass it is
    # refused with RESOURCE_EXHAUSTED (its actor retries). 0: sized to the
    # learner's memory for the observation and unroll length (1024 to 65536).
    max_envs: int = 0
    # Dead-peer detection (docs/security.md): a keepalive ping goes to each
    # actor connection every this many seconds.
    keepalive_seconds: float = 10.0
    # A connection that answers no ping, or a stream on which the learner waited
    # this long for the actor's next message, is closed: its env slots are
    # freed and its partial unrolls dropped.
    peer_timeout_seconds: float = 30.0
    # Also serve the standard gRPC health service alone, in plaintext, on this
    # TCP port of the learner's interface (every interface for a wildcard
    # address, loopback for a unix socket; 0: off): Kubernetes' gRPC probes cannot speak
    # TLS, and this port answers health checks only (no training RPC).
    health_port: int = 0
    # Processes that serve the actors' streams (gRPC, credentials, the health
    # service, handshakes, decoding), all on the learner's TCP port
    # (SO_REUSEPORT: the kernel spreads connections over them); they hand each
    # decoded step to the learner's process, which batches, acts and trains
    # (seedq.server.ingress). 1: the learner's process serves the streams itself.
    ingress_processes: int = 1

    def validate(self) -> None:
        check_positive({
            "server.max_batch_size": self.max_batch_size,
            "server.queue_capacity_unrolls": self.queue_capacity_unrolls,
            "server.ingress_processes": self.ingress_processes,
        })
        if self.ingress_processes > 1 and self.health_port:
            raise ValueError("server.health_port is served by one process: it needs server.ingress_processes=1")
        check_channel(self.keepalive_seconds, self.peer_timeout_seconds, "server.")
        check_batching_rule(self.batching)
        check_choice("server.queue_full", self.queue_full, QUEUE_FULL_RULES)
        check_non_negative({"server.batch_timeout_ms": self.batch_timeout_ms, "server.health_port": self.health_port,
                            "server.max_envs": self.max_envs})

    def check_address(self, address: str) -> None:
        """UsageError (one line) where the ingress processes cannot serve `address`."""
        if self.ingress_processes > 1 and address.startswith("unix:"):
            raise UsageError(f"server.ingress_processes={self.ingress_processes} needs a TCP address "
                             f"(--address host:port; bench ingress: --transport tcp), not {address}: "
                             "a unix socket is served by one process")


@dataclasses.dataclass(frozen=True)
class TlsConfig:
    """The learner's TLS files (paths only; the files hold the key material)."""

    # PEM certificate chain the learner presents (with `key`: TLS on).
    cert: str = ""
    # PEM private key of `cert`.
    key: str = ""
    # PEM CA that actor certificates must chain to (given: mutual TLS, actors without one are refused).
    client_ca: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.cert or self.key)

    def validate(self) -> None:
        if bool(self.cert) != bool(self.key):
            raise ValueError("tls.cert and tls.key go together (the learner's certificate and its key)")
        if self.client_ca and not self.enabled:
            raise ValueError("tls.client_ca needs tls.cert and tls.key (mutual TLS is TLS first)")


@dataclasses.dataclass(frozen=True)
class AuthConfig:
    """Bearer-token authentication on the actor channel."""

    # File holding the token (one line); every RPC must carry `authorization: Bearer <token>`.
    token_file: str = ""


@dataclasses.dataclass(frozen=True)
class ActorTlsConfig:
    """An actor's TLS files (paths only)."""

    # PEM CA that the learner's certificate must chain to (given: the actor dials with TLS).
    ca: str = ""
    # PEM client certificate for a learner that requires mutual TLS (with `key`).
    cert: str = ""
    # PEM private key of `cert`.
    key: str = ""
    # Expect this name in the learner's certificate instead of the host dialled.
    server_name: str = ""


@dataclasses.dataclass(frozen=True)
class ActorChannelConfig:
    """Flags of `seedq actor` and `seedq impala-actor`: how the channel to the
    learner is secured and kept alive (`--auth.token-file` as in `AuthConfig`;
    docs/security.md)."""

    tls: ActorTlsConfig = ActorTlsConfig()
    auth: AuthConfig = AuthConfig()
    # A keepalive ping goes to the learner every this many seconds.
    keepalive_seconds: float = 10.0
    # A ping unanswered after peer_timeout_seconds - keepalive_seconds means the
    # learner is gone: the actor reconnects (with backoff) until it is back.
    peer_timeout_seconds: float = 30.0

    def validate(self) -> None:
        check_channel(self.keepalive_seconds, self.peer_timeout_seconds, "")
        if bool(self.tls.cert) != bool(self.tls.key):
            raise ValueError("--tls.cert and --tls.key go together (a client certificate needs its key)")
        if self.tls.cert and not self.tls.ca:
            raise ValueError("--tls.cert needs --tls.ca (the CA that signed the learner's certificate)")


def check_batching_rule(rule: str) -> None:
    """ValueError unless `rule` is one of BATCHING_RULES (the config and the batcher both check)."""
    if rule not in BATCHING_RULES:
        raise ValueError(f"server.batching={rule!r}: choose one of {', '.join(BATCHING_RULES)}")
