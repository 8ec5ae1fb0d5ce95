"""A command's start-up with the cyclic garbage collector held.

A command's start-up is almost all imports and building (modules, pydantic's schemas, a service's
routes), and nearly everything it allocates lives as long as the process: importing a relay's
modules allocates about 94,000 objects the collector tracks, and a full collection of them then
frees 5. With the default thresholds the collector still walks that growing heap over and over
while it is built (222 young, 20 middle and 1 full collection for a relay's imports). Reference
counting frees what start-up drops whatever the collector does; what it leaves is a few hundred
objects in cycles, collected once the block ends or, for a service, frozen with the rest of its
start-up (``teaagent.cli._serve``).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collector_held"]


@contextmanager
def collector_held() -> Iterator[None]:
    """Hold the cyclic garbage collector for the block; it runs again after, however the block ends.

    A block inside another, or one entered while the collector is off (a caller's choice), leaves
    it as it was.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
