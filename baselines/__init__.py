"""Baseline pruning methods, one file each, each a `bwprune.methods.base.PruningMethod`."""
