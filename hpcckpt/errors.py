"""The exception hierarchy. Every exception hpcckpt raises on purpose derives from HpcCkptError."""


class HpcCkptError(Exception):
    """Base class of every error hpcckpt raises on purpose.

    Fields that hpcckpt.comm sets when the error crosses ranks (the class defaults otherwise):
    ``collective``, raised on every rank of one collective call (so no rank aborts the job for
    it: comm.mark_collective); ``reason``, the first failing rank's own words, not wrapped again
    when the error is agreed once more; ``different_calls``, the ranks made different hpcckpt
    calls (the application's ranks diverged: never handled as a failure of a step).
    """
    collective = False
    reason = None
    different_calls = False


class ConfigError(HpcCkptError):
    """A configuration key, value or file is wrong."""


class ProtectError(HpcCkptError):
    """A value given to protect() or checkpoint(state=...) cannot be checkpointed (wrong kind,
    layout or name)."""


class MismatchError(HpcCkptError):
    """The protected arrays do not match the checkpoint being restored (names, shapes, dtypes)."""


class LayoutChangedError(MismatchError):
    """A rank declares another block of a global array (Block: global shape or offset) than the
    node cache holds for it; only the pfs level restores blocks into another decomposition."""


class IncompatibleCheckpointError(HpcCkptError):
    """A checkpoint belongs to another job (name, world size) or another format version."""


class CorruptCheckpointError(HpcCkptError):
    """A checkpoint file is missing, truncated, unparsable or fails its checksum."""


class CheckpointWriteError(HpcCkptError):
    """Writing a checkpoint failed on at least one rank; the previous checkpoint is untouched."""


class ConcurrentJobError(HpcCkptError):
    """Another job with the same name is using the same cache or pfs directory."""


class CollectiveError(HpcCkptError):
    """A collective call failed on some ranks; raised on every rank.

    ``errors`` maps each failing rank to its message.
    """

    def __init__(self, message, errors=None):
        super().__init__(message)
        self.errors = dict(errors or {})


class ULFMUnsupportedError(ConfigError):
    """Online recovery was asked for under an MPI (or a launch) without ULFM fault tolerance."""


class OnlineRecoveryError(HpcCkptError):
    """Online recovery cannot continue the job (more failures than spare ranks, a recovery that
    did not complete in time, no checkpoint that every new rank can restore); raised on every
    surviving process."""


ALL = {cls.__name__: cls for cls in (
    HpcCkptError, ConfigError, ProtectError, MismatchError, LayoutChangedError, IncompatibleCheckpointError,
    CorruptCheckpointError, CheckpointWriteError, ConcurrentJobError, CollectiveError, ULFMUnsupportedError,
    OnlineRecoveryError)}
