"""Bytes per directed link: the sparse sums routing produces (links touched, bytes each)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _pick(nbytes, mask):
    return None if nbytes is None else nbytes[mask]


def _ones_if_none(nbytes, like):
    return np.ones(len(like)) if nbytes is None else nbytes


@dataclass(frozen=True)
class Loads:
    """Bytes per directed link, sparse: the links a set of transfers touches (sorted, unique) and what
    each carries. Pricing an 8-GPU group on a 16,384-GPU cluster then costs what the group touches."""

    links: np.ndarray
    bytes: np.ndarray

    def scaled(self, factor: float) -> Loads:
        return Loads(self.links, self.bytes * factor)

    def dense(self, num_links: int) -> np.ndarray:
        out = np.zeros(num_links)
        out[self.links] = self.bytes
        return out

    @staticmethod
    def reduce(links: np.ndarray, amounts: np.ndarray | None, num_links: int) -> Loads:
        """Sum duplicate links: a dense bincount when the transfers touch a large share of the cluster,
        sort-and-sum otherwise."""
        if len(links) == 0:
            return Loads(np.zeros(0, dtype=np.int64), np.zeros(0))
        if len(links) * 4 > num_links:
            dense = np.bincount(links, amounts, num_links).astype(np.float64, copy=False)
            touched = np.flatnonzero(dense)
            return Loads(touched, dense[touched])
        unique, inverse = np.unique(links, return_inverse=True)
        return Loads(unique, np.bincount(inverse, amounts, len(unique)).astype(np.float64, copy=False))

    @staticmethod
    def total(parts: list[Loads], num_links: int) -> Loads:
        if not parts:
            return Loads.reduce(np.zeros(0, dtype=np.int64), None, num_links)
        if len(parts) == 1:  # one class (a send, a one-step all-to-all): its loads are the total
            return parts[0]
        if all(p.links is parts[0].links for p in parts):  # classes routed once and scaled (a ring's RS and AG)
            return Loads(parts[0].links, np.sum([p.bytes for p in parts], axis=0))
        return Loads.reduce(
            np.concatenate([p.links for p in parts]), np.concatenate([p.bytes for p in parts]), num_links
        )


class _Loads:
    """(link, bytes) pairs gathered while routing and summed once. With unit weights (``amounts`` None
    throughout) the integer bincount is used, about twice as fast."""

    def __init__(self, num_links: int):
        self.num_links, self.links, self.amounts = num_links, [], []

    def add(self, links, amounts) -> None:
        links = np.asarray(links).ravel()
        self.links.append(links)
        self.amounts.append(None if amounts is None else np.broadcast_to(amounts, links.shape).ravel())

    def total(self) -> Loads:
        if not self.links:
            return Loads.reduce(np.zeros(0, dtype=np.int64), None, self.num_links)
        links = np.concatenate(self.links)
        if all(a is None for a in self.amounts):
            return Loads.reduce(links, None, self.num_links)
        amounts = [np.ones(len(x)) if a is None else a for x, a in zip(self.links, self.amounts, strict=True)]
        return Loads.reduce(links, np.concatenate(amounts), self.num_links)
