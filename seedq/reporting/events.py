"""Reads the TensorBoard scalars of a run directory back (no TensorBoard needed).

Used by the quick-start notebook to plot learning curves and by the tests.
Event files are TFRecord files of `Event` protos; the files of a resumed run
are read in the order they were written, and a file that starts with a purge
marker (`SessionLog.START` at step s, written by a resumed segment) hides the
points earlier files logged at steps >= s, exactly as TensorBoard shows them.
"""

from __future__ import annotations

import glob
import os
import struct

from tensorboardX.proto import event_pb2


def _records(path: str):
    with open(path, "rb") as f:
        while True:
            header = f.read(12)  # uint64 length, uint32 masked crc of the length
            if len(header) < 12:
                return
            (length,) = struct.unpack("<Q", header[:8])
            data = f.read(length)
            f.read(4)  # crc of the data
            if len(data) < length:
                return  # a file cut short by a crash
            yield data


def _file_order(path: str):
    # events.out.tfevents.<unix time>.<host>...: the time orders the segments.
    parts = os.path.basename(path).split(".")
    try:
        return (float(parts[3]), path)
    except (IndexError, ValueError):
        return (0.0, path)


def read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} in the order written, with purged points removed."""
    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*")), key=_file_order):
        for data in _records(path):
            event = event_pb2.Event.FromString(data)
            if event.HasField("session_log") and event.session_log.status == event.session_log.START:
                purge = event.step
                for tag, points in scalars.items():
                    scalars[tag] = [(s, v) for s, v in points if s < purge]
                continue
            if event.HasField("summary"):
                for value in event.summary.value:
                    if value.HasField("simple_value"):
                        scalars.setdefault(value.tag, []).append((int(event.step), float(value.simple_value)))
    return scalars
