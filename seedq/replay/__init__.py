"""Replay memory held by the learner (prioritized sequence replay for R2D2)."""


def check_replay_fits(capacity: int, sequence_bytes: int, copies: int, available: int | None) -> None:
    """ValueError (one line, naming r2d2.replay_capacity and the capacity that
    fits) when `copies` replays of `capacity` sequences of `sequence_bytes`
    exceed `available` bytes. The replay is allocated lazily, so without this
    an oversized one is killed for memory hours into a run."""
    if available is None:
        return
    needed = capacity * sequence_bytes * copies
    if needed > available:
        fits = available // (sequence_bytes * copies)
        raise ValueError(
            f"r2d2.replay_capacity={capacity}: {capacity} sequences of {sequence_bytes / 1e3:.0f} KB"
            f"{' x ' + str(copies) + ' (the replay and its checkpoint copy)' if copies > 1 else ''} need "
            f"{needed / 1e9:.1f} GB, and {available / 1e9:.1f} GB of memory is available: "
            f"at most {fits} fit (or --r2d2.checkpoint-replay false)"
        )
