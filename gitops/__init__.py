"""gitops: a GitOps reconciler for self-hosted Kubernetes control planes and bare-metal hosts."""

__version__ = "0.1.0"
