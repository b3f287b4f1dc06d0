"""Messages between the oracle and its worker processes: JSON over a pipe, never pickle.

The worker runs untrusted code, so the trusted side reads only bytes it parses as JSON (unpickling what a
candidate could write would let it run code in the oracle). Tensors travel as files, loaded with
`torch.load(weights_only=True)`, which builds plain tensors and nothing else.
"""

from __future__ import annotations

import json
from multiprocessing.connection import Connection
from typing import Any

MAX_MESSAGE = 16 * 1024 * 1024


def send(conn: Connection, **message: Any) -> None:
    conn.send_bytes(json.dumps(message, default=str).encode())


def receive(conn: Connection) -> dict[str, Any]:
    """One message; raises ValueError on anything that is not a JSON object of sane size."""
    data = conn.recv_bytes(MAX_MESSAGE)
    message = json.loads(data.decode())
    if not isinstance(message, dict):
        raise ValueError("worker sent a message that is not a JSON object")
    return message
