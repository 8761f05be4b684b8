"""Range checks the config sections share; each raises ValueError naming the field."""

from __future__ import annotations

# Torsos the agents can build (VTraceConfig.network, R2D2Config.network).
NETWORK_CHOICES = ("auto", "mlp", "small_cnn", "nature_cnn", "impala_cnn")


def check_positive(values: dict) -> None:
    """ValueError for the first {name: value} that is not > 0."""
    for name, value in values.items():
        if value <= 0:
            raise ValueError(f"{name}={value}: must be > 0")


def check_non_negative(values: dict) -> None:
    """ValueError for the first {name: value} that is < 0."""
    for name, value in values.items():
        if value < 0:
            raise ValueError(f"{name}={value}: must be >= 0")


def check_unit_interval(values: dict) -> None:
    """ValueError for the first {name: value} outside [0, 1]."""
    for name, value in values.items():
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name}={value}: must be in [0, 1]")


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    """ValueError unless `value` is one of `choices`."""
    if value not in choices:
        raise ValueError(f"{name}={value!r}: choose one of {', '.join(choices)}")


def check_channel(keepalive_seconds: float, peer_timeout_seconds: float, prefix: str) -> None:
    """ValueError unless 0 < keepalive < peer timeout (a ping must fit in the timeout)."""
    if keepalive_seconds <= 0:
        raise ValueError(f"{prefix}keepalive_seconds={keepalive_seconds}: must be > 0")
    if peer_timeout_seconds <= keepalive_seconds:
        raise ValueError(
            f"{prefix}peer_timeout_seconds={peer_timeout_seconds}: must be > "
            f"{prefix}keepalive_seconds={keepalive_seconds} (a ping needs time to be answered)"
        )
