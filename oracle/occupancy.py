"""A count of things in one stage of the oracle that says when the stage empties and when it fills again.

The oracle actor counts its candidates from their arrival to the end of their build: while none is being
built or waiting to be, the build cores are free, and the torch.compile baselines may use more of them
(`Oracle.builds_idle`). Told once per change, not per candidate.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator


class Occupancy:
    def __init__(self, on_empty: Callable[[bool], None]) -> None:
        """`on_empty(True)` when the last holder leaves, `on_empty(False)` when the first one comes."""
        self.count = 0
        self._on_empty = on_empty

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """One holder in the stage for the block. Not thread-safe: for one event loop's tasks."""
        self.count += 1
        if self.count == 1:
            self._on_empty(False)
        try:
            yield
        finally:
            self.count -= 1
            if self.count == 0:
                self._on_empty(True)
