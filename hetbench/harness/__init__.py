"""The harness: warm-up, repeats, device-synchronised timing, statistics, verification and metadata."""
