"""Executing plans: the only stage that writes to hypervisors and BareMetalHosts."""
from gitops.apply.executor import ApplyError, Connections, Execution, Timing, execute

__all__ = ["ApplyError", "Connections", "Execution", "Timing", "execute"]
