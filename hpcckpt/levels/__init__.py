"""Checkpoint levels: local (node-local cache); partner, xor, rs and pfs build on it."""
