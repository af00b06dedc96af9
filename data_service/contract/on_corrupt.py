"""What a pipeline does with a sample whose bytes are damaged: one value, parsed once where the
option enters (a pipeline option, ``hetero index --on-corrupt``, a reader's argument).

``FAIL`` stops the epoch with an error naming the sample, its file or shard and the fix; ``SKIP``
drops the sample, counted in the data server's ``samples_skipped`` (a batch whose every sample
was skipped is an error naming its shards). A ``str`` enum: it compares equal to ``"fail"`` and
``"skip"``, and prints as them.
"""
from __future__ import annotations

import enum

from ..errors import ConfigError


class OnCorrupt(str, enum.Enum):
    FAIL = "fail"
    SKIP = "skip"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: object, name: str = "on_corrupt") -> "OnCorrupt":
        """``value`` as an OnCorrupt (an OnCorrupt, or its name).

        Raises:
            ConfigError: anything else, naming the value and both choices.
        """
        if isinstance(value, cls):
            return value
        try:
            return cls(value)
        except ValueError:
            raise ConfigError(f"{name}={value!r} must be 'fail' (stop, naming the sample and the fix) or 'skip' "
                              "(drop the sample, counted in samples_skipped)") from None
