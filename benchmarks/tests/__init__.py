"""The harness's tests: the main job and the other benchmarks run small, their JSON, the goals, the READMEs and the
charts made of the committed results, the FP8 cost table made of its runs. ``python -m pytest benchmarks/tests``."""
