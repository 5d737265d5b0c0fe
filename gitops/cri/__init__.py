"""CRI runtime.v1 (knows no repo model): the client that talks to a container runtime at a
CRIEndpoint over gRPC (`client`), and its data types, which need no gRPC (`types`, `endpoint`, `errors`).
Import what you need from its module: this package loads no gRPC by itself.
"""
