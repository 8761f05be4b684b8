"""Files that readers and restarts see whole: the old content or the new,
never a part, even after a kill or a full disk mid-write.

Written by hand: the standard library has the pieces (a temporary file in the
same directory, fsync, os.replace) but no function that puts them together,
and the packages that did (atomicwrites) are no longer maintained.
"""

from __future__ import annotations

import json
import os
import tempfile


def write_text_atomically(path: str, text: str, *, durable: bool = True) -> None:
    """Replaces `path` by `text` in one rename. `durable`: the data and the
    rename are on disk when this returns (fsync of the file, then of its
    directory), so a power loss right after cannot leave an empty file."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def write_json_atomically(path: str, value, *, indent: int | None = None, sort_keys: bool = False,
                          durable: bool = True) -> None:
    text = json.dumps(value, indent=indent, sort_keys=sort_keys)
    write_text_atomically(path, text + "\n" if indent is not None else text, durable=durable)
