"""The stop rule: when a correct kernel is fast enough, its chain is done and (with early stop) its task."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StopRule:
    target_speedup: float = 1.0  # x eager PyTorch
    early_stop: bool = True  # stop the whole task, cancelling its outstanding samples

    def reached(self, status: str, speedup_vs_eager: float | None) -> bool:
        """A verified-correct kernel at the target speedup or above."""
        return status == "correct" and (speedup_vs_eager or 0.0) >= self.target_speedup

    def ends_chain(self, status: str, speedup_vs_eager: float | None) -> bool:
        """A refinement chain has nothing left to do once its last kernel reached the target."""
        return self.reached(status, speedup_vs_eager)

    def stops_task(self, status: str, speedup_vs_eager: float | None) -> bool:
        """The task stops (its other samples are cancelled) only under early stop."""
        return self.early_stop and self.reached(status, speedup_vs_eager)
