"""`gitops ui`: a read-only web UI over the status branch (`app` routes, `views` page data, `source` the
branch's mirror, `plans` a branch's plan, `serve` the server)."""
