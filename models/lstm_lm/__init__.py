"""Word-level LSTM language model (Zaremba et al., 2014) on PTB-format text."""

import os


def shared_subset_dir() -> str:
    """The project's PTB subset (train and test splits, no validation
    split): `$TFGC_PTB_SUBSET`, else `shared/data/ptb-subset` beside the
    repository."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    default = os.path.join(
        os.path.dirname(os.path.abspath(repo)), "shared", "data", "ptb-subset"
    )
    return os.environ.get("TFGC_PTB_SUBSET", default)
