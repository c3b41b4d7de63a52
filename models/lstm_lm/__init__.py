"""Word-level LSTM language model (Zaremba et al., 2014) on PTB-format text."""
