"""etcd backups: snapshots of a cluster's etcd kept in restic repositories (issue #29).

`targets` says how each kind of repository is reached, `restic` runs restic against one,
`etcdsnapshot` streams a snapshot from the healthiest member, `take` joins them.
"""
