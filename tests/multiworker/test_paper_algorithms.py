"""MSTopK, RedSync, HiTopKComm, SBC, importance-weighted pruning, ACP-SGD
and the basic compressors (TopK, RandomK, EF-SignSGD, PowerSGD, FP16, BF16,
Identity) in real worker processes against numpy.

Two launches of tests/multiworker/paper_worker.py, shared by every test
through module-scoped fixtures: 2 workers on 2 hosts (one worker each) and
4 workers on 2 hosts of 2 (`tfgc.launch.run(..., hosts=2)`: loopback
addresses 127.0.0.1 and 127.0.0.2). Every worker feeds its own
heavy-tailed gradients; the test replays all workers' gradients through
tests/numpy_reference.py and compares, step by step, the summed update,
the variables, every worker's optimizer state (the selected entries are
the zeros of the new residual / V) and the bytes reported by
`compression_stats()`. What SBC, ImportancePruning and ACP-SGD compute
inside a step (positions, values and coded bytes, the root, the local
factors) comes from probes the workers write while the step runs.
"""

import io
import json
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests import numpy_reference as ref
from tfgc import launch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "paper_worker.py")
pytestmark = pytest.mark.multiworker

# The runs of paper_worker.py, which imports these.
STEPS = 5
LR = 0.1
SEED = 3
DENSITY = 0.02
# Few bisection rounds: MSTopK then fills k from the band, a slice whose
# start the shared seed picks (with 20 rounds this data hits k exactly).
MSTOPK_ROUNDS = 4
MOMENTUM = 0.9
MIN_COMPRESS_SIZE = 500
# (41, 50): rows that 2 workers of a host split unevenly (zero padding);
# (3001,): a 1-D tensor split in pieces; (7,): always dense; (33, 17): 561
# elements, compressed by the flat exchange, dense under the hierarchical
# one (dense_threshold 1000).
SHAPES = ((41, 50), (3001,), (7,), (33, 17))
HIER_DENSE_THRESHOLD = 1000
SBC_RUNS = {
    # name: (SBC arguments, steps, data seed)
    "sbc": (dict(density=DENSITY, delay=1), 4, 5),
    "sbc_delay3": (dict(density=DENSITY, delay=3), 6, 6),
    "sbc_dense": (dict(density=1.0, delay=1, binarize=False), 3, 7),
}
#: (task, step, var): SBC's delay-1 run gives worker 0 a zero gradient for
#: (33, 17) at step 0, so its update (and residual) is zero: it sends no
#: position and no value.
SBC_ZEROS = ((0, 0, 3),)
ACP_RANK = 3
ACP_BUCKET_BYTES = 8000
POWERSGD_RANK = 3
DENSE_BYTES = 4 * sum(int(np.prod(s)) for s in SHAPES)

# Sums over workers may be added in another order by the collectives.
TOTAL_TOL = dict(rtol=1e-5, atol=1e-6)
# Each worker's own state is the same float32 arithmetic as numpy's.
STATE_TOL = dict(rtol=1e-6, atol=1e-7)


class Run:
    """The results of one launch: one dict of arrays per worker."""

    def __init__(self, num_workers, hosts, results):
        self.num_workers = num_workers
        self.hosts = hosts
        self.results = results

    def __repr__(self):
        return f"Run({self.num_workers} workers, {self.hosts} hosts)"

    def steps(self, name):
        return json.loads(str(self.results[0][f"{name}/config"]))["steps"]

    def grads(self, name):
        """[worker][step][var] the gradients each worker fed."""
        grads = [
            [
                [r[f"{name}/grads/{s}/{i}"] for i in range(len(SHAPES))]
                for s in range(self.steps(name))
            ]
            for r in self.results
        ]
        # Different data on every worker (else a sum is p times one).
        for other in grads[1:]:
            assert not np.array_equal(other[0][0], grads[0][0][0])
        return grads

    def initial(self, name):
        r = self.results[0]
        return [r[f"{name}/initial/{i}"] for i in range(len(SHAPES))]

    def state(self, worker, name, step, var):
        r = self.results[worker]
        count = int(r[f"{name}/num_states/{var}"])
        return tuple(r[f"{name}/state/{step}/{var}/{j}"] for j in range(count))

    def stats(self, worker, name, step):
        """(sent, overhead, intra_host, dense) bytes of compression_stats()."""
        return self.results[worker][f"{name}/stats/{step}"]

    def probe(self, worker, name, step, key):
        """What a compressor wrote to probe `key` during the step."""
        return self.results[worker][f"{name}/probe/{step}/{key}"]

    def weights(self, worker, name, step, var):
        return self.results[worker][f"{name}/weights/{step}/{var}"]


def _launch(num_workers, hosts, out):
    log = io.StringIO()
    code = launch.run(
        [sys.executable, WORKER, "--out", str(out)],
        num_workers=num_workers,
        hosts=hosts,
        timeout=600,
        env={"PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"},
        output=log,
    )
    assert code == 0, log.getvalue()[-8000:]
    results = [
        dict(np.load(out / f"worker{i}.npz")) for i in range(num_workers)
    ]
    return Run(num_workers, hosts, results)


@pytest.fixture(scope="module")
def run2(tmp_path_factory):
    """2 workers, one per host."""
    return _launch(2, 2, tmp_path_factory.mktemp("paper2"))


@pytest.fixture(scope="module")
def run4(tmp_path_factory):
    """4 workers, 2 hosts of 2."""
    return _launch(4, 2, tmp_path_factory.mktemp("paper4"))


@pytest.fixture(params=["run2", "run4"], ids=["2workers", "4workers"])
def run(request):
    return request.getfixturevalue(request.param)


def _zeros(a):
    return np.flatnonzero(np.asarray(a).reshape(-1) == 0)


def _assert_update(run, name, expected, s, i, tol, where):
    """Worker 0's total and weights of step s, variable i against the
    reference trajectory (the workers agree, checked apart)."""
    first = run.results[0]
    for kind, want in (
        ("totals", expected.totals),
        ("weights", expected.weights),
    ):
        np.testing.assert_allclose(
            first[f"{name}/{kind}/{s}/{i}"], want[s][i], **tol, err_msg=where
        )


def _assert_workers_agree(run, name, s, i):
    """Every worker applied the same update and has the same weights."""
    first = run.results[0]
    for r in run.results[1:]:
        for kind in ("totals", "weights"):
            key = f"{name}/{kind}/{s}/{i}"
            np.testing.assert_array_equal(r[key], first[key], err_msg=key)


def assert_matches(
    run,
    name,
    expected,
    selection_state=-1,
    update_tol=TOTAL_TOL,
    state_tol=STATE_TOL,
):
    """Every worker, step and variable against a reference trajectory.

    `selection_state` is the state variable whose zeros are the entries a
    worker sent (the residual; RedSync's V). `update_tol=None` leaves
    worker 0's totals and weights to the caller.
    """
    for s in range(run.steps(name)):
        for i in range(len(SHAPES)):
            where = f"{name} step {s} var {i}"
            _assert_workers_agree(run, name, s, i)
            for w in range(run.num_workers):
                got = run.state(w, name, s, i)
                want = expected.states[s][w][i]
                assert len(got) == len(want), where
                for g, e in zip(got, want):
                    assert g.shape == e.shape, where
                    np.testing.assert_allclose(
                        g, e, **state_tol, err_msg=f"{where} worker {w}"
                    )
                selected = expected.selected[s][w][i]
                if selected is not None:
                    # The sent entries are zero in the new state, exactly.
                    zeros = _zeros(want[selection_state])
                    assert np.isin(selected, zeros).all()
                    np.testing.assert_array_equal(
                        _zeros(got[selection_state]),
                        zeros,
                        err_msg=f"{where} worker {w}: selection",
                    )
            if update_tol is not None:
                _assert_update(run, name, expected, s, i, update_tol, where)


def assert_bytes(run, name, expected):
    for s in range(run.steps(name)):
        for w in range(run.num_workers):
            sent, _, intra, dense = run.stats(w, name, s)
            assert sent == expected.sent_bytes[s][w], (name, s, w)
            assert intra == expected.intra_host_bytes[s][w], (name, s, w)
            assert dense == DENSE_BYTES


def mstopk_reference(run, seed=SEED):
    return ref.mstopk(
        run.grads("mstopk"),
        run.initial("mstopk"),
        LR,
        DENSITY,
        rounds=MSTOPK_ROUNDS,
        min_compress_size=MIN_COMPRESS_SIZE,
        seed=seed,
    )


def assert_seed_matters(expected, other):
    """Another seed selects other entries somewhere (MSTopK's band slice),
    so the comparison with the workers checks the shared seed too."""
    assert any(
        a is not None and not np.array_equal(a, b)
        for step, other_step in zip(expected.selected, other.selected)
        for worker, other_worker in zip(step, other_step)
        for a, b in zip(worker, other_worker)
    )


def redsync_reference(run, name, selection, warmup_steps=0):
    return ref.redsync(
        run.grads(name),
        run.initial(name),
        LR,
        DENSITY,
        momentum=MOMENTUM,
        selection=selection,
        rounds=20,
        warmup_steps=warmup_steps,
        min_compress_size=MIN_COMPRESS_SIZE,
        seed=SEED,
    )


# --- 1. MSTopK ---------------------------------------------------------------


def test_mstopk_matches_numpy(run):
    expected = mstopk_reference(run)
    plans = run.results[0]["mstopk/plans"]
    # (7,) is below min_compress_size: summed dense.
    assert list(plans) == ["ErrorFeedback"] * 2 + ["Identity", "ErrorFeedback"]
    assert_seed_matters(expected, mstopk_reference(run, seed=SEED + 1))
    assert_matches(run, "mstopk", expected)
    assert_bytes(run, "mstopk", expected)
    for w in range(run.num_workers):
        assert run.stats(w, "mstopk", 0)[1] == 0  # fixed-size gathers


# --- 2. RedSync --------------------------------------------------------------


@pytest.mark.parametrize("selection", ["threshold", "trimmed"])
def test_redsync_matches_numpy(run, selection):
    name = f"redsync_{selection}"
    expected = redsync_reference(run, name, selection)
    plans = list(run.results[0][f"{name}/plans"])
    assert plans == ["RedSync", "RedSync", "MomentumDense", "RedSync"]
    # States: (U, V) for RedSync, (U,) for the dense momentum path.
    assert_matches(run, name, expected, selection_state=1)
    for s in range(run.steps(name)):
        for w in range(run.num_workers):
            for i in (0, 1, 3):
                u, v = run.state(w, name, s, i)
                selected = expected.selected[s][w][i]
                k = ref.num_selected(u.size, DENSITY)
                if selection == "trimmed":
                    assert selected.size == k
                else:
                    assert k < selected.size < 2 * k
                # U is zeroed where V was sent.
                assert (u.reshape(-1)[selected] == 0).all()
                assert _zeros(v).size == selected.size
    assert_bytes(run, name, expected)


def test_redsync_threshold_counts_differ_between_workers(run):
    """Unequal payloads: the ragged gather and its padding are exercised,
    and sent_bytes is each worker's own count."""
    name = "redsync_threshold"
    ladder = run.results[0]["ladder"]
    compressed = [0, 1, 3]
    differ = False
    for s in range(run.steps(name)):
        counts = np.array(
            [
                [_zeros(run.state(w, name, s, i)[1]).size for i in compressed]
                for w in range(run.num_workers)
            ]
        )
        differ |= len({tuple(c) for c in counts}) > 1
        # A header of one count per payload field, then values and indices.
        words = 2 * len(compressed) + 2 * counts.sum(axis=1)
        padded = ladder[np.searchsorted(ladder, words.max())]
        for w in range(run.num_workers):
            sent, overhead, _, _ = run.stats(w, name, s)
            # Plus the (7,) tensor, sent dense.
            assert sent == 8 * counts[w].sum() + 4 * np.prod(SHAPES[2])
            assert overhead == 4 * padded + 4 - 8 * counts[w].sum()
    assert differ


def test_redsync_warmup_is_momentum_sgd_then_sparse(run):
    name = "redsync_warmup"
    warmup = 2
    expected = redsync_reference(run, name, "threshold", warmup_steps=warmup)
    assert_matches(run, name, expected, selection_state=1)
    assert_bytes(run, name, expected)
    dense = ref.momentum_sgd_totals(run.grads(name), MOMENTUM)
    r = run.results[0]
    for s in range(run.steps(name)):
        sent = run.stats(0, name, s)[0]
        if s < warmup:
            for i in range(len(SHAPES)):
                np.testing.assert_allclose(
                    r[f"{name}/totals/{s}/{i}"], dense[s][i], **TOTAL_TOL
                )
            for w in range(run.num_workers):
                for i in (0, 1, 3):
                    assert not run.state(w, name, s, i)[1].any()  # V = 0
            assert sent == DENSE_BYTES
        else:
            assert sent < DENSE_BYTES / 10
            # Sparse now: no longer momentum SGD.
            assert not np.allclose(
                r[f"{name}/totals/{s}/0"], dense[s][0], **TOTAL_TOL
            )


# --- 4. The cost model decides the same everywhere ---------------------------


def test_cost_model_decisions_agree_across_workers(run):
    results = run.results
    skewed = np.array([r["cost/skewed"] for r in results])
    local = [r["cost/local_decisions"] for r in results]
    # The skewed local numbers would split the workers (else this proves
    # nothing): some tensor would go dense on one and sparse on another.
    assert any(not np.array_equal(local[0], d) for d in local[1:])
    assert len({tuple(s) for s in skewed}) == run.num_workers
    first = results[0]
    np.testing.assert_allclose(first["cost/agreed"], skewed.mean(axis=0))
    for r in results[1:]:
        np.testing.assert_array_equal(r["cost/agreed"], first["cost/agreed"])
        np.testing.assert_array_equal(
            r["cost/agreed_decisions"], first["cost/agreed_decisions"]
        )
    # The optimizer's own probe: one plan for every worker.
    plans = first["cost/optimizer_plans"]
    assert set(plans) <= {"RedSync", "MomentumDense"}
    np.testing.assert_array_equal(
        plans == "RedSync", first["cost/optimizer_replanned"]
    )
    for r in results[1:]:
        np.testing.assert_array_equal(r["cost/optimizer_plans"], plans)
        np.testing.assert_array_equal(
            r["cost/optimizer_cost"], first["cost/optimizer_cost"]
        )
        np.testing.assert_array_equal(
            r["cost/optimizer_weights"], first["cost/optimizer_weights"]
        )


# --- 5. HiTopKComm -----------------------------------------------------------


def hierarchical_reference(run, name, hosts, dense_threshold, seed=SEED):
    return ref.hierarchical_mstopk(
        run.grads(name),
        run.initial(name),
        LR,
        DENSITY,
        hosts,
        rounds=MSTOPK_ROUNDS,
        dense_threshold=dense_threshold,
        min_compress_size=MIN_COMPRESS_SIZE,
        seed=seed,
    )


def test_hierarchical_two_hosts_of_two_matches_numpy(run4):
    hosts = (0, 0, 1, 1)
    for r in run4.results:
        assert tuple(r["hosts"]) == hosts
    expected = hierarchical_reference(run4, "hier", hosts, HIER_DENSE_THRESHOLD)
    plans = list(run4.results[0]["hier/plans"])
    assert plans == ["ErrorFeedback", "ErrorFeedback", "Identity", "Identity"]
    # Residuals have the shard's shape: 21 of 41 rows, 1501 of 3001.
    assert run4.state(0, "hier", 0, 0)[0].shape == (21, 50)
    assert run4.state(3, "hier", 0, 1)[0].shape == (1501,)
    other = hierarchical_reference(
        run4, "hier", hosts, HIER_DENSE_THRESHOLD, seed=SEED + 1
    )
    assert_seed_matters(expected, other)
    assert_matches(run4, "hier", expected)
    assert_bytes(run4, "hier", expected)


def test_hierarchical_sends_only_sparse_payloads_between_hosts(run4):
    hosts = (0, 0, 1, 1)
    sharded = [0, 1]  # (41, 50) and (3001,); (7,) and (33, 17) go dense
    dense = [2, 3]
    layout = [ref.shard_layout(SHAPES[i], 2) for i in sharded]
    sparse_bytes = sum(
        8 * ref.num_selected(size, DENSITY) for _, size in layout
    )
    dense_bytes = sum(4 * int(np.prod(SHAPES[i])) for i in dense)
    full_bytes = [4 * int(np.prod(SHAPES[i])) for i in sharded]
    for w, r in enumerate(run4.results):
        assert int(r["hier/tracing_count"]) == 1
        log = json.loads(str(r["hier/collectives"]))
        cross = [c for c in log if len({hosts[m] for m in c["members"]}) > 1]
        inside = [c for c in log if len({hosts[m] for m in c["members"]}) == 1]
        peers = [m for m in range(4) if m % 2 == w % 2]
        assert sorted((c["op"], c["members"], c["bytes"]) for c in cross) == [
            ("all_gather", peers, sparse_bytes),  # k values + k int32 indices
            ("all_reduce", [0, 1, 2, 3], dense_bytes),  # the small tensors
        ]
        assert max(c["bytes"] for c in cross) < min(full_bytes)
        # The full gradients (as [2, shard] zero-padded blocks) are summed
        # inside the host, and the shard totals gathered there.
        host = [m for m in range(4) if hosts[m] == hosts[w]]
        blocks = sum(2 * 4 * size for _, size in layout)
        assert blocks >= sum(full_bytes)
        assert sorted((c["op"], c["members"], c["bytes"]) for c in inside) == [
            ("all_gather", host, sum(4 * size for _, size in layout)),
            ("all_reduce", host, blocks),
        ]
        for s in range(run4.steps("hier")):
            sent = run4.stats(w, "hier", s)[0]
            assert sent == sum(c["bytes"] for c in cross)


def test_hierarchical_one_worker_per_host_is_flat_mstopk(run2):
    hosts = (0, 1)
    for r in run2.results:
        assert tuple(r["hosts"]) == hosts
    expected = hierarchical_reference(run2, "hier_g1", hosts, MIN_COMPRESS_SIZE)
    flat = mstopk_reference(run2)
    # The references agree with each other, bit for bit ...
    for s in range(run2.steps("hier_g1")):
        for i in range(len(SHAPES)):
            np.testing.assert_array_equal(
                expected.totals[s][i], flat.totals[s][i]
            )
            for w in range(2):
                for a, b in zip(expected.states[s][w][i], flat.states[s][w][i]):
                    np.testing.assert_array_equal(a, b)
    # ... and the workers with them, and with the flat run on the same data.
    assert_matches(run2, "hier_g1", expected)
    assert_bytes(run2, "hier_g1", expected)
    for r in run2.results:
        for s in range(run2.steps("hier_g1")):
            for i in range(len(SHAPES)):
                np.testing.assert_allclose(
                    r[f"hier_g1/weights/{s}/{i}"],
                    r[f"mstopk/weights/{s}/{i}"],
                    **TOTAL_TOL,
                )


# --- 6. Bad layouts raise before any collective ------------------------------


@pytest.mark.parametrize(
    "layout, match",
    [
        ("g3", "`workers_per_host` must divide the number of workers (4)"),
        ("g4", "workers_per_host=4 disagrees with the cluster spec"),
    ],
)
def test_hierarchical_bad_layout_raises_on_every_worker(run4, layout, match):
    for r in run4.results:
        assert match in str(r[f"bad/{layout}/error"])
        # Nothing communicated (no tfgc collective, no new variable, whose
        # initial value tf.distribute would broadcast), nothing built.
        assert int(r[f"bad/{layout}/collectives"]) == 0
        assert int(r[f"bad/{layout}/new_variables"]) == 0
        assert not bool(r[f"bad/{layout}/built"])


# --- 7. SBC ------------------------------------------------------------------

COMPRESSED = (0, 1, 3)  # (7,) is below min_compress_size: dense
# TF sums the kept side for its mean in another order (an ulp of it); the
# weights then differ by ulps after a round, and so do the next updates
# (w_local - w_start) and residuals.
SBC_TOL = dict(rtol=1e-6, atol=1e-5)


def sbc_reference(run, name):
    kwargs, steps, _ = SBC_RUNS[name]
    assert run.steps(name) == steps
    return ref.sbc(
        run.grads(name),
        run.initial(name),
        LR,
        kwargs["density"],
        delay=kwargs["delay"],
        binarize=kwargs.get("binarize", True),
        min_compress_size=MIN_COMPRESS_SIZE,
    )


def sbc_sent(run, name, step, worker, var):
    """(indices, values, the payload's values, coded stream) of a probe
    (all empty where the probe was not written: count -1)."""
    count = max(int(run.probe(worker, name, step, f"sbc/{var}/count")[0]), 0)
    num_bytes = max(
        int(run.probe(worker, name, step, f"sbc/{var}/num_bytes")[0]), 0
    )
    payload_values = run.probe(worker, name, step, f"sbc/{var}/payload_values")
    return (
        run.probe(worker, name, step, f"sbc/{var}/indices")[:count],
        run.probe(worker, name, step, f"sbc/{var}/values")[:count],
        payload_values[~np.isnan(payload_values)],
        run.probe(worker, name, step, f"sbc/{var}/positions")[:num_bytes],
    )


@pytest.mark.parametrize("name", ["sbc", "sbc_delay3"])
def test_sbc_matches_numpy(run, name):
    """Same positions, sign and mean, Golomb stream, residuals and weights
    as numpy, every worker, round and tensor."""
    expected = sbc_reference(run, name)
    delay = SBC_RUNS[name][0]["delay"]
    p = run.num_workers
    plans = list(run.results[0][f"{name}/plans"])
    assert plans == [
        "ErrorFeedback",
        "ErrorFeedback",
        "Identity",
        "ErrorFeedback",
    ]
    grads = run.grads(name)
    for s in range(run.steps(name)):
        end = expected.round_end[s]
        assert end == ((s + 1) % delay == 0)
        start_step = s - s % delay - 1  # the step before the round began
        for w, r in enumerate(run.results):
            where = f"{name} step {s} worker {w}"
            sent, _, intra, dense = run.stats(w, name, s)
            assert sent == expected.sent_bytes[s][w], where
            assert (intra, dense) == (0, DENSE_BYTES)
            for i in range(len(SHAPES)):
                # A local step takes p times the worker's own gradient.
                np.testing.assert_array_equal(
                    r[f"{name}/totals/{s}/{i}"], grads[w][s][i] * p
                )
                np.testing.assert_allclose(
                    run.weights(w, name, s, i),
                    expected.weights[s][w][i],
                    **TOTAL_TOL,
                    err_msg=f"{where} var {i}",
                )
                # The round started from the weights of the last round end.
                start = (
                    run.initial(name)[i]
                    if start_step < 0
                    else run.weights(0, name, start_step, i)
                )
                np.testing.assert_array_equal(
                    r[f"{name}/round_start/{s}/{i}"], start
                )
            for i in COMPRESSED:
                (got,) = run.state(w, name, s, i)
                (want,) = expected.states[s][w][i]
                np.testing.assert_allclose(
                    got, want, **SBC_TOL, err_msg=f"{where} var {i}"
                )
                indices, values, payload_values, stream = sbc_sent(
                    run, name, s, w, i
                )
                if not end:  # nothing compressed inside a round
                    assert indices.size == 0 and stream.size == 0, where
                    assert int(run.probe(w, name, s, f"sbc/{i}/count")[0]) == -1
                    continue
                np.testing.assert_array_equal(
                    indices, expected.selected[s][w][i], err_msg=where
                )
                np.testing.assert_allclose(
                    values, expected.values[s][w][i], **SBC_TOL, err_msg=where
                )
                # One sign, one magnitude: a single float travels (0 from
                # a worker whose update is all zero, with no position).
                assert len(set(values)) <= 1 and values.size == indices.size
                np.testing.assert_array_equal(
                    payload_values, values[:1] if values.size else [0.0]
                )
                # The positions' Golomb-Rice code, bit for bit.
                want_stream, bits = expected.coded[s][w][i]
                assert stream.size == -(-bits // 8)
                np.testing.assert_array_equal(
                    stream, want_stream, err_msg=where
                )
        for i in range(len(SHAPES)):
            copies = [run.weights(w, name, s, i) for w in range(p)]
            if end:  # every replica continues from the same weights
                for c in copies[1:]:
                    np.testing.assert_array_equal(c, copies[0])
            else:  # each on its own inside a round
                for c in copies[1:]:
                    assert not np.array_equal(c, copies[0])
        if not end:
            continue
        for i in COMPRESSED:
            # Only the sent positions move, by (sum of the sent means) / p.
            before = (
                run.initial(name)[i]
                if start_step < 0
                else run.weights(0, name, start_step, i)
            )
            moved = np.flatnonzero(run.weights(0, name, s, i) != before)
            union = np.unique(
                np.concatenate([expected.selected[s][w][i] for w in range(p)])
            )
            np.testing.assert_array_equal(moved, union)
            np.testing.assert_allclose(
                run.weights(0, name, s, i).reshape(-1)[union]
                - before.reshape(-1)[union],
                expected.totals[s][i].reshape(-1)[union] / p,
                **SBC_TOL,
            )


def test_sbc_keeps_one_sign_per_tensor_and_round(run):
    """Exactly one sign per tensor and round; both signs occur; a worker
    whose update is zero sends no position, and 0 as its value."""
    signs = set()
    for name in ("sbc", "sbc_delay3"):
        expected = sbc_reference(run, name)
        for s in range(run.steps(name)):
            if not expected.round_end[s]:
                continue
            for w in range(run.num_workers):
                for i in COMPRESSED:
                    indices, values, sent, stream = sbc_sent(run, name, s, w, i)
                    if (w, s, i) in SBC_ZEROS and name == "sbc":
                        assert indices.size == 0 and stream.size == 0
                        assert values.size == 0 and sent.tolist() == [0.0]
                        continue
                    k = ref.num_selected(int(np.prod(SHAPES[i])), DENSITY)
                    assert 0 < indices.size <= k
                    assert np.unique(np.sign(values)).size == 1
                    signs.add(float(np.sign(values[0])))
    assert signs == {-1.0, 1.0}


def test_sbc_density_one_unbinarized_is_dense_sgd(run):
    name = "sbc_dense"
    expected = sbc_reference(run, name)
    dense = ref.dense_sgd(run.grads(name), run.initial(name), LR)
    for s in range(run.steps(name)):
        for i in range(len(SHAPES)):
            for w in range(run.num_workers):
                got = run.weights(w, name, s, i)
                np.testing.assert_array_equal(got, run.weights(0, name, s, i))
                np.testing.assert_allclose(got, dense[s][i], **TOTAL_TOL)
                np.testing.assert_allclose(
                    got, expected.weights[s][w][i], **TOTAL_TOL
                )
                if i in COMPRESSED:
                    # Everything is sent, with its value: no residual.
                    assert not run.state(w, name, s, i)[0].any()
                    indices, values, _, _ = sbc_sent(run, name, s, w, i)
                    assert indices.size == np.prod(SHAPES[i])
                    np.testing.assert_array_equal(
                        values, expected.values[s][w][i]
                    )


# --- 8. Importance-weighted pruning ------------------------------------------


def importance_reference(run, roots=None):
    return ref.importance(
        run.grads("importance"),
        run.initial("importance"),
        LR,
        DENSITY,
        min_compress_size=MIN_COMPRESS_SIZE,
        roots=roots,
    )


def test_importance_matches_numpy(run):
    name = "importance"
    p = run.num_workers
    steps = run.steps(name)
    roots = [ref.importance_root(s, p) for s in range(steps)]
    assert len(set(roots)) > 1  # the root changes with the step
    expected = importance_reference(run)
    # Another worker as root would pick other positions.
    other = importance_reference(run, roots=[(r + 1) % p for r in roots])
    assert_seed_matters(expected, other)
    plans = list(run.results[0][f"{name}/plans"])
    assert plans == [
        "ErrorFeedback",
        "ErrorFeedback",
        "Identity",
        "ErrorFeedback",
    ]
    assert_matches(run, name, expected)
    assert_bytes(run, name, expected)
    for s in range(steps):
        for w in range(p):
            # Every worker drew the same root, numpy's.
            assert int(run.probe(w, name, s, "importance/root")[0]) == roots[s]
            for i in COMPRESSED:
                agreed = run.probe(w, name, s, f"importance/{i}/agreed")
                np.testing.assert_array_equal(
                    agreed, expected.selected[s][w][i]
                )
                # Every worker names the root; its list is what arrives.
                payload_root = run.probe(
                    w, name, s, f"importance/{i}/payload_root"
                )
                assert int(payload_root[0]) == roots[s]
                if w == roots[s]:
                    sent = run.probe(w, name, s, f"importance/{i}/sent")
                    np.testing.assert_array_equal(sent, agreed)
        for i in COMPRESSED:
            # Only the root's top-k positions are updated.
            before = (
                run.initial(name)[i]
                if s == 0
                else run.weights(0, name, s - 1, i)
            )
            moved = np.flatnonzero(run.weights(0, name, s, i) != before)
            np.testing.assert_array_equal(moved, expected.selected[s][0][i])


# --- 9. ACP-SGD --------------------------------------------------------------

ACP_COMPRESSED = (0, 3)  # (3001,) is 1-D, (7,) is small: dense
# Matrix products and QR in another order than numpy's (float32).
ACP_TOL = dict(rtol=1e-4, atol=1e-5)


def acp_reference(run):
    name = "acpsgd"
    first = run.results[0]
    initial = {
        i: (
            first[f"{name}/initial_state/{i}/1"],
            first[f"{name}/initial_state/{i}/2"],
        )
        for i in ACP_COMPRESSED
    }
    return ref.acpsgd(
        run.grads(name),
        run.initial(name),
        LR,
        ACP_RANK,
        [initial.get(i) for i in range(len(SHAPES))],
        warmup_steps=1,
        min_compress_size=MIN_COMPRESS_SIZE,
    )


def assert_close_up_to_column_signs(got, want, **tol):
    """got == want with some columns negated (QR's sign convention)."""
    signs = np.sign(np.sum(got * want, axis=0))
    assert (signs != 0).all()
    np.testing.assert_allclose(got, want * signs, **tol)


def test_acpsgd_matches_numpy(run):
    name = "acpsgd"
    plans = list(run.results[0][f"{name}/plans"])
    both = "ErrorFeedback+ErrorFeedback"  # the P and the Q phase
    assert plans == [both, "Identity", "Identity", both]
    for i in ACP_COMPRESSED:
        # The same seeded factors everywhere, no residual yet.
        start = [
            [r[f"{name}/initial_state/{i}/{j}"] for j in range(5)]
            for r in run.results
        ]
        for other in start[1:]:
            for a, b in zip(other, start[0]):
                np.testing.assert_array_equal(a, b)
        assert not start[0][0].any()
    expected = acp_reference(run)
    assert_bytes(run, name, expected)
    assert_low_rank_matches(run, name, expected)


def assert_low_rank_matches(run, name, expected):
    """Every worker, step and variable against a low-rank reference whose
    states are (residual, factors..., step counters...): the residual and
    the counters as numpy's, the factors up to their columns' signs (QR's
    convention), worker 0's update (sign-invariant: P Qo^T or Po Q^T)."""
    for s in range(run.steps(name)):
        for i in range(len(SHAPES)):
            where = f"{name} step {s} var {i}"
            _assert_workers_agree(run, name, s, i)
            for w in range(run.num_workers):
                got = run.state(w, name, s, i)
                want = expected.states[s][w][i]
                assert len(got) == len(want), where
                if not want:
                    continue
                residual, *factors = got
                np.testing.assert_allclose(
                    residual, want[0], **ACP_TOL, err_msg=f"{where} worker {w}"
                )
                for g, e in zip(factors, want[1:]):
                    if np.ndim(e) == 0:  # a step counter
                        assert int(g) == e, where
                    else:
                        assert_close_up_to_column_signs(g, e, **ACP_TOL)
            _assert_update(run, name, expected, s, i, ACP_TOL, where)


def test_acpsgd_alternates_one_factor_per_step(run):
    """Warm-up, then P, Q, P, Q: the counters, the factor that changes,
    the bytes sent and the all-reduces traced (one per bucket)."""
    name = "acpsgd"
    grads = run.grads(name)
    counters = [(0, 0), (1, 0), (1, 1), (2, 1), (2, 2)]
    dense = [(3001,), (7,)]
    dense_bytes = sum(4 * int(np.prod(s)) for s in dense)
    for s in range(run.steps(name)):
        for w, r in enumerate(run.results):
            sent = run.stats(w, name, s)[0]
            for i in ACP_COMPRESSED:
                now = run.state(w, name, s, i)
                before = (
                    [r[f"{name}/initial_state/{i}/{j}"] for j in range(5)]
                    if s == 0
                    else run.state(w, name, s - 1, i)
                )
                assert (int(now[3]), int(now[4])) == counters[s]
                changed = [
                    not np.array_equal(a, b) for a, b in zip(now, before)
                ]
                if s == 0:  # dense warm-up: the state waits
                    assert changed == [False] * 5
                    np.testing.assert_allclose(
                        r[f"{name}/totals/{s}/{i}"],
                        ref.worker_sum([g[s][i] for g in grads]),
                        **TOTAL_TOL,
                    )
                elif s % 2 == 1:  # P step
                    assert changed == [True, True, False, True, False]
                else:  # Q step
                    assert changed == [True, False, True, False, True]
            factor_bytes = sum(
                4 * ACP_RANK * ref.matrix_shape(SHAPES[i])[(s + 1) % 2]
                for i in ACP_COMPRESSED
            )
            if s == 0:
                assert sent == DENSE_BYTES
            else:  # only P's or only Q's size, plus the dense tensors
                assert sent == factor_bytes + dense_bytes
    # One trace: each bucket of ACP-SGD's size, [(33, 17), (7,)], [(3001,)],
    # [(41, 50)], switches between its own branches, one all-reduce each:
    # the warm-up (dense) and P and Q, but [(3001,)], sent dense every step,
    # has one phase: warm-up and that.
    log = json.loads(str(run.results[0][f"{name}/collectives"]))
    assert int(run.results[0][f"{name}/tracing_count"]) == 1

    def factor(i, side):
        return 4 * ACP_RANK * ref.matrix_shape(SHAPES[i])[side]

    factors = [
        factor(i, side) + extra
        for side in (0, 1)
        for i, extra in ((3, 28), (0, 0))
    ]
    warmup = [4 * 33 * 17 + 28, 4 * 3001, 4 * 41 * 50]
    assert sum(warmup) == DENSE_BYTES
    assert all(c["op"] == "all_reduce" for c in log)
    assert sorted(c["bytes"] for c in log) == sorted(
        warmup + factors + [4 * 3001]
    )


def test_acpsgd_factor_of_the_sum_is_the_sum_of_the_factors(run):
    """Through the real all-reduce: the summed factor equals the sum of
    the local ones, which is the summed input times the orthonormalised
    last factor (reduced QR, checked with numpy's)."""
    name = "acpsgd"
    grads = run.grads(name)
    for s in range(1, run.steps(name)):
        factor, j = ("p", 1) if s % 2 == 1 else ("q", 2)
        for i in ACP_COMPRESSED:
            rows, cols = ref.matrix_shape(SHAPES[i])
            side = rows if factor == "p" else cols
            local = [
                run.probe(w, name, s, f"acp/{i}/{factor}").reshape(
                    side, ACP_RANK
                )
                for w in range(run.num_workers)
            ]
            summed = run.state(0, name, s, i)[j]
            np.testing.assert_allclose(ref.worker_sum(local), summed, **ACP_TOL)
            # The fixed factor: orth(the other factor's last all-reduce).
            fixed = run.probe(0, name, s, f"acp/{i}/fixed_{factor}")
            fixed = fixed.reshape(-1, ACP_RANK)
            last = run.state(0, name, s - 1, i)[3 - j]
            np.testing.assert_allclose(
                fixed.T @ fixed, np.eye(ACP_RANK), atol=1e-5
            )
            assert_close_up_to_column_signs(
                fixed, ref.orthonormal(last), **ACP_TOL
            )
            # Linearity: the factor of the summed input (gradient plus the
            # residual each worker kept).
            inputs = [
                (grads[w][s][i] + run.state(w, name, s - 1, i)[0]).reshape(
                    rows, cols
                )
                for w in range(run.num_workers)
            ]
            total = ref.worker_sum(inputs)
            of_sum = total @ fixed if factor == "p" else total.T @ fixed
            np.testing.assert_allclose(summed, of_sum, **ACP_TOL)


# --- 10. TopK, RandomK, SignSGD, FP16, BF16, Identity, PowerSGD -------------

# (41, 50), (3001,) and (33, 17) with error feedback; (7,) is small: dense.
ONE_ROUND_PLANS = [
    "ErrorFeedback",
    "ErrorFeedback",
    "Identity",
    "ErrorFeedback",
]


def stateless_key(index, step):
    """The optimizer's key of variable `index` at `step` (-1: the one its
    initial state is drawn with)."""
    return tf.constant([SEED * 1_000_003 + index, step], tf.int64)


def randomk_indices(run):
    """[step][var] the positions RandomK draws from the shared key: TF's
    stateless index shuffle, the one thing of the reference numpy cannot
    draw."""
    out = []
    for s in range(run.steps("randomk")):
        row = []
        for i, shape in enumerate(SHAPES):
            n = int(np.prod(shape))
            k = ref.num_selected(n, DENSITY)
            shuffled = tf.random.experimental.index_shuffle(
                tf.range(k, dtype=tf.int64),
                seed=stateless_key(i, s),
                max_index=n - 1,
            )
            row.append(shuffled.numpy())
        out.append(row)
    return out


# EF-SignSGD's scale, a mean over the tensor, is summed in another order
# than numpy's: the residuals differ by ulps of the scale (about 1.5 here)
# every step, and those add up.
SIGN_STATE_TOL = dict(rtol=1e-6, atol=1e-5)
ONE_ROUND_SENDS = {
    "identity": lambda run: None,
    "topk": lambda run: ref.topk_send(DENSITY),
    "randomk": lambda run: ref.randomk_send(randomk_indices(run)),
    "signsgd": lambda run: ref.sign_send,
    "signsgd_vote": lambda run: ref.vote_send,
}
# How the workers' payloads combine (default: their float32 sum).
ONE_ROUND_REDUCE = {"signsgd_vote": ref.majority}


@pytest.mark.parametrize("name", list(ONE_ROUND_SENDS))
def test_one_round_compressor_matches_numpy(run, name):
    """Different data per worker; after 1 step and after each of the next:
    the summed update and the weights, every worker's residual and
    selection, the bytes."""
    expected = ref.one_round(
        run.grads(name),
        run.initial(name),
        LR,
        ONE_ROUND_SENDS[name](run),
        min_compress_size=MIN_COMPRESS_SIZE,
        reduce=ONE_ROUND_REDUCE.get(name, ref.worker_sum),
    )
    plans = list(run.results[0][f"{name}/plans"])
    dense = name == "identity"
    assert plans == (["Identity"] * len(SHAPES) if dense else ONE_ROUND_PLANS)
    tol = SIGN_STATE_TOL if name == "signsgd" else STATE_TOL
    assert_matches(run, name, expected, state_tol=tol)
    assert_bytes(run, name, expected)


def _within(got, want, bound, where):
    excess = np.max(np.abs(got - want) - bound)
    assert excess <= 0, f"{where}: {excess} beyond the rounding bound"


@pytest.mark.parametrize(
    "name, dtype", [("fp16", "float16"), ("bf16", "bfloat16")]
)
def test_cast_matches_numpy(run, name, dtype):
    """The residual is what rounding to the 16-bit type lost, bit for bit;
    the total is the 16-bit sum of what the workers sent: numpy's exactly
    with 2 workers (a + b == b + a), within the rounding of another order
    of the sum with 4."""
    grads = run.grads(name)
    expected = ref.one_round(
        grads,
        run.initial(name),
        LR,
        ref.cast_send(dtype),
        min_compress_size=MIN_COMPRESS_SIZE,
        reduce=lambda sent: ref.cast_sum(sent, dtype),
    )
    assert list(run.results[0][f"{name}/plans"]) == ONE_ROUND_PLANS
    assert_matches(run, name, expected, update_tol=None)
    assert_bytes(run, name, expected)
    rounding, unit = ref.CASTS[dtype]
    p = run.num_workers
    first = run.results[0]
    drift = [0.0] * len(SHAPES)  # how far another order moves the weights
    for s in range(run.steps(name)):
        for i in range(len(SHAPES)):
            where = f"{name} step {s} var {i}"
            if i in COMPRESSED:  # gradient plus residual, rounded
                u = unit
                sent = [
                    rounding(
                        grads[w][s][i]
                        + (expected.states[s - 1][w][i][0] if s else 0)
                    )
                    for w in range(p)
                ]
            else:  # dense, float32
                u = 2.0**-24
                sent = [grads[w][s][i] for w in range(p)]
            # Any order of a p-term sum is within (p - 1) roundings of the
            # exact sum; two terms add up the same either way.
            bound = 0 if p == 2 else 2 * p * u * np.sum(np.abs(sent), axis=0)
            total = first[f"{name}/totals/{s}/{i}"]
            _within(total, expected.totals[s][i], bound, where)
            drift[i] = drift[i] + LR * bound
            want = expected.weights[s][i]
            slack = drift[i] + TOTAL_TOL["rtol"] * np.abs(want)
            weights = first[f"{name}/weights/{s}/{i}"]
            _within(weights, want, slack + TOTAL_TOL["atol"], where)


def test_powersgd_matches_numpy(run):
    """Rank 3, error feedback: P = sum C Q, orthogonalised, Q = sum C^T P,
    Q kept as the next step's warm start, starting from the seeded normal
    draw of the key; 1 step and each of the next."""
    name = "powersgd"
    plans = list(run.results[0][f"{name}/plans"])
    assert plans == ["ErrorFeedback", "Identity", "Identity", "ErrorFeedback"]
    initial = [None] * len(SHAPES)
    for i in ACP_COMPRESSED:
        _, cols = ref.matrix_shape(SHAPES[i])
        initial[i] = tf.random.stateless_normal(
            [cols, POWERSGD_RANK], seed=stateless_key(i, -1)
        ).numpy()
        for r in run.results:
            residual, q = (r[f"{name}/initial_state/{i}/{j}"] for j in (0, 1))
            assert not residual.any()
            np.testing.assert_array_equal(q, initial[i])
    expected = ref.powersgd(
        run.grads(name),
        run.initial(name),
        LR,
        POWERSGD_RANK,
        initial,
        min_compress_size=MIN_COMPRESS_SIZE,
    )
    assert_low_rank_matches(run, name, expected)
    assert_bytes(run, name, expected)
