"""Prices of cross-zone bytes.

A price is USD per GB (10^9 bytes) that **crosses** a zone boundary, i.e. what the bill
says for one byte going from zone A to zone B, both sides included:

- ``aws``: $0.01/GB charged on egress and $0.01/GB on ingress -> $0.02 per GB crossing
  (EC2 data transfer "within the same AWS Region ... across Availability Zones").
- ``gcp``: $0.01/GB, charged once (egress between zones in the same region).
- ``azure``: $0 (inter-availability-zone transfer is not billed at the time of writing).
- a number: USD per GB crossing, as given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agent.errors import InputError

#: named prices, USD per GB (1e9 bytes) crossing a zone boundary
NAMED_PRICES: dict[str, float] = {"aws": 0.02, "gcp": 0.01, "azure": 0.0}
#: seconds in a month, the same everywhere (report, demo, recording rules, dashboard): the mean
#: Gregorian month, 365.2425 / 12 days = 30.44 days = 2,629,746 s
SECONDS_PER_MONTH = 2_629_746
#: bytes in the report's GB
BYTES_PER_GB = 1e9


@dataclass(frozen=True, slots=True)
class Price:
    """A cross-zone price.

    Attributes:
        name: ``aws``, ``gcp``, ``azure`` or ``custom``.
        usd_per_gb_crossing: USD per 10^9 bytes that cross a zone boundary (both sides).
    """

    name: str
    usd_per_gb_crossing: float

    def usd_per_month(self, bytes_per_second: float) -> float:
        """USD a month (30.44 days: :data:`SECONDS_PER_MONTH`) for a steady ``bytes_per_second``
        of cross-zone traffic."""
        return bytes_per_second * SECONDS_PER_MONTH / BYTES_PER_GB * self.usd_per_gb_crossing

    def describe(self) -> str:
        """One line stating the price and how it was derived."""
        if self.name == "aws":
            return "aws: $0.01/GB on each side = $0.02 per GB crossing zones"
        if self.name == "gcp":
            return "gcp: $0.01 per GB crossing zones (charged once)"
        if self.name == "azure":
            return "azure: $0 per GB crossing zones (not billed)"
        return f"custom: ${self.usd_per_gb_crossing:g} per GB crossing zones"


def parse_price(text: str) -> Price:
    """Parse ``--price``: ``aws``, ``gcp``, ``azure`` or a non-negative USD per GB number.

    Raises:
        InputError: unknown name, negative or non-finite number.
    """
    key = text.strip().lower()
    if key in NAMED_PRICES:
        return Price(key, NAMED_PRICES[key])
    try:
        value = float(key.lstrip("$"))
    except ValueError:
        raise InputError(f"unknown price {text!r} (use aws, gcp, azure or USD per GB, e.g. 0.02)",
                         source="--price") from None
    if not math.isfinite(value) or value < 0:
        raise InputError(f"price {text!r} must be a non-negative number of USD per GB",
                         source="--price")
    return Price("custom", value)
