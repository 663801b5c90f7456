"""fastln's benchmarks: run.py (the wide grid), rnn.py (LN-RNN), plots.py; harness.py
holds the machinery they share."""
