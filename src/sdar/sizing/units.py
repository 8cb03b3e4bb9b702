"""Units and the error of the GPU sizing: GiB = 2**30 bytes, and SizingError for bad input (its
message says what was wrong and what to do)."""

GiB = 2**30


class SizingError(ValueError):
    """Bad input to the sizing; the message says what was wrong and what to do."""
