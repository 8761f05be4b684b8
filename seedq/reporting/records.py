"""The run's records of its scalars, fed together: TensorBoard, curves.csv /
curves.png (`seedq.reporting.curves`) and, with `--wandb.project`, Weights &
Biases (`seedq.reporting.wandb_sink`). Process 0 of a run alone keeps them."""

from __future__ import annotations


class RunRecords:
    """Passes every call on to each of its sinks, in order."""

    def __init__(self, sinks: list):
        self.sinks = list(sinks)

    def tick(self, tick) -> None:
        for sink in self.sinks:
            sink.tick(tick)

    def curve_point(self, tick) -> None:
        """A deterministic run's curve row (seedq.reporting.curves), taken at a fixed frame count."""
        for sink in self.sinks:
            if hasattr(sink, "point"):
                sink.point(tick)

    def evaluation(self, result: dict, step: int) -> None:
        for sink in self.sinks:
            sink.evaluation(result, step)

    def flush(self) -> None:
        for sink in self.sinks:
            sink.flush()

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def run_records(config, tensorboard, *, resumed_frames: int | None) -> RunRecords:
    """`tensorboard` (a TensorBoardSink) plus curves and, when configured, W&B.
    `resumed_frames`: the checkpoint's frames of a resumed run, else None."""
    from seedq.reporting.curves import CurvesSink

    sinks = [tensorboard, CurvesSink(config.logdir, resumed_frames=resumed_frames,
                                     from_ticks=not config.deterministic)]
    if config.wandb.project:
        from seedq.reporting.wandb_sink import WandbSink

        sinks.append(WandbSink(config))
    return RunRecords(sinks)
