"""numpy references of MSTopK, RedSync, HiTopKComm, SBC, importance-weighted
pruning, ACP-SGD, TopK, RandomK, EF-SignSGD, PowerSGD, FP16, BF16 and
Identity as tfgc runs them.

numpy only (no TensorFlow): the multi-worker tests
(tests/multiworker/test_paper_algorithms.py) replay every worker's
gradients through these functions and compare, step by step, with what
`tfgc.CompressedOptimizer(keras.optimizers.SGD(lr), ...)` did in real
worker processes. The selection itself is `np_select`, the numpy oracle
of `tfgc.ops.top_k_sample`.

Conventions shared by every function:

* `grads[w][s][i]` is worker w's float32 gradient of variable i at step s
  (the optimizer's `iterations` before the step).
* The stateless key of variable i at step s is [seed * 1_000_003 + i, s],
  and the selection seed is key[0] ^ (key[1] << 32) (int64).
* The update is w -= lr * total, total being the SUM over workers of what
  each sent. Tensors with fewer than `min_compress_size` elements are sent
  dense (RedSync with momentum: dense momentum SGD, U = m U + g summed).
* Everything is float32; sums over workers are taken in worker order (the
  real collectives may add in another order: compare totals and weights
  with a tolerance, per-worker states bit for bit or nearly so).
* What numpy cannot draw, TF's stateless random numbers (RandomK's
  positions, PowerSGD's initial Q), is an argument, drawn by the caller.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from custom_ops.cuda_harness.numpy_oracle import (
    np_golomb_encode,
    np_select,
    np_slice_start,
    optimal_b,
    round_to_bfloat16,
)

F32 = np.float32
#: Bytes of one sparse entry on the wire: a float32 value and an int32 index.
SPARSE_ENTRY_BYTES = 8


class Trajectory(NamedTuple):
    """What the reference computes for every step.

    Attributes:
        totals: [step][var] the sum over workers of what was sent.
        weights: [step][var] the variables after the step.
        states: [step][worker][var] tuple of state arrays, in the order of
            the optimizer's `_plans[var].state_variables` (empty for a
            tensor sent dense without state).
        selected: [step][worker][var] increasing indices (into the
            flattened compressed tensor, or shard) of the entries sent, or
            None where the tensor was sent dense.
        sent_bytes: [step][worker] payload bytes this worker sent (between
            hosts, for the hierarchical exchange).
        intra_host_bytes: [step][worker] bytes kept inside the host.
    """

    totals: list
    weights: list
    states: list
    selected: list
    sent_bytes: list
    intra_host_bytes: list


def num_selected(n: int, density: float) -> int:
    """k = ceil(density * n), at least 1 for a non-empty tensor."""
    if n == 0:
        return 0
    return max(1, min(n, math.ceil(density * n)))


def selection_seed(seed: int, index: int, step: int) -> int:
    """The int64 seed `tfgc.compressors._sparse.selection_seed` derives."""
    key0 = np.int64(seed * 1_000_003 + index)
    return int(key0 ^ (np.int64(step) << np.int64(32)))


def worker_sum(arrays) -> np.ndarray:
    """float32 sum in worker order."""
    total = np.zeros_like(np.asarray(arrays[0], F32))
    for a in arrays:
        total = total + np.asarray(a, F32)
    return total


def sparse_sum(n: int, sent) -> np.ndarray:
    """Dense float32 vector of length n with every (values, indices) added."""
    total = np.zeros(n, F32)
    for values, indices in sent:
        np.add.at(total, indices, values)
    return total


def select_and_zero(acc: np.ndarray, k: int, mode: str, rounds: int, seed):
    """(indices, values, acc with the selected entries zeroed), flat."""
    flat = np.asarray(acc, F32).reshape(-1)
    selected = np_select(flat, k, mode, rounds=rounds, seed=seed)
    rest = flat.copy()
    rest[selected] = 0
    return selected, flat[selected], rest


def sgd(weights, totals, lr):
    return [
        (np.asarray(w, F32) - F32(lr) * t).astype(F32)
        for w, t in zip(weights, totals)
    ]


def _check(grads):
    p, steps = len(grads), len(grads[0])
    if any(len(g) != steps for g in grads):
        raise ValueError("every worker needs the same number of steps")
    return p, steps


def _zero_residuals(shapes, compressed, p):
    """[worker][var] a zero residual of `shapes[var]` where `compressed[var]`,
    None elsewhere (a tensor sent dense)."""
    return [
        [np.zeros(s, F32) if c else None for s, c in zip(shapes, compressed)]
        for _ in range(p)
    ]


def _at_least(min_compress_size: int):
    """Which tensors a compressor takes: those of `min_compress_size`
    elements or more."""
    return lambda shape: int(np.prod(shape)) >= min_compress_size


def _low_rank(rank: int, min_compress_size: int):
    """Which tensors a low-rank compressor takes: large enough matrices
    whose rank-r factors are smaller than they are."""
    large = _at_least(min_compress_size)
    return lambda shape: large(shape) and low_rank_worthwhile(shape, rank)


def _start(grads, compressible):
    """(p, steps, shapes, compressed, residuals) of a run with error
    feedback: `compressible(shape)` says which tensors are compressed,
    whose residuals start at zero (None for the others)."""
    p, steps = _check(grads)
    shapes = [np.shape(g) for g in grads[0][0]]
    compressed = [bool(compressible(s)) for s in shapes]
    return p, steps, shapes, compressed, _zero_residuals(shapes, compressed, p)


class _Step:
    """One step's records, filled tensor by tensor, then appended to a
    `Trajectory` with `finish`."""

    def __init__(self, p: int):
        self.p = p
        self.totals = []
        self.states = [[] for _ in range(p)]
        self.selected = [[] for _ in range(p)]
        self.sent_bytes = [0] * p
        self.intra_host_bytes = [0] * p

    def dense(self, arrays, states=None):
        """Worker w sends `arrays[w]` whole (float32) and keeps `states[w]`
        (default: no state)."""
        self.totals.append(worker_sum(arrays))
        for w in range(self.p):
            self.states[w].append(() if states is None else states[w])
            self.selected[w].append(None)
            self.sent_bytes[w] += 4 * np.size(arrays[w])

    def finish(self, out: Trajectory, weights) -> None:
        out.totals.append(self.totals)
        out.weights.append(weights)
        out.states.append(self.states)
        out.selected.append(self.selected)
        out.sent_bytes.append(self.sent_bytes)
        out.intra_host_bytes.append(self.intra_host_bytes)


# --- MSTopK with error feedback, flat exchange -------------------------------


def mstopk(
    grads,
    weights,
    lr,
    density,
    rounds=20,
    min_compress_size=1024,
    seed=0,
) -> Trajectory:
    """MSTopK(density, rounds) with error feedback among all workers.

    acc = g + residual; the worker sends acc at np_select(acc, k, "mstopk")
    and keeps acc with those entries zeroed as its next residual.
    """
    p, steps, shapes, compressed, residual = _start(
        grads, _at_least(min_compress_size)
    )
    out = Trajectory([], [], [], [], [], [])
    for s in range(steps):
        step = _Step(p)
        for i, shape in enumerate(shapes):
            n = int(np.prod(shape))
            if not compressed[i]:
                step.dense([grads[w][s][i] for w in range(p)])
                continue
            k = num_selected(n, density)
            sent = []
            for w in range(p):
                acc = grads[w][s][i] + residual[w][i]
                idx, values, rest = select_and_zero(
                    acc, k, "mstopk", rounds, selection_seed(seed, i, s)
                )
                residual[w][i] = rest.reshape(shape)
                sent.append((values, idx))
                step.states[w].append((residual[w][i],))
                step.selected[w].append(idx)
                step.sent_bytes[w] += SPARSE_ENTRY_BYTES * k
            step.totals.append(sparse_sum(n, sent).reshape(shape))
        weights = sgd(weights, step.totals, lr)
        step.finish(out, weights)
    return out


# --- RedSync -----------------------------------------------------------------


def momentum_sgd_totals(grads, momentum):
    """[step][var] totals of dense momentum SGD: U = m U + g, summed."""
    p, steps = _check(grads)
    u = [[np.zeros_like(g, F32) for g in grads[w][0]] for w in range(p)]
    totals = []
    for s in range(steps):
        row = []
        for i in range(len(grads[0][0])):
            for w in range(p):
                u[w][i] = F32(momentum) * u[w][i] + grads[w][s][i]
            row.append(worker_sum([u[w][i] for w in range(p)]))
        totals.append(row)
    return totals


def redsync(
    grads,
    weights,
    lr,
    density,
    momentum=0.9,
    selection="threshold",
    rounds=20,
    warmup_steps=0,
    min_compress_size=1024,
    seed=0,
) -> Trajectory:
    """RedSync with momentum correction (cost_model=None: every tensor of
    at least `min_compress_size` elements is compressed).

    Compressed tensor, state (U, V): U = m U + g; acc = V + U; the worker
    sends acc at np_select(acc, k, selection); V' = acc and U' = U, both
    with the selected entries zeroed. In the first `warmup_steps` steps:
    U = m U + g, U + V sent dense, V' = 0. Smaller tensors: U = m U + g
    summed (state U; none with momentum 0).
    """
    p, steps = _check(grads)
    m = F32(momentum)
    shapes = [np.shape(g) for g in grads[0][0]]
    compressed = [int(np.prod(s)) >= min_compress_size for s in shapes]
    u = [[np.zeros(s, F32) for s in shapes] for _ in range(p)]
    v = [[np.zeros(s, F32) for s in shapes] for _ in range(p)]
    out = Trajectory([], [], [], [], [], [])
    for s in range(steps):
        step = _Step(p)
        for i, shape in enumerate(shapes):
            n = int(np.prod(shape))
            for w in range(p):
                u[w][i] = m * u[w][i] + grads[w][s][i]
            if not compressed[i]:
                step.dense(
                    [u[w][i] for w in range(p)],
                    [(u[w][i],) if momentum else () for w in range(p)],
                )
                continue
            if s < warmup_steps:
                sent_dense = [u[w][i] + v[w][i] for w in range(p)]
                for w in range(p):
                    v[w][i] = np.zeros(shape, F32)
                step.dense(sent_dense, [(u[w][i], v[w][i]) for w in range(p)])
                continue
            k = num_selected(n, density)
            sent = []
            for w in range(p):
                acc = v[w][i] + u[w][i]
                idx, values, rest = select_and_zero(
                    acc, k, selection, rounds, selection_seed(seed, i, s)
                )
                v[w][i] = rest.reshape(shape)
                flat_u = u[w][i].reshape(-1).copy()
                flat_u[idx] = 0
                u[w][i] = flat_u.reshape(shape)
                sent.append((values, idx))
                step.states[w].append((u[w][i], v[w][i]))
                step.selected[w].append(idx)
                step.sent_bytes[w] += SPARSE_ENTRY_BYTES * idx.size
            step.totals.append(sparse_sum(n, sent).reshape(shape))
        weights = sgd(weights, step.totals, lr)
        step.finish(out, weights)
    return out


# --- HiTopKComm: MSTopK between hosts, dense inside them ---------------------


def shard_layout(shape, per_host: int) -> tuple[tuple[int, ...], int]:
    """(shard shape, shard size): rows of the (prod(shape[:-1]), shape[-1])
    view split into `per_host` pieces of R = ceil(rows / g) rows (1-D
    tensors: n rows of one element)."""
    n = int(np.prod(shape))
    if len(shape) < 2:
        rows, cols = n, 1
    else:
        cols = int(shape[-1])
        rows = n // max(cols, 1)
    shard_rows = math.ceil(rows / per_host)
    shard = (shard_rows, cols) if len(shape) >= 2 else (shard_rows,)
    return shard, shard_rows * cols


def hierarchical_mstopk(
    grads,
    weights,
    lr,
    density,
    hosts,
    rounds=20,
    dense_threshold=16384,
    min_compress_size=1024,
    seed=0,
) -> Trajectory:
    """MSTopK with error feedback under the hierarchical communicator.

    `hosts[w]` is worker w's host; every host has g workers. A tensor of
    at least `dense_threshold` elements (with more than one host): each
    host sums it; the worker of local rank l takes shard l of the
    zero-padded row view (`shard_layout`), compresses it (MSTopK with
    error feedback, state of the shard's shape, k from the shard's size)
    unless it has fewer than `min_compress_size` elements (then the shard
    goes dense); the workers of local rank l on every host sum their
    shards' payloads; the host concatenates the shard totals. Smaller
    tensors are summed dense among all workers.

    The host sum is taken in worker order: with g <= 2 it is the exact
    float32 sum the collective computes (a + b == b + a), so shard
    selections compare exactly.
    """
    p, steps = _check(grads)
    hosts = list(hosts)
    host_ids = sorted(set(hosts), key=hosts.index)
    g = p // len(host_ids)
    if any(hosts.count(h) != g for h in host_ids):
        raise ValueError(f"every host needs {g} workers: {hosts}")
    local = [hosts[:w].count(hosts[w]) for w in range(p)]
    shapes = [np.shape(x) for x in grads[0][0]]
    sharded = [
        int(np.prod(s)) >= dense_threshold and len(host_ids) > 1 for s in shapes
    ]
    layout = [shard_layout(s, g) for s in shapes]
    compressed = [
        sh and int(np.prod(s)) >= min_compress_size
        for s, sh in zip(shapes, sharded)
    ]
    residual = _zero_residuals([shard for shard, _ in layout], compressed, p)
    out = Trajectory([], [], [], [], [], [])
    for s in range(steps):
        step = _Step(p)
        for i, shape in enumerate(shapes):
            n = int(np.prod(shape))
            if not sharded[i]:
                step.dense([grads[w][s][i] for w in range(p)])
                continue
            shard_shape, size = layout[i]
            blocks = {}  # host -> [g, size] host sum, zero padded
            for h in host_ids:
                members = [w for w in range(p) if hosts[w] == h]
                host_sum = worker_sum([grads[w][s][i] for w in members])
                flat = np.zeros(g * size, F32)
                flat[:n] = host_sum.reshape(-1)
                blocks[h] = flat.reshape(g, size)
            shard_totals = [[] for _ in range(g)]  # per local rank
            for w in range(p):
                shard = blocks[hosts[w]][local[w]]
                if g > 1:
                    step.intra_host_bytes[w] += (g + 1) * size * 4
                if not compressed[i]:
                    shard_totals[local[w]].append(shard)
                    step.states[w].append(())
                    step.selected[w].append(None)
                    step.sent_bytes[w] += 4 * size
                    continue
                k = num_selected(size, density)
                acc = shard + residual[w][i].reshape(-1)
                idx, values, rest = select_and_zero(
                    acc, k, "mstopk", rounds, selection_seed(seed, i, s)
                )
                residual[w][i] = rest.reshape(shard_shape)
                shard_totals[local[w]].append((values, idx))
                step.states[w].append((residual[w][i],))
                step.selected[w].append(idx)
                step.sent_bytes[w] += SPARSE_ENTRY_BYTES * k
            pieces = [
                sparse_sum(size, parts) if compressed[i] else worker_sum(parts)
                for parts in shard_totals
            ]
            step.totals.append(np.concatenate(pieces)[:n].reshape(shape))
        weights = sgd(weights, step.totals, lr)
        step.finish(out, weights)
    return out


# --- SBC: binarized top-k of weight updates over `delay` local steps ---------


def sbc_select(a, k: int, binarize: bool = True):
    """(increasing indices, values sent there) of SBC for the flat update a.

    Binarized: the k largest positive entries and the k most negative
    ones; the side with the larger mean magnitude (ties: positive) is
    kept, every kept position carrying its mean with its sign. Otherwise
    the k largest |a| with their values.
    """
    a = np.asarray(a, F32).reshape(-1)
    if not binarize:
        idx = np.sort(np.argsort(-np.abs(a), kind="stable")[:k])
        return idx, a[idx]

    def side(v):
        top = np.argsort(-v, kind="stable")[:k]
        idx = np.sort(top[v[top] > 0])
        mean = F32(v[idx].sum(dtype=F32) / F32(max(idx.size, 1)))
        return idx, mean

    pos, mu_pos = side(a)
    neg, mu_neg = side(-a)
    if mu_pos >= mu_neg:
        return pos, np.full(pos.size, mu_pos, F32)
    return neg, np.full(neg.size, -mu_neg, F32)


class SBCTrajectory(NamedTuple):
    """What the SBC reference computes for every step.

    Attributes:
        weights: [step][worker][var] every worker's variables after the
            step (its own inside a round, the shared ones after it).
        states: [step][worker][var] (residual,) or () for dense tensors.
        round_end: [step] True where the step ended a round (exchanged).
        totals: [step][var] at a round's end the sum over workers of the
            sent updates, else None.
        selected: [step][worker][var] increasing indices sent at a
            round's end (None for dense tensors and inside a round).
        values: [step][worker][var] the values sent there.
        coded: [step][worker][var] (Golomb-Rice stream, bits) of the
            positions.
        sent_bytes: [step][worker] payload bytes (0 inside a round).
    """

    weights: list
    states: list
    round_end: list
    totals: list
    selected: list
    values: list
    coded: list
    sent_bytes: list


def sbc(
    grads,
    weights,
    lr,
    density,
    delay=1,
    binarize=True,
    min_compress_size=1024,
) -> SBCTrajectory:
    """SBC(density, delay, binarize) with error feedback, inner SGD(lr).

    Every step each worker takes a local SGD step with p times its
    gradient, w_w -= (g * p) * lr, on its own weights. The last step of a
    round (every `delay` steps): A = (w_w - w_start) + residual; tensors of
    at least `min_compress_size` elements send `sbc_select(A, k)` and keep
    A - sent as the residual, the others send A = w_w - w_start dense; every
    worker continues from w_start + (sum of the sent) / p.
    """
    p, steps, shapes, compressed, residual = _start(
        grads, _at_least(min_compress_size)
    )
    start = [np.asarray(w, F32) for w in weights]
    local = [list(start) for _ in range(p)]
    out = SBCTrajectory([], [], [], [], [], [], [], [])
    for s in range(steps):
        for w in range(p):
            local[w] = [
                (x - (np.asarray(g, F32) * F32(p)) * F32(lr)).astype(F32)
                for x, g in zip(local[w], grads[w][s])
            ]
        end = (s + 1) % delay == 0
        totals = [None] * len(shapes)
        selected = [[None] * len(shapes) for _ in range(p)]
        values = [[None] * len(shapes) for _ in range(p)]
        coded = [[None] * len(shapes) for _ in range(p)]
        sent_bytes = [0] * p
        if end:
            for i, shape in enumerate(shapes):
                n = int(np.prod(shape))
                sent = []
                for w in range(p):
                    update = local[w][i] - start[i]
                    if not compressed[i]:
                        sent.append(update)
                        sent_bytes[w] += 4 * n
                        continue
                    acc = (update + residual[w][i]).reshape(-1)
                    k = num_selected(n, density)
                    idx, vals = sbc_select(acc, k, binarize)
                    dense = sparse_sum(n, [(vals, idx)])
                    residual[w][i] = (acc - dense).reshape(shape)
                    sent.append(dense.reshape(shape))
                    stream, bits = np_golomb_encode(idx, optimal_b(k, n))
                    selected[w][i], values[w][i] = idx, vals
                    coded[w][i] = (stream, bits)
                    # The count, the value(s) (binarized: one, 0 for an
                    # empty selection), the coded positions.
                    num_values = 1 if binarize else idx.size
                    sent_bytes[w] += 4 + 4 * num_values + stream.size
                totals[i] = worker_sum(sent)
            start = [
                (x + t / F32(p)).astype(F32) for x, t in zip(start, totals)
            ]
            local = [list(start) for _ in range(p)]
        out.weights.append([list(lw) for lw in local])
        out.states.append(
            [[() if r is None else (r,) for r in residual[w]] for w in range(p)]
        )
        out.round_end.append(end)
        out.totals.append(totals)
        out.selected.append(selected)
        out.values.append(values)
        out.coded.append(coded)
        out.sent_bytes.append(sent_bytes)
    return out


def dense_sgd(grads, weights, lr):
    """[step][var] the variables of plain SGD on the summed gradients."""
    p, steps = _check(grads)
    out = []
    for s in range(steps):
        totals = [
            worker_sum([grads[w][s][i] for w in range(p)])
            for i in range(len(weights))
        ]
        weights = sgd(weights, totals, lr)
        out.append(weights)
    return out


# --- Importance-weighted pruning ---------------------------------------------


def importance_root(step: int, p: int) -> int:
    """The root worker of a step: SplitMix64 of the step, in [0, p)."""
    return np_slice_start(step, p - 1)


def importance(
    grads,
    weights,
    lr,
    density,
    epsilon=1e-8,
    min_compress_size=1024,
    roots=None,
    relative_epsilon=1.0,
) -> Trajectory:
    """ImportancePruning(density, epsilon, relative_epsilon) with error
    feedback.

    acc = g + residual; the root of the step (`importance_root`, or
    `roots[step]` when given) picks the k entries of largest
    |acc| / (|w| + relative_epsilon * rms(w) + epsilon), w the variable
    before the step and rms(w) = ||w|| / sqrt(n) over the tensor; every
    worker sends acc there (the sum is the total) and keeps acc with those
    entries zeroed. Smaller tensors are summed dense.
    """
    p, steps, shapes, compressed, residual = _start(
        grads, _at_least(min_compress_size)
    )
    weights = [np.asarray(w, F32) for w in weights]
    out = Trajectory([], [], [], [], [], [])
    for s in range(steps):
        root = importance_root(s, p) if roots is None else roots[s]
        step = _Step(p)
        for i, shape in enumerate(shapes):
            n = int(np.prod(shape))
            if not compressed[i]:
                step.dense([grads[w][s][i] for w in range(p)])
                continue
            k = num_selected(n, density)
            acc = [
                (grads[w][s][i] + residual[w][i]).reshape(-1) for w in range(p)
            ]
            weight = weights[i].reshape(-1)
            rms = F32(np.sqrt(np.mean(weight.astype(np.float64) ** 2)))
            floor = F32(relative_epsilon) * rms + F32(epsilon)
            score = np.abs(acc[root]) / (np.abs(weight) + floor)
            idx = np.sort(np.argsort(-score, kind="stable")[:k])
            step.totals.append(
                sparse_sum(n, [(a[idx], idx) for a in acc]).reshape(shape)
            )
            for w in range(p):
                rest = acc[w].copy()
                rest[idx] = 0
                residual[w][i] = rest.reshape(shape)
                step.states[w].append((residual[w][i],))
                step.selected[w].append(idx)
                step.sent_bytes[w] += (4 + 4) * k
        weights = sgd(weights, step.totals, lr)
        step.finish(out, weights)
    return out


# --- ACP-SGD: PowerSGD's factors, one all-reduced per step -------------------


def matrix_shape(shape) -> tuple[int, int]:
    """(prod(shape[:-1]), shape[-1]): PowerSGD's matrix view."""
    cols = int(shape[-1])
    return int(np.prod(shape)) // max(cols, 1), cols


def low_rank_worthwhile(shape, rank: int) -> bool:
    """2+ dimensions, and rank-r factors smaller than the matrix."""
    if len(shape) < 2:
        return False
    rows, cols = matrix_shape(shape)
    return (rows + cols) * min(rank, rows, cols) < rows * cols


def orthonormal(factor) -> np.ndarray:
    """Q of the reduced QR (its columns' signs may differ from TF's)."""
    return np.linalg.qr(np.asarray(factor, F32))[0].astype(F32)


def acpsgd(
    grads,
    weights,
    lr,
    rank,
    initial,
    warmup_steps=0,
    min_compress_size=1024,
) -> Trajectory:
    """ACPSGD(rank, warmup_steps) with error feedback, inner SGD(lr).

    `initial[i]` is (P, Q), the initial factors of compressed tensor i
    (TF's seeded normal draws, taken from the workers). The first
    `warmup_steps` steps sum every tensor dense (states unchanged); then
    P and Q steps alternate, starting with P. With C = M + E (M the
    gradient as a (rows, cols) matrix, E the residual):

    * P step: Qo = orth(Q); P_w = C Qo; P = sum P_w; the total is P Qo^T;
      E = C - P_w Qo^T; the state's P is the sum, p_steps + 1.
    * Q step: Po = orth(P); Q_w = C^T Po; Q = sum Q_w; the total is
      Po Q^T; E = C - Po Q_w^T; the state's Q is the sum, q_steps + 1.

    States, as `_plans[i].state_variables`: (E, P, Q, p_steps, q_steps)
    for compressed tensors, () for dense ones. `selected` holds, per step,
    worker and tensor, the local factor sent (None if dense).
    """
    p, steps, shapes, compressed, residual = _start(
        grads, _low_rank(rank, min_compress_size)
    )
    factors = [
        [np.asarray(f, F32) for f in initial[i]] if c else None
        for i, c in enumerate(compressed)
    ]
    counts = [[0, 0] for _ in shapes]
    out = Trajectory([], [], [], [], [], [])
    for s in range(steps):
        warm = s < warmup_steps
        phase = None if warm else (s - warmup_steps) % 2  # 0: P, 1: Q
        step = _Step(p)
        for i, shape in enumerate(shapes):
            n = int(np.prod(shape))
            if not compressed[i] or warm:
                step.totals.append(
                    worker_sum([grads[w][s][i] for w in range(p)])
                )
                for w in range(p):
                    step.sent_bytes[w] += 4 * n
                    step.selected[w].append(None)
            else:
                rows, cols = matrix_shape(shape)
                r = min(rank, rows, cols)
                local = []
                for w in range(p):
                    c = (grads[w][s][i] + residual[w][i]).reshape(rows, cols)
                    if phase == 0:
                        fixed = orthonormal(factors[i][1])
                        fresh = c @ fixed
                        approx = fresh @ fixed.T
                    else:
                        fixed = orthonormal(factors[i][0])
                        fresh = c.T @ fixed
                        approx = fixed @ fresh.T
                    residual[w][i] = (c - approx).reshape(shape)
                    local.append(fresh)
                    step.selected[w].append(fresh)
                    step.sent_bytes[w] += 4 * r * (rows if phase == 0 else cols)
                summed = worker_sum(local)
                factors[i][phase] = summed
                counts[i][phase] += 1
                if phase == 0:
                    total = summed @ fixed.T
                else:
                    total = fixed @ summed.T
                step.totals.append(total.reshape(shape))
            for w in range(p):
                if compressed[i]:
                    step.states[w].append(
                        (
                            residual[w][i],
                            factors[i][0],
                            factors[i][1],
                            np.int64(counts[i][0]),
                            np.int64(counts[i][1]),
                        )
                    )
                else:
                    step.states[w].append(())
        weights = sgd(weights, step.totals, lr)
        step.finish(out, weights)
    return out


# --- One-round compressors with error feedback: TopK, RandomK, EF-SignSGD,
# --- FP16, BF16; Identity --------------------------------------------------


def to_float16(x) -> np.ndarray:
    """float32 rounded to the nearest float16 (ties to even; past the
    largest, inf), as float32."""
    with np.errstate(over="ignore"):
        return np.asarray(x, F32).astype(np.float16).astype(F32)


#: The rounding of each 16-bit wire type, and its unit roundoff.
CASTS = {
    "float16": (to_float16, 2.0**-11),
    "bfloat16": (round_to_bfloat16, 2.0**-8),
}


def cast_sum(arrays, dtype: str) -> np.ndarray:
    """The sum in a 16-bit type, in worker order: every input and every
    partial sum rounded (each add in float32, as TF's 16-bit adds)."""
    rounding, _ = CASTS[dtype]
    total = rounding(arrays[0])
    for a in arrays[1:]:
        total = rounding(total + rounding(a))
    return total


def topk_send(density: float):
    """TopK(density): the k largest |acc| with their values."""

    def send(acc, step, index):
        del step, index
        flat = acc.reshape(-1)
        k = num_selected(flat.size, density)
        idx = np.sort(np.argsort(-np.abs(flat), kind="stable")[:k])
        sent = sparse_sum(flat.size, [(flat[idx], idx)])
        return sent.reshape(acc.shape), idx, SPARSE_ENTRY_BYTES * k

    return send


def randomk_send(indices):
    """RandomK: acc at `indices[step][index]`, the positions every worker
    draws from the shared key (only values travel)."""

    def send(acc, step, index):
        flat = acc.reshape(-1)
        idx = np.sort(np.asarray(indices[step][index], np.int64))
        sent = sparse_sum(flat.size, [(flat[idx], idx)])
        return sent.reshape(acc.shape), idx, 4 * idx.size

    return send


def _signed(acc, scale):
    """scale times the sign of acc (zero counts as +), with the payload's
    bytes: the packed signs and one float32 scale."""
    flat = acc.reshape(-1)
    sent = np.where(flat >= 0, scale, -scale).astype(F32)
    return sent.reshape(acc.shape), None, 4 * -(-flat.size // 32) + 4


def sign_send(acc, step, index):
    """EF-SignSGD: mean |acc| times the sign of acc."""
    del step, index
    return _signed(acc, np.mean(np.abs(acc.reshape(-1)), dtype=F32))


def vote_send(acc, step, index):
    """signSGD with majority vote: this worker's sign of acc; reduce with
    `majority`."""
    del step, index
    return _signed(acc, F32(1.0))


def majority(sent):
    """The sign of the workers' summed signs: +-1, or 0 on a tie."""
    return np.sign(worker_sum(sent)).astype(F32)


def cast_send(dtype: str):
    """FP16 / BF16: acc rounded to the 16-bit type."""
    rounding, _ = CASTS[dtype]

    def send(acc, step, index):
        del step, index
        return rounding(acc), None, 2 * acc.size

    return send


def one_round(
    grads,
    weights,
    lr,
    send,
    min_compress_size=1024,
    reduce=worker_sum,
) -> Trajectory:
    """A one-round compressor with error feedback, inner SGD(lr).

    acc = g + residual; `send(acc, step, var)` returns (the dense tensor
    the worker's payload stands for, the increasing flat indices it
    selected or None, the payload's bytes); the total is `reduce` of what
    the workers sent (default: the float32 sum), the new residual acc -
    sent. Tensors with fewer than `min_compress_size` elements, and every
    tensor when `send` is None (Identity), are summed dense, without state.
    """
    p, steps, shapes, compressed, residual = _start(
        grads, _at_least(min_compress_size if send else math.inf)
    )
    out = Trajectory([], [], [], [], [], [])
    for s in range(steps):
        step = _Step(p)
        for i in range(len(shapes)):
            if not compressed[i]:
                step.dense([grads[w][s][i] for w in range(p)])
                continue
            sent = []
            for w in range(p):
                acc = grads[w][s][i] + residual[w][i]
                estimate, idx, nbytes = send(acc, s, i)
                residual[w][i] = acc - estimate
                sent.append(estimate)
                step.states[w].append((residual[w][i],))
                step.selected[w].append(idx)
                step.sent_bytes[w] += nbytes
            step.totals.append(reduce(sent))
        weights = sgd(weights, step.totals, lr)
        step.finish(out, weights)
    return out


# --- PowerSGD: two all-reduces per step, warm-started Q ----------------------


def powersgd(
    grads,
    weights,
    lr,
    rank,
    initial,
    min_compress_size=1024,
) -> Trajectory:
    """PowerSGD(rank) with error feedback, inner SGD(lr).

    `initial[i]` is the initial Q [cols, r] of compressed tensor i (TF's
    seeded normal draw). With C = M + E (M the gradient as a (rows, cols)
    matrix, E the residual): P = sum C Q; Po = orth(P); Q' = sum C^T Po;
    the total is Po Q'^T; E' = C - Po (C^T Po)^T; Q' is the next Q.
    Tensors below `min_compress_size`, 1-D ones and those whose factors are
    not smaller than the matrix are summed dense.

    States, as `_plans[i].state_variables`: (E, Q) for compressed tensors,
    () for dense ones. `selected` is None throughout.
    """
    p, steps, shapes, compressed, residual = _start(
        grads, _low_rank(rank, min_compress_size)
    )
    q = [None if q0 is None else np.asarray(q0, F32) for q0 in initial]
    out = Trajectory([], [], [], [], [], [])
    for s in range(steps):
        step = _Step(p)
        for i, shape in enumerate(shapes):
            if not compressed[i]:
                step.dense([grads[w][s][i] for w in range(p)])
                continue
            rows, cols = matrix_shape(shape)
            c = [
                (grads[w][s][i] + residual[w][i]).reshape(rows, cols)
                for w in range(p)
            ]
            p_orth = orthonormal(worker_sum([m @ q[i] for m in c]))
            local = [m.T @ p_orth for m in c]
            q[i] = worker_sum(local)
            step.totals.append((p_orth @ q[i].T).reshape(shape))
            for w in range(p):
                residual[w][i] = (c[w] - p_orth @ local[w].T).reshape(shape)
                step.states[w].append((residual[w][i], q[i]))
                step.selected[w].append(None)
                step.sent_bytes[w] += 4 * (rows + cols) * q[i].shape[1]
        weights = sgd(weights, step.totals, lr)
        step.finish(out, weights)
    return out
