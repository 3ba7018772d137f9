"""`dense`: no pruning. The reference every method is compared with (realized sparsity 0)."""

from bwprune.methods.base import PruningMethod


class Dense(PruningMethod):
    """Changes nothing; every interface call keeps its no-op default."""
