"""Pieces every main shares: flags, config, strategy, callbacks, summary.

Only the mains read flags. Everything here below `flags.py` takes a
`CommonConfig` (or plain arguments) so that it can be used without absl.
"""

from models.common.config import (
    ALL_REDUCE_ALGS,
    STRATEGIES,
    CommonConfig,
)

__all__ = ["ALL_REDUCE_ALGS", "STRATEGIES", "CommonConfig"]
