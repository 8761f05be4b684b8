"""Files that readers and restarts see whole: the old content or the new,
never a part, even after a kill or a full disk mid-write.

Written by hand: the standard library has the pieces (a temporary file in the
same directory, fsync, os.replace) but no function that puts them together,
and the packages that did (atomicwrites) are no longer maintained.
"""

from __future__ import annotations

import json
import os
import secrets


def _new_temporary(path: str) -> tuple[int, str]:
    """(fd, name) of a new file beside `path`, created with the mode every
    file of a run directory gets: 0666 less the umask, as open() and orbax's
    checkpoints make them (tempfile.mkstemp would make it 0600). A run's
    files hold no key material (config.json names credential files, it does
    not hold them), so one rule for all of them; a private run is a private
    umask (077) or a private --logdir."""
    directory = os.path.dirname(os.path.abspath(path))
    for _ in range(100):
        tmp = os.path.join(directory, f"{os.path.basename(path)}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


def write_text_atomically(path: str, text: str, *, durable: bool = True) -> None:
    """Replaces `path` by `text` in one rename. `durable`: the data and the
    rename are on disk when this returns (fsync of the file, then of its
    directory), so a power loss right after cannot leave an empty file."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = _new_temporary(path)
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
