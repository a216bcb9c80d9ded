"""The one error every loader path raises for a bad checkpoint."""

from __future__ import annotations

import os


class CheckpointError(Exception):
    """A checkpoint file is missing, truncated, corrupt or not supported.

    The message always names the file, and the tensor where one is at fault, so a user can tell
    which of a sharded checkpoint's files to fetch again.
    """

    def __init__(self, path: str | os.PathLike[str], problem: str, tensor: str | None = None):
        self.path = os.fspath(path)
        self.tensor = tensor
        where = f"{self.path}: tensor {tensor!r}" if tensor else self.path
        super().__init__(f"{where}: {problem}")
