"""Actor groups on the wire (docs/wire.md "Actor groups"): group k of an
actor's envs streams as actor id `<id>/g<k>`; an actor of one group keeps its
plain id. The learner needs no notion of groups to serve them; these names
let its reports count actors rather than streams."""

from __future__ import annotations

import re

_GROUP_SUFFIX = re.compile(r"/g(\d+)$")

# The learner pads each inference batch to a power of two from this many envs
# (seedq.server.inference.bucket_sizes); actors size their groups in whole
# multiples of it so that a group's message fills a bucket.
SMALLEST_BATCH_BUCKET = 8


def group_stream_id(actor_id: str, group: int, groups: int) -> str:
    """The stream's actor id: the actor's own with one group, `<id>/g<k>` for group k of several."""
    return actor_id if groups == 1 else f"{actor_id}/g{group}"


def actor_of(stream_id: str) -> str:
    """The actor a stream belongs to: `<id>` for `<id>/g<k>`, else the id itself."""
    return _GROUP_SUFFIX.sub("", stream_id)

