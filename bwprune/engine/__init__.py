"""The decode engine: the one driver of the pruning-method protocol and its sparsity ledger."""
