"""A worker machine joining a gitops cluster: discovery, configuration, kubelet and kube-proxy.

Workers are not in the repo (as in oneinfra): `gitops join-token create` makes a
bootstrap token in the cluster, `gitops join` runs on the worker, `gitops leave`
takes it out again and leaves the machine as it was.
"""
