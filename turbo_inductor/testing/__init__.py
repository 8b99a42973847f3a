"""Models shared by the tests and the benchmarks: written the way Hugging Face writes them, with random weights."""
