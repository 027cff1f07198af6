"""Streaming quantile sketches behind one small protocol.

The gap model needs a sketch that takes *weighted* samples (recent samples weigh more,
see :mod:`agentkv.gaps._model`), answers quantiles, merges with another sketch, multiplies
all its weights by a factor (to move the time landmark of the decay) and round-trips
through bytes (to persist it). :class:`QuantileSketch` is that protocol;
:class:`TDigestSketch` implements it on top of ``fastdigest``'s t-digest.

The byte form is agentkv's own, versioned and validated on load, so a stored sketch
does not depend on how a library pickles its objects::

    magic "AKTD" | u16 version | u16 max_centroids | u32 num_centroids | i64 n_values
    | f64 min | f64 max | f64 sum | f64 mass | num_centroids x (f64 mean, f64 weight)

all little-endian.
"""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, Self

from fastdigest import TDigest

from agentkv._errors import ConfigError

__all__ = [
    "DEFAULT_MAX_CENTROIDS",
    "ForwardDecay",
    "GapPrior",
    "QuantileSketch",
    "TDigestSketch",
]

DEFAULT_MAX_CENTROIDS = 300

_MAGIC = b"AKTD"
_FORMAT_VERSION = 1
_HEADER = struct.Struct("<4sHHIqdddd")
_PAIR = struct.Struct("<dd")


class QuantileSketch(Protocol):
    """What the gap model needs from a streaming quantile sketch.

    Invariants: weights are positive; ``quantile`` is non-decreasing in ``q``;
    multiplying every weight by the same factor (``scale``) leaves every quantile
    unchanged; ``from_bytes(to_bytes())`` answers the same quantiles.
    """

    def add(self, x: float, weight: float = 1.0) -> None:
        """Add one sample with a positive weight."""
        ...

    def quantile(self, q: float) -> float:
        """Return the value below which a fraction ``q`` (0..1) of the weight lies."""
        ...

    def merge(self, other: Self) -> None:
        """Fold ``other``'s samples into this sketch (in place)."""
        ...

    def scale(self, factor: float) -> None:
        """Multiply every sample's weight by ``factor`` (> 0).

        Weights that would fall below :attr:`min_weight` are raised to it: data that old
        no longer matters next to fresh samples, and the sketch stays well-formed.
        """
        ...

    @property
    def min_weight(self) -> float:
        """The smallest weight a sample may carry; ``add`` callers keep weights above it."""
        ...

    @property
    def total_weight(self) -> float:
        """Sum of the weights of all samples seen."""
        ...

    def to_bytes(self) -> bytes:
        """Serialize to a compact, versioned byte string."""
        ...


class TDigestSketch:
    """A merging t-digest (``fastdigest``) that implements :class:`QuantileSketch`.

    ``max_centroids`` bounds memory and serialized size (16 bytes per centroid); 300
    keeps p50/p90/p99 within a fraction of a percent in rank on heavy-tailed gaps.
    Adding is buffered inside the digest, so ``add`` is cheap and the first
    ``quantile`` after a burst of adds pays for compressing the buffer.

    ``fastdigest`` treats a centroid of weight below 1 as a fraction of a point and
    interpolates wrongly around it, so every weight here is at least 1
    (:attr:`min_weight`); :meth:`scale` raises smaller weights to 1.
    """

    __slots__ = ("_td", "add")

    add: Callable[[float, float], None]

    def __init__(self, max_centroids: int = DEFAULT_MAX_CENTROIDS) -> None:
        if not 2 <= max_centroids <= 65535:
            raise ValueError(f"max_centroids must be in 2..65535, got {max_centroids}")
        self._td = TDigest(max_centroids=max_centroids)
        # The hot path: bound straight to the native update, no Python frame in between.
        self.add = self._td.update

    def quantile(self, q: float) -> float:
        """Return the ``q`` quantile (NaN while the sketch is empty)."""
        if self._td.is_empty():
            return math.nan
        return float(self._td.quantile(q))

    def merge(self, other: TDigestSketch) -> None:
        """Fold ``other``'s samples into this sketch (in place)."""
        if not other._td.is_empty():
            self._td.merge_inplace(other._td)

    def scale(self, factor: float) -> None:
        """Multiply every centroid's weight by ``factor``, raising any below 1 to 1.

        Without the raise, quantiles do not change; with it, centroids much older than
        the rest get a negligible but valid weight.
        """
        if not (factor > 0.0 and math.isfinite(factor)):
            raise ValueError(f"scale factor must be positive and finite, got {factor}")
        if factor == 1.0 or self._td.is_empty():
            return
        state: dict[str, Any] = self._td.to_dict()
        mass = 0.0
        total = 0.0
        for c in state["centroids"]:
            c["c"] = max(c["c"] * factor, 1.0)
            mass += c["c"]
            total += c["c"] * c["m"]
        state["mass"] = mass
        state["sum"] = total
        self._set(TDigest.from_dict(state))

    @property
    def min_weight(self) -> float:
        """Every weight is at least 1 (see the class docstring)."""
        return 1.0

    @property
    def total_weight(self) -> float:
        """Sum of the weights of all samples seen."""
        return float(self._td.mass())

    @property
    def num_samples(self) -> int:
        """How many samples were added (each counts once, whatever its weight)."""
        return int(self._td.n_values)

    @property
    def max_centroids(self) -> int:
        """The centroid bound this sketch was built with."""
        return int(self._td.max_centroids)

    def copy(self) -> TDigestSketch:
        """Return an independent copy."""
        out = TDigestSketch(self.max_centroids)
        out._set(self._td.copy())
        return out

    def _set(self, td: TDigest) -> None:
        self._td = td
        self.add = td.update

    def to_bytes(self) -> bytes:
        """Serialize to agentkv's versioned little-endian form (see the module docstring)."""
        state: dict[str, Any] = self._td.to_dict()
        cents = state["centroids"]
        head = _HEADER.pack(
            _MAGIC,
            _FORMAT_VERSION,
            int(state["max_centroids"]),
            len(cents),
            int(state.get("n_values", 0)),
            float(state.get("min", 0.0)),
            float(state.get("max", 0.0)),
            float(state.get("sum", 0.0)),
            float(state.get("mass", 0.0)),
        )
        flat = [v for c in cents for v in (float(c["m"]), float(c["c"]))]
        body = struct.pack(f"<{len(flat)}d", *flat)
        return head + body

    @classmethod
    def from_bytes(cls, data: bytes) -> Self:
        """Rebuild a sketch from :meth:`to_bytes` output.

        Raises ``ValueError`` when the bytes are not a sketch of a known version or
        hold values that cannot be right (negative or non-finite weights, ...).
        """
        if len(data) < _HEADER.size:
            raise ValueError("sketch bytes are truncated")
        magic, version, max_c, num_c, n_values, lo, hi, total, mass = _HEADER.unpack_from(data)
        if magic != _MAGIC:
            raise ValueError("not an agentkv sketch (bad magic)")
        if version != _FORMAT_VERSION:
            raise ValueError(f"sketch format version {version} is not supported")
        if len(data) != _HEADER.size + num_c * _PAIR.size or max_c < 2:
            raise ValueError("sketch bytes have the wrong length")
        flat = struct.unpack_from(f"<{2 * num_c}d", data, _HEADER.size)
        means, weights = flat[0::2], flat[1::2]
        if not (all(map(math.isfinite, flat)) and all(c >= 1.0 for c in weights)):
            raise ValueError("sketch holds a non-finite value or a weight below 1")
        cents = [{"m": m, "c": c} for m, c in zip(means, weights, strict=True)]
        if n_values < 0 or (cents and not all(map(math.isfinite, (lo, hi, total, mass)))):
            raise ValueError("sketch header holds a non-finite value")
        out = cls(max_c)
        if cents:
            state = {
                "max_centroids": max_c,
                "mass": mass,
                "sum": total,
                "min": lo,
                "max": hi,
                "n_values": n_values,
                "centroids": cents,
            }
            out._set(TDigest.from_dict(state))
        return out

    def __repr__(self) -> str:
        return (
            f"TDigestSketch(max_centroids={self.max_centroids}, "
            f"num_samples={self.num_samples}, total_weight={self.total_weight:.6g})"
        )


HEADROOM_HALF_LIVES = 8.0
"""A fresh landmark sits this many half-lives before the first sample."""
MAX_EXPONENT = 48.0
"""Move the landmark when a new sample's weight would exceed ``2 ** MAX_EXPONENT``."""
MAX_SPREAD_HALF_LIVES = 32.0
"""When merging, landmarks older than this many half-lives before the newest are squashed."""


class ForwardDecay:
    """Weights that halve with age, measured in time (forward decay).

    A sample observed at time ``t`` weighs ``2 ** ((t - landmark) / half_life_s)``:
    the ratio of two samples' weights depends only on their age difference, so queries
    need no "now", and samples of the same age weigh the same. The landmark is a
    bookkeeping origin; moving it multiplies every weight by the same factor
    (:meth:`factor`), which leaves quantiles unchanged. Weights are kept at least 1 (see
    :class:`TDigestSketch`), so samples older than the landmark count as the landmark's
    age. ``half_life_s=None`` disables decay: every weight is 1.
    """

    __slots__ = ("half_life_s", "inv_half_life")

    def __init__(self, half_life_s: float | None) -> None:
        if half_life_s is not None and not 0.0 < half_life_s < math.inf:
            raise ValueError(f"half_life_s must be positive (or None), got {half_life_s}")
        self.half_life_s = half_life_s
        self.inv_half_life = 0.0 if half_life_s is None else 1.0 / half_life_s

    def fresh_landmark(self, t: float) -> float:
        """The landmark for a sketch whose oldest sample is at ``t``."""
        return 0.0 if self.half_life_s is None else t - HEADROOM_HALF_LIVES * self.half_life_s

    def weight(self, t: float, landmark_s: float) -> float:
        """The weight of a sample at ``t`` relative to ``landmark_s`` (at least 1)."""
        if self.half_life_s is None:
            return 1.0
        return float(2.0 ** min(max((t - landmark_s) * self.inv_half_life, 0.0), 1000.0))

    def factor(self, from_s: float, to_s: float) -> float:
        """Multiply weights by this to move their landmark from ``from_s`` to ``to_s``."""
        if self.half_life_s is None:
            return 1.0
        return float(2.0 ** ((from_s - to_s) * self.inv_half_life))

    def choose_landmark(self, landmarks: list[float], latest_s: float) -> float:
        """A common landmark to merge sketches: the oldest, unless far too old.

        New samples up to ``latest_s`` then weigh at most ``2 ** 40``; a landmark more
        than :data:`MAX_SPREAD_HALF_LIVES` older is squashed (its weights raised to 1).
        """
        if self.half_life_s is None:
            return 0.0
        fresh = self.fresh_landmark(latest_s)
        if not landmarks:
            return fresh
        newest = max(*landmarks, fresh)
        return max(min(landmarks), newest - MAX_SPREAD_HALF_LIVES * self.half_life_s)


@dataclass(frozen=True, slots=True)
class GapPrior:
    """The answer when nothing was learned: a rough heavy-tailed gap, in seconds.

    The defaults are round numbers near the idle gaps of the two OpenHands traces in
    the repository (median under a second, a tail to tens of seconds). Quantiles in
    between are interpolated on a log scale.
    """

    p50_s: float = 0.5
    p90_s: float = 2.0
    p99_s: float = 15.0

    def __post_init__(self) -> None:
        if not 0.0 < self.p50_s <= self.p90_s <= self.p99_s < math.inf:
            raise ConfigError("GapPrior needs 0 < p50_s <= p90_s <= p99_s (finite seconds)")

    def quantile(self, q: float) -> float:
        """Return the prior's ``q`` quantile (log-linear between fixed anchor points)."""
        anchors = (
            (0.0, self.p50_s / 20.0),
            (0.5, self.p50_s),
            (0.9, self.p90_s),
            (0.99, self.p99_s),
            (1.0, self.p99_s * 4.0),
        )
        for (q0, v0), (q1, v1) in itertools.pairwise(anchors):
            if q <= q1:
                f = (q - q0) / (q1 - q0)
                return math.exp(math.log(v0) + f * (math.log(v1) - math.log(v0)))
        return anchors[-1][1]

    @property
    def mean_s(self) -> float:
        """The prior's mean: that of a log-normal through p50 and p90."""
        # EWMA tracks the mean: that of a log-normal through p50 and p90.
        sigma = math.log(self.p90_s / self.p50_s) / 1.2815515655446004
        mean = self.p50_s * math.exp(sigma * sigma / 2.0)
        return mean
