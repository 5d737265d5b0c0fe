"""Several controllers at once: Kubernetes Leases (coordination.k8s.io/v1) for leader election and shards.

`lease` talks to the API (one Lease: read, create, acquire or renew, release, with
optimistic concurrency), `shards` maps cluster names to shards, `member` is one
replica's view: which shard Leases it holds, renewed in a background thread, and
whether a hold is fresh enough to act on (fencing). Low in the layers: it knows
nothing of plans, apply or the repo model.
"""
