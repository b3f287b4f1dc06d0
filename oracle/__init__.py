"""The oracle: build, verify and time candidate kernels in isolated workers, and give verdicts."""

from oracle.candidate import Candidate
from oracle.evaluate import BuildOutcome, Oracle, OracleConfig
from oracle.verdict import STATUSES, Verdict

__all__ = ["BuildOutcome", "Candidate", "Oracle", "OracleConfig", "STATUSES", "Verdict"]
