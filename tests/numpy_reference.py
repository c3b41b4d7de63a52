"""numpy references of MSTopK, RedSync and HiTopKComm as tfgc runs them.

numpy only (no TensorFlow): the multi-worker tests
(tests/test_paper_algorithms_multiworker.py) replay every worker's
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
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from custom_ops.cuda_harness.numpy_oracle import np_select

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
    p, steps = _check(grads)
    shapes = [np.shape(g) for g in grads[0][0]]
    compressed = [int(np.prod(s)) >= min_compress_size for s in shapes]
    residual = [
        [np.zeros(s, F32) if c else None for s, c in zip(shapes, compressed)]
        for _ in range(p)
    ]
    out = Trajectory([], [], [], [], [], [])
    for s in range(steps):
        totals = []
        states = [[] for _ in range(p)]
        selected = [[] for _ in range(p)]
        sent_bytes = [0] * p
        for i, shape in enumerate(shapes):
            n = int(np.prod(shape))
            if not compressed[i]:
                totals.append(worker_sum([grads[w][s][i] for w in range(p)]))
                for w in range(p):
                    states[w].append(())
                    selected[w].append(None)
                    sent_bytes[w] += 4 * n
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
                states[w].append((residual[w][i],))
                selected[w].append(idx)
                sent_bytes[w] += SPARSE_ENTRY_BYTES * k
            totals.append(sparse_sum(n, sent).reshape(shape))
        weights = sgd(weights, totals, lr)
        out.totals.append(totals)
        out.weights.append(weights)
        out.states.append(states)
        out.selected.append(selected)
        out.sent_bytes.append(sent_bytes)
        out.intra_host_bytes.append([0] * p)
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
        totals = []
        states = [[] for _ in range(p)]
        selected = [[] for _ in range(p)]
        sent_bytes = [0] * p
        for i, shape in enumerate(shapes):
            n = int(np.prod(shape))
            for w in range(p):
                u[w][i] = m * u[w][i] + grads[w][s][i]
            if not compressed[i]:
                totals.append(worker_sum([u[w][i] for w in range(p)]))
                for w in range(p):
                    states[w].append((u[w][i],) if momentum else ())
                    selected[w].append(None)
                    sent_bytes[w] += 4 * n
                continue
            if s < warmup_steps:
                sent_dense = [u[w][i] + v[w][i] for w in range(p)]
                totals.append(worker_sum(sent_dense))
                for w in range(p):
                    v[w][i] = np.zeros(shape, F32)
                    states[w].append((u[w][i], v[w][i]))
                    selected[w].append(None)
                    sent_bytes[w] += 4 * n
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
                states[w].append((u[w][i], v[w][i]))
                selected[w].append(idx)
                sent_bytes[w] += SPARSE_ENTRY_BYTES * idx.size
            totals.append(sparse_sum(n, sent).reshape(shape))
        weights = sgd(weights, totals, lr)
        out.totals.append(totals)
        out.weights.append(weights)
        out.states.append(states)
        out.selected.append(selected)
        out.sent_bytes.append(sent_bytes)
        out.intra_host_bytes.append([0] * p)
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
    residual = [
        [
            np.zeros(layout[i][0], F32) if compressed[i] else None
            for i in range(len(shapes))
        ]
        for _ in range(p)
    ]
    out = Trajectory([], [], [], [], [], [])
    for s in range(steps):
        totals = []
        states = [[] for _ in range(p)]
        selected = [[] for _ in range(p)]
        sent_bytes, intra = [0] * p, [0] * p
        for i, shape in enumerate(shapes):
            n = int(np.prod(shape))
            if not sharded[i]:
                totals.append(worker_sum([grads[w][s][i] for w in range(p)]))
                for w in range(p):
                    states[w].append(())
                    selected[w].append(None)
                    sent_bytes[w] += 4 * n
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
                    intra[w] += (g + 1) * size * 4
                if not compressed[i]:
                    shard_totals[local[w]].append(shard)
                    states[w].append(())
                    selected[w].append(None)
                    sent_bytes[w] += 4 * size
                    continue
                k = num_selected(size, density)
                acc = shard + residual[w][i].reshape(-1)
                idx, values, rest = select_and_zero(
                    acc, k, "mstopk", rounds, selection_seed(seed, i, s)
                )
                residual[w][i] = rest.reshape(shard_shape)
                shard_totals[local[w]].append((values, idx))
                states[w].append((residual[w][i],))
                selected[w].append(idx)
                sent_bytes[w] += SPARSE_ENTRY_BYTES * k
            pieces = [
                sparse_sum(size, parts) if compressed[i] else worker_sum(parts)
                for parts in shard_totals
            ]
            totals.append(np.concatenate(pieces)[:n].reshape(shape))
        weights = sgd(weights, totals, lr)
        out.totals.append(totals)
        out.weights.append(weights)
        out.states.append(states)
        out.selected.append(selected)
        out.sent_bytes.append(sent_bytes)
        out.intra_host_bytes.append(intra)
    return out
