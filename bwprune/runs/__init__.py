"""Run-folder bookkeeping: identity and key, the recorder and its lock, metrics from the rows,
rescoring, shards, pairing with dense, speedups, provenance and W&B tracking."""
