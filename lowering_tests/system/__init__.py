"""The backend, the pass pipeline, reliability, distributed runs, the docs, the versions, and the GPU suite."""
