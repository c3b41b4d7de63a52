"""The mains' input cache: where each input goes, the same records every
epoch, and a disk cache that cannot lie (other data or flags, a run killed
while writing, a full disk)."""

import collections
import os

import numpy as np
import pytest
import tensorflow as tf

from models.common import cache

CONFIG = {"records": "test", "shard": "0/1"}


def _write_files(directory, count=4, records=50):
    """TFRecord files of distinct byte strings; their paths."""
    paths = []
    for f in range(count):
        path = os.path.join(directory, f"train-{f:05d}-of-{count:05d}")
        with tf.io.TFRecordWriter(path) as writer:
            for r in range(records):
                writer.write(f"file {f} record {r} ".encode() * 20)
        paths.append(path)
    return paths


def _records_of(units):
    return tf.data.TFRecordDataset([u.name for u in units])


def _epochs(plan, count, seed=0):
    ds = cache.cached(plan, _records_of, seed).repeat(count)
    return [x.numpy() for x in ds]


def _plan(tmp_path, files, level, memory_bytes=0, config=CONFIG):
    settings = cache.Settings(level, str(tmp_path / "cache"), memory_bytes)
    return cache.plan(settings, cache.file_units(files), config, "shard0")


@pytest.fixture
def files(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    return _write_files(str(source))


def _all_records(files):
    return collections.Counter(
        x.numpy() for x in tf.data.TFRecordDataset(files)
    )


@pytest.mark.parametrize("level", ["memory", "disk", "auto"])
def test_later_epochs_read_the_cache_not_the_source(tmp_path, files, level):
    """Every epoch holds the same records as the source; after the first
    the source files can be gone."""
    plan = _plan(
        tmp_path, files, level, memory_bytes=2 * os.path.getsize(files[0])
    )
    if level == "auto":  # two files fit the budget, two go to disk
        assert len(plan.memory) == 2 and len(plan.disk) == 2
    expected = _all_records(files)
    ds = cache.cached(plan, _records_of, seed=1).repeat()
    it = iter(ds)
    first = collections.Counter(next(it).numpy() for _ in range(200))
    assert first == expected
    for path in files:
        os.remove(path)
    second = collections.Counter(next(it).numpy() for _ in range(200))
    assert second == expected


def test_none_reads_the_source(tmp_path, files):
    plan = _plan(tmp_path, files, "none")
    assert plan.source == tuple(cache.file_units(files))
    assert collections.Counter(_epochs(plan, 1)) == _all_records(files)
    assert not (tmp_path / "cache").exists()


def test_a_complete_disk_cache_serves_a_later_run(tmp_path, files):
    first = _plan(tmp_path, files, "disk")
    _epochs(first, 1)
    assert os.path.exists(first.prefix + ".index")
    again = _plan(tmp_path, files, "disk")
    assert any("reading the complete cache" in n for n in again.notes)
    for path in files:  # the second run never needs the source
        os.remove(path)
    assert collections.Counter(_epochs(again, 1)) == collections.Counter(
        _epochs(first, 1)
    )


def test_other_flags_rebuild_the_cache_and_say_why(tmp_path, files):
    _epochs(_plan(tmp_path, files, "disk"), 1)
    other = _plan(tmp_path, files, "disk", config={**CONFIG, "shard": "1/2"})
    assert any("built for other data or flags" in n for n in other.notes)
    assert not os.path.exists(other.prefix + ".index")
    assert collections.Counter(_epochs(other, 1)) == _all_records(files)


def test_other_data_rebuild_the_cache(tmp_path, files):
    _epochs(_plan(tmp_path, files, "disk"), 1)
    with tf.io.TFRecordWriter(files[0]) as writer:  # the source changed
        writer.write(b"a new record")
    changed = _plan(tmp_path, files, "disk")
    assert any("built for other data or flags" in n for n in changed.notes)
    assert b"a new record" in _epochs(changed, 1)


def test_a_run_killed_while_writing_leaves_nothing_used(tmp_path, files):
    """What tf.data leaves when its process dies mid-pass (a lock file and
    a temporary data file) is removed and the cache rebuilt, where tf.data
    alone would refuse to start."""
    plan = _plan(tmp_path, files, "disk")
    directory = os.path.dirname(plan.prefix)
    for leftover in ("records_0.lockfile", "records_0.data-00000-of-00001"
                     ".tempstate123"):  # fmt: skip
        with open(os.path.join(directory, leftover), "w") as f:
            f.write("Created at: 0")
    again = _plan(tmp_path, files, "disk")
    assert any("partial cache" in n for n in again.notes)
    assert sorted(os.listdir(directory)) == ["manifest.json"]
    assert collections.Counter(_epochs(again, 1)) == _all_records(files)


def test_a_pass_stopped_early_is_not_taken_for_complete(tmp_path, files):
    plan = _plan(tmp_path, files, "disk")
    it = iter(cache.cached(plan, _records_of))
    for _ in range(10):
        next(it)
    del it
    again = _plan(tmp_path, files, "disk")
    assert not any("reading the complete cache" in n for n in again.notes)
    assert collections.Counter(_epochs(again, 1)) == _all_records(files)


def test_a_full_disk_reads_the_source_with_a_warning(
    tmp_path, files, monkeypatch
):
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(
        cache.shutil, "disk_usage", lambda path: usage(10**9, 10**9, 1000)
    )
    plan = _plan(tmp_path, files, "disk")
    assert plan.prefix is None and len(plan.source) == len(files)
    assert any(n.startswith("WARNING:") and "free" in n for n in plan.notes)
    assert collections.Counter(_epochs(plan, 1)) == _all_records(files)


def test_auto_without_a_directory_reads_the_rest_from_the_source(files):
    settings = cache.Settings("auto", None, os.path.getsize(files[0]))
    plan = cache.plan(settings, cache.file_units(files), CONFIG, "shard0")
    assert len(plan.memory) == 1 and len(plan.source) == 3
    assert any("no cache_dir" in n for n in plan.notes)


def test_the_parts_are_mixed_in_proportion(tmp_path, files):
    """With memory and disk parts, the pass interleaves them (not one
    part after the other)."""
    plan = _plan(tmp_path, files, "auto", os.path.getsize(files[0]))
    first_file = [x.startswith(b"file 0 ") for x in _epochs(plan, 1)]
    positions = np.flatnonzero(first_file)
    assert len(positions) == 50
    assert positions.min() < 20 and positions.max() > 180


@pytest.mark.parametrize(
    "settings, message",
    [
        (cache.Settings("ram"), "`--cache` must be one of"),
        (cache.Settings("disk"), "needs `--cache_dir`"),
        (cache.Settings("auto", "/tmp", -1), "`--cache_memory_mb` must be"),
    ],
)
def test_bad_settings(settings, message):
    with pytest.raises(ValueError, match=message):
        cache.check(settings)
