"""Applying plans: the only stage that writes to hypervisors."""
from gitops.apply.executor import ApplyError, ApplyResult, MassDeleteRefused, apply

__all__ = ["ApplyError", "ApplyResult", "MassDeleteRefused", "apply"]
