"""Each worker's input records, cached after the first epoch: in memory
where they fit a budget, on the node's local disk where they do not (the
MSTopK system's multi-level data caching; docs/algorithms.md, "MSTopK").

The cache holds what a worker reads from its shard of the source (for
ImageNet the encoded JPEG and the label, before any random augmentation),
so that shuffling and augmentation after it see the same examples every
epoch as without it. A disk cache cannot lie:

* it lives in a directory of its own per shard, with a manifest naming
  the fingerprint of the source files (names, sizes, modification times)
  and of the configuration that made the records; a cache built for other
  data or flags is removed and rebuilt, with a note saying why;
* it is complete only once tf.data has written its index, which it does
  at the end of the first pass; what a run killed while writing leaves (a
  lock file and temporary files) is removed, with a note, and rebuilt;
* where the disk has less free space than the shard needs, the shard is
  read from the source every epoch, with a warning (checked before
  training; a disk that fills up while writing stops the run).

One run at a time per cache directory: a second run would take the first
one's cache in the making for the remains of a killed run.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from absl import logging

if TYPE_CHECKING:
    import tensorflow as tf

LEVELS = ("none", "memory", "disk", "auto")
#: tf.data's file cache, under its prefix.
_PREFIX = "records"
_MANIFEST = "manifest.json"
#: Room left on the disk beyond the shard's size, for tf.data's index.
_DISK_MARGIN = 1.05


class Settings(NamedTuple):
    """What to cache and where (the mains' `--cache*` flags).

    Attributes:
        level: "none", "memory" (every record in memory), "disk" (every
            record on local disk) or "auto" (in memory up to
            `memory_bytes`, the rest on disk where `directory` is given,
            read from the source otherwise).
        directory: local-disk directory of the disk level.
        memory_bytes: the memory level's budget under "auto".
    """

    level: str = "none"
    directory: str | None = None
    memory_bytes: int = 0


NO_CACHE = Settings()


class Unit(NamedTuple):
    """Something a pipeline reads, such as one source file."""

    name: str
    size: int  # bytes
    stamp: str  # changes when the unit does (size, modification time)


class Plan(NamedTuple):
    """Where each unit's records come from after the first epoch."""

    memory: tuple[Unit, ...]
    disk: tuple[Unit, ...]
    source: tuple[Unit, ...]  # read again every epoch
    prefix: str | None  # the disk cache's tf.data prefix
    notes: tuple[str, ...]  # what was decided and why, for the log


def check(settings: Settings) -> None:
    """Raises ValueError for settings that cannot work."""
    if settings.level not in LEVELS:
        raise ValueError(
            f"`--cache` must be one of {list(LEVELS)}. Received: "
            f"cache={settings.level!r}"
        )
    if settings.level == "disk" and not settings.directory:
        raise ValueError(
            "`--cache=disk` needs `--cache_dir`, a directory on the "
            "node's local disk. Received: cache_dir=None"
        )
    if settings.memory_bytes < 0:
        raise ValueError(
            "`--cache_memory_mb` must be >= 0. Received: "
            f"cache_memory_mb={settings.memory_bytes / 2**20:g}"
        )


def file_units(paths: Sequence[str]) -> list[Unit]:
    """One unit per file, stamped with its size and modification time."""
    units = []
    for path in paths:
        stat = os.stat(path)
        units.append(
            Unit(path, stat.st_size, f"{stat.st_size}:{stat.st_mtime_ns}")
        )
    return units


def fingerprint(units: Sequence[Unit], config: dict) -> str:
    """A digest of the units (names and stamps) and the configuration."""
    key = {
        "units": [(os.path.basename(u.name), u.stamp) for u in units],
        "config": config,
    }
    text = json.dumps(key, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def plan(
    settings: Settings, units: Sequence[Unit], config: dict, shard: str
) -> Plan:
    """Decides where each of this worker's `units` is cached, and readies
    the disk cache's directory (`<directory>/<shard>`).

    Args:
        settings: the level, directory and memory budget.
        units: what this worker reads, in the order it reads it.
        config: what makes the records from the units (the parsing, the
            split, the shard); part of the fingerprint.
        shard: a file-name-safe name of this worker's shard.
    """
    check(settings)
    units = tuple(units)
    if settings.level == "none" or not units:
        return Plan((), (), units, None, ())
    if settings.level == "memory":
        return Plan(units, (), (), None, (_memory_note(units),))
    memory: tuple[Unit, ...] = ()
    rest = units
    if settings.level == "auto":
        used, count = 0, 0
        for unit in units:
            if used + unit.size > settings.memory_bytes:
                break
            used, count = used + unit.size, count + 1
        memory, rest = units[:count], units[count:]
    notes = [_memory_note(memory)] if memory else []
    if not rest:
        return Plan(memory, (), (), None, tuple(notes))
    if not settings.directory:
        notes.append(
            f"{len(rest)} of {len(units)} inputs exceed the memory budget "
            f"({settings.memory_bytes / 2**20:.0f} MiB) and no cache_dir is "
            "given: read from the source every epoch"
        )
        return Plan(memory, (), rest, None, tuple(notes))
    directory = os.path.join(settings.directory, shard)
    prefix, disk_notes = _ready_directory(directory, rest, config)
    notes += disk_notes
    if prefix is None:
        return Plan(memory, (), rest, None, tuple(notes))
    return Plan(memory, rest, (), prefix, tuple(notes))


def _memory_note(units: Sequence[Unit]) -> str:
    size = sum(u.size for u in units) / 2**20
    return f"caching {len(units)} inputs ({size:.0f} MiB) in memory"


def _ready_directory(
    directory: str, units: tuple[Unit, ...], config: dict
) -> tuple[str | None, list[str]]:
    """(the tf.data prefix or None for "read the source", notes)."""
    os.makedirs(directory, exist_ok=True)
    prefix = os.path.join(directory, _PREFIX)
    wanted = fingerprint(units, config)
    manifest = os.path.join(directory, _MANIFEST)
    notes = []
    try:
        with open(manifest) as f:
            found = json.load(f).get("fingerprint")
    except (FileNotFoundError, ValueError):
        found = None
    leftovers = [
        p for p in glob.glob(os.path.join(directory, "*")) if p != manifest
    ]
    if found is not None and found != wanted:
        notes.append(
            f"the cache in {directory} was built for other data or flags "
            f"(fingerprint {found}, now {wanted}): rebuilding it"
        )
        _remove(leftovers)
    elif os.path.exists(prefix + ".index") and found == wanted:
        notes.append(f"reading the complete cache in {directory}")
        return prefix, notes
    elif leftovers:
        notes.append(
            f"a partial cache in {directory} (a run stopped while writing "
            "it): removed, rebuilding it"
        )
        _remove(leftovers)
    need = int(sum(u.size for u in units) * _DISK_MARGIN)
    free = shutil.disk_usage(directory).free
    if free < need:
        notes.append(
            f"WARNING: {directory} has {free / 2**20:.0f} MiB free and the "
            f"cache needs about {need / 2**20:.0f} MiB: reading these "
            f"{len(units)} inputs from the source every epoch"
        )
        return None, notes
    _write_manifest(manifest, wanted, units, config)
    notes.append(
        f"caching {len(units)} inputs ({need / 2**20:.0f} MiB) in "
        f"{directory} during the first epoch"
    )
    return prefix, notes


def _remove(paths: Sequence[str]) -> None:
    for path in paths:
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


def _write_manifest(path: str, wanted: str, units, config: dict) -> None:
    temporary = path + ".tmp"
    with open(temporary, "w") as f:
        json.dump(
            {
                "fingerprint": wanted,
                "units": [os.path.basename(u.name) for u in units],
                "config": config,
            },
            f,
            indent=1,
        )
    os.replace(temporary, path)


def log(plan_: Plan) -> None:
    """Logs what `plan` decided: warnings as warnings."""
    for note in plan_.notes:
        if note.startswith("WARNING: "):
            logging.warning("Input cache: %s", note[len("WARNING: ") :])
        else:
            logging.info("Input cache: %s", note)


def cached(
    plan_: Plan,
    records_of: Callable[[tuple[Unit, ...]], tf.data.Dataset],
    seed: int | None = None,
) -> tf.data.Dataset:
    """One pass over every unit's records, each part cached as `plan_`
    says: repeat it for epochs (the first pass fills the caches, the next
    read them).

    `records_of(units)` makes the records of some units. With several
    parts (memory, disk, source) the pass draws from them at random in
    proportion to their sizes (`seed`), so that a shuffle buffer after it
    mixes them as it would mix one source.
    """
    import tensorflow as tf

    parts, weights = [], []
    for units, cache in (
        (plan_.memory, lambda ds: ds.cache()),
        (plan_.disk, lambda ds: ds.cache(plan_.prefix)),
        (plan_.source, lambda ds: ds),
    ):
        if units:
            parts.append(cache(records_of(units)))
            weights.append(float(sum(u.size for u in units)) or 1.0)
    if len(parts) == 1:
        return parts[0]
    total = sum(weights)
    return tf.data.Dataset.sample_from_datasets(
        parts,
        weights=[w / total for w in weights],
        seed=seed,
        stop_on_empty_dataset=False,
    )
