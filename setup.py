from setuptools import find_packages, setup

setup(
    name="turbo_inductor",
    version="0.1.0",
    description="torch.compile backend 'primus_turbo': fused RMSNorm, SwiGLU, FP8 linear and GEMM+all-reduce kernels",
    packages=find_packages(include=["turbo_inductor", "turbo_inductor.*"]),
    python_requires=">=3.10",
    install_requires=["torch>=2.11"],
    entry_points={"torch_dynamo_backends": ["primus_turbo = turbo_inductor.backend:primus_turbo"]},
)
