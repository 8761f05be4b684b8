"""What a run reports and how it decides to stop: the learner's stats snapshot
(stats), the stop, checkpoint and evaluation decisions (run_control), the
reporter that carries them out (reporter), and the sinks: progress line,
TensorBoard, stats.json, summary.json, curves, W&B. Also reading a run's
TensorBoard scalars back (events) and naming its bottleneck (bottleneck)."""
