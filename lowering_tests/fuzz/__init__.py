"""The rewrite fuzzer: random models chained from blocks, each block knowing which rewrites it must get.
``blocks/`` holds the blocks, one module per family; ``driver.py`` draws an example from its seed and checks it.
passes/test_fuzz_rewrites.py runs it."""
