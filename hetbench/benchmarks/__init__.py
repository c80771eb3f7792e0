"""Benchmarks: each module says what it computes, its flop and byte counts, and what the right answer is."""
