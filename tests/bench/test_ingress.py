"""`seedq bench ingress`'s offered load: streams paced to a set frames/s."""

import subprocess
import sys

import pytest

from seedq.bench import ingress


@pytest.mark.unit
def test_each_stream_sends_at_its_share_of_the_offered_frames_per_second():
    load = ingress.IngressLoad(streams=8, envs_per_stream=4, frames_per_second=320.0)
    assert load.message_interval() == pytest.approx(0.1)  # 8 streams x 4 envs / 320 frames/s
    assert ingress.IngressLoad(frames_per_second=0.0).message_interval() == 0.0  # as fast as served


@pytest.mark.unit
def test_a_paced_stream_never_catches_up_on_a_late_reply():
    interval, due, sends = 0.1, 0.0, []
    # Replies 0.01 s after each send, except one that takes 0.35 s.
    for reply_delay in (0.01, 0.01, 0.35, 0.01, 0.01):
        sent = due  # the stream sleeps until its send is due
        sends.append(sent)
        due = ingress.next_due(due, interval, now=sent + reply_delay)
    assert sends == pytest.approx([0.0, 0.1, 0.2, 0.55, 0.65])
    # No two sends closer than an interval, and the n-th never before n intervals in.
    assert all(b - a >= interval - 1e-9 for a, b in zip(sends, sends[1:]))
    assert all(sent >= n * interval - 1e-9 for n, sent in enumerate(sends))


@pytest.mark.e2e
def test_a_negative_offered_load_is_one_line():
    result = subprocess.run([sys.executable, "-m", "seedq.cli", "bench", "ingress", "--frames-per-second", "-5"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == "seedq bench ingress: --frames-per-second: -5 must not be negative"
