"""patchkit: versioned patch series against pinned upstreams, for GPU inference stacks."""

__version__ = "0.1.0"
