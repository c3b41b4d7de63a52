"""Files that a crash cannot tear: written under a temporary name, flushed
to disk, then renamed over the old one."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from typing import Any

#: The start of the names `atomic_file` writes before renaming them.
TEMPORARY_PREFIX = ".tmp-"


def fsync(path: str) -> None:
    """Flushes a file (or a directory's entries) to the disk."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot sync a directory
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[str]:
    """Yields a temporary path beside `path` that then replaces `path`.

    Write the file to the yielded path: its name ends as `path`'s does, so
    Keras accepts it for `.keras` and `.weights.h5` files. When the block
    ends without an error, the file is flushed to the disk and renamed to
    `path` in one step, so a reader (or a rerun after a crash) finds
    either the old file or the whole new one, never a torn one. On an
    error the temporary file is removed and `path` is left as it was.

    Args:
        path: the file to write, on a local or shared POSIX file system.
    """
    path = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    temporary = os.path.join(
        directory, f"{TEMPORARY_PREFIX}{os.getpid()}-{name}"
    )
    try:
        yield temporary
        fsync(temporary)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise
    fsync(directory)


def write_json_atomically(path: str | os.PathLike, value: Any) -> None:
    """Writes `value` as JSON to `path` with `atomic_file`."""
    with atomic_file(path) as temporary:
        with open(temporary, "w") as f:
            json.dump(value, f, indent=2, sort_keys=True)


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
