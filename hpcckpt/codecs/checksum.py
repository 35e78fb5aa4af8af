"""Checksums of checkpoint data (local): XXH3-64 (docs/CODECS.md; its speed: docs/BENCHMARKS.md)."""
import xxhash

ALGORITHM = "xxh3_64"


def new_hasher():
    """A streaming hasher; ``update(buffer)`` then ``hexdigest()``."""
    return xxhash.xxh3_64()


def digest(buffer):
    """Checksum of one whole buffer, as lowercase hex."""
    return xxhash.xxh3_64_hexdigest(buffer)


def hexdigest_of(value):
    """The hex form of an integer digest, as ``hexdigest()`` writes it."""
    return format(value, "016x")
