"""Deterministic bounding-volume hierarchy over triangles.

Top-down median split on the longest axis of the centroid bounds, with a stable sort so equal
centroids keep input order: the same triangles always give the same tree, on any machine.
Nodes are laid out depth first (left child at ``i + 1``) as :func:`kernel.intersect.hit_triangles`
expects.
"""

from __future__ import annotations

import numpy as np

from kernel._jit import jit

LEAF_SIZE = 4


@jit
def _build(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, boxes, nodes) for triangle bounds ``lo``/``hi`` of shape (n, 3)."""
    n = lo.shape[0]
    order = np.arange(n)
    cent = (lo + hi) * 0.5
    boxes = np.empty((2 * n, 6), np.float64)
    nodes = np.zeros((2 * n, 2), np.int64)
    # Work items: (start, end, parent); parent >= 0 means "I am that node's right child".
    work = np.empty((2 * n + 2, 3), np.int64)
    work[0, 0], work[0, 1], work[0, 2] = 0, n, -1
    top = 0
    count = 0
    while top >= 0:
        start, end, parent = work[top, 0], work[top, 1], work[top, 2]
        top -= 1
        node = count
        count += 1
        if parent >= 0:
            nodes[parent, 0] = node
        idx = order[start:end]
        for a in range(3):
            boxes[node, a] = lo[idx, a].min()
            boxes[node, 3 + a] = hi[idx, a].max()
        if end - start <= LEAF_SIZE:
            nodes[node, 0], nodes[node, 1] = start, end - start
            continue
        spans = np.empty(3)
        for a in range(3):
            spans[a] = cent[idx, a].max() - cent[idx, a].min()
        axis = np.argmax(spans)
        sub = idx[np.argsort(cent[idx, axis], kind="mergesort")]
        order[start:end] = sub
        mid = (start + end) // 2
        top += 1
        work[top, 0], work[top, 1], work[top, 2] = mid, end, node
        top += 1
        work[top, 0], work[top, 1], work[top, 2] = start, mid, -1
    return order, boxes[:count].copy(), nodes[:count].copy()


def build_bvh(triangles: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """BVH over triangles of shape (n, 3, 3) (three vertices each).

    Returns ``(order, boxes, nodes)``: the triangle permutation the leaves index into, node
    bounds (m, 6) as (min xyz, max xyz), and nodes (m, 2) as described in
    :func:`kernel.intersect.hit_triangles`. Zero triangles give empty arrays.
    """
    if len(triangles) == 0:
        return np.zeros(0, np.int64), np.zeros((0, 6)), np.zeros((0, 2), np.int64)
    lo = np.ascontiguousarray(triangles.min(axis=1))
    hi = np.ascontiguousarray(triangles.max(axis=1))
    order, boxes, nodes = _build(lo, hi)
    return order, boxes, nodes
