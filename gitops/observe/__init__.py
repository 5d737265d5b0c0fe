"""Live state, read-only: the managed pods, containers and node files on every hypervisor
(`hypervisors`) and what gitops keeps inside each cluster's API (`clusters`); what they report is
pure data (`types`), which planning reads without importing any reader.
"""
