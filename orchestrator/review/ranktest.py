"""Mann-Whitney U, two-sided: exact for small samples, normal approximation otherwise."""

from __future__ import annotations

import math
from functools import cache


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


@cache
def _count(n1: int, n2: int, u: int) -> int:
    """Arrangements of n1 + n2 items with statistic u (no ties)."""
    if u < 0:
        return 0
    if n1 == 0 or n2 == 0:
        return 1 if u == 0 else 0
    return _count(n1 - 1, n2, u - n2) + _count(n1, n2 - 1, u)


def mann_whitney(a: list[float], b: list[float]) -> dict:
    """U of ``a`` and the two-sided p-value that ``a`` and ``b`` share a distribution."""
    n1, n2 = len(a), len(b)
    if n1 == 0 or n2 == 0:
        return {"u": None, "p": None, "n": [n1, n2], "method": "empty"}
    ranks = _ranks(list(a) + list(b))
    r1 = sum(ranks[:n1])
    u1 = r1 - n1 * (n1 + 1) / 2
    u = min(u1, n1 * n2 - u1)
    ties = len(set(a) | set(b)) < n1 + n2
    if not ties and n1 * n2 <= 2500:
        total = math.comb(n1 + n2, n1)
        tail = sum(_count(n1, n2, k) for k in range(int(u) + 1))
        p = min(1.0, 2 * tail / total)
        method = "exact"
    else:
        n = n1 + n2
        counts: dict[float, int] = {}
        for v in list(a) + list(b):
            counts[v] = counts.get(v, 0) + 1
        tie_term = sum(c ** 3 - c for c in counts.values()) / (n * (n - 1))
        sigma = math.sqrt(n1 * n2 / 12 * ((n + 1) - tie_term))
        z = (abs(u1 - n1 * n2 / 2) - 0.5) / sigma if sigma else 0.0
        p = math.erfc(max(z, 0) / math.sqrt(2))
        method = "normal"
    return {"u": u1, "p": p, "n": [n1, n2], "method": method}
