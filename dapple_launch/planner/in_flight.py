"""How many micro-batches a device has room to keep at once, and so how many holds one of them
must run one after another: the memory term that copies, ZB-H1, the device groups and 1F1B's proof
share (copies_bound, bounds, shape_memory, recompute_room). Pure numpy."""

from __future__ import annotations

import numpy as np


def fitting(room, kept):
    """K = floor(room / kept): the micro-batches of `kept` bytes that fit in `room` at once; inf where
    a micro-batch keeps nothing, -1 where there is no room at all (room < 0). Arrays broadcast."""
    with np.errstate(divide="ignore", invalid="ignore"):
        most = np.where(kept > 0, np.floor(room / np.where(kept > 0, kept, 1.0) * (1 + 1e-9)), np.inf)
    return np.where(room >= 0, most, -1.0)


def runs_of_holds(room, kept, turns):
    """ceil(turns / K), K = fitting(room, kept): holds of which at most K overlap split into K runs of
    disjoint ones (an interval graph's colouring), so one run holds this many one after another. At
    least one run of one where a micro-batch keeps nothing (K inf); inf where none fits (K < 1)."""
    most = fitting(room, kept)
    with np.errstate(invalid="ignore"):
        return np.where(most >= 1, np.maximum(1.0, np.ceil(turns / np.maximum(most, 1.0))), np.inf)
