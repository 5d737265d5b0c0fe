"""Executing plans: the only stage that writes to hypervisors and BareMetalHosts."""
from gitops.apply.executor import ApplyError, Connections, Execution, execute

__all__ = ["ApplyError", "Connections", "Execution", "execute"]
