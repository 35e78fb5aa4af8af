"""hpcckpt: multilevel checkpointing for MPI + NumPy applications."""
__version__ = "0.1.0"

from .errors import (  # noqa: F401
    HpcCkptError, ConfigError, ProtectError, MismatchError, LayoutChangedError, IncompatibleCheckpointError,
    CorruptCheckpointError, CheckpointWriteError, ConcurrentJobError, CollectiveError,
    ULFMUnsupportedError, OnlineRecoveryError)
from .config import Config  # noqa: F401,E402
from .state import PER_RANK, REPLICATED, ROOT, ROWS, Block, Layout  # noqa: F401,E402

__all__ = ["Checkpointer", "CheckpointInfo", "Config", "HpcCkptError", "ConfigError", "ProtectError",
           "MismatchError", "LayoutChangedError", "IncompatibleCheckpointError", "CorruptCheckpointError", "CheckpointWriteError",
           "ConcurrentJobError", "CollectiveError", "ULFMUnsupportedError", "OnlineRecoveryError", "Layout", "Block", "PER_RANK", "ROWS", "REPLICATED", "ROOT",
           "interval", "online"]


def __getattr__(name):
    # Lazy: importing mpi4py initialises MPI, which the command line (list, verify, …) does not need.
    if name in ("Checkpointer", "CheckpointInfo"):
        from . import checkpointer
        return getattr(checkpointer, name)
    if name in ("interval", "simulate", "online"):
        import importlib
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'hpcckpt' has no attribute {name!r}")
