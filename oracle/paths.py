"""Where the oracle keeps what outlives a run: the cache folder (`$KERNELSEARCH_CACHE`)."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_CACHE = Path(os.environ.get("KERNELSEARCH_CACHE", Path.home() / ".cache" / "kernelsearch"))
