"""Onboarding a machine as a Hypervisor of the fleet (`gitops hypervisor`): what the machine runs (its
containerd's settings, a key made there, a TLS-only CRI front) and what the fleet side signs."""
