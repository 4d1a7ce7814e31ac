"""Click parameter types of orch's options. No I/O.

``FiniteFloat``: every float option of orch. Click's ``float`` and ``FloatRange`` accept ``nan``
and ``inf`` (``nan`` passes every range check, since each comparison with it is false): then
``--timeout nan`` waited forever, ``wait_for_nodes`` polled with 0 s sleeps, and ``--kv-cache-gib
nan`` printed "short by nan GiB". A non-finite value is a usage error (exit 2).
"""

from __future__ import annotations

import math
from typing import Any

import click


class FiniteFloat(click.FloatRange):
    """A ``click.FloatRange`` (bounds optional) that refuses nan and +-inf."""

    name = "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            number = float(value)
        except (TypeError, ValueError):
            return super().convert(value, param, ctx)  # click's own "is not a valid float"
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(number, param, ctx)
