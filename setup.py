"""Installs the turbo_inductor package and, where torch can build them, its native kernels (``csrc/``).

The native kernels build when torch has CUDA or ROCm and the toolkit (nvcc / hipcc) is there; otherwise the
pure-Python package is installed (the Triton and reference kernels then serve every op). The build says on stdout
whether it built them, and if not, why. Environment:
  GPU_ARCHS  ';'-separated targets: sm_90, sm_100a, gfx942, gfx950, native (the GPU of this machine); default: the
             GPU of this machine, else every architecture this torch supports from sm_80 on (or PYTORCH_ROCM_ARCH);
  MAX_JOBS   parallel compile jobs (read by torch's BuildExtension);
  TURBO_INDUCTOR_NATIVE=0  skip the native kernels; =1  require them (the install fails, with the reason, wherever
             they are not built; by default it installs the package without them and says why).
"""

import glob
import os
import sys

from setuptools import find_packages, setup


def _native_archs(spec: str, torch, rocm: bool) -> list[str]:
    """GPU_ARCHS in the spelling torch's extension builder takes: "9.0" (TORCH_CUDA_ARCH_LIST) or "gfx942"
    (PYTORCH_ROCM_ARCH). Targets of the other vendor are left out."""

    def detected() -> str:
        if rocm:
            return torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
        return "{}.{}".format(*torch.cuda.get_device_capability(0))

    wanted = [a.strip() for a in spec.split(";") if a.strip()]
    if not wanted:
        if torch.cuda.is_available():
            wanted = ["native"]
        elif rocm:
            wanted = os.environ.get("PYTORCH_ROCM_ARCH", "gfx942;gfx950").split(";")
        else:
            wanted = [a for a in torch.cuda.get_arch_list() if a.startswith("sm_") and int(a[3:5]) >= 80]
    archs = []
    for arch in wanted:
        if arch == "native":
            if not torch.cuda.is_available():
                raise SystemExit("turbo_inductor: GPU_ARCHS names 'native' but no GPU is visible")
            archs.append(detected())
        elif arch.startswith("sm_") and not rocm:
            archs.append(f"{arch[3]}.{arch[4:]}" if len(arch) >= 5 else arch)
        elif arch.startswith("gfx") and rocm:
            archs.append(arch)
        elif not (arch.startswith("sm_") or arch.startswith("gfx")):
            raise SystemExit(f"turbo_inductor: GPU_ARCHS entry {arch!r} is not sm_XX, gfxNNN or native")
    return archs


# pip install "turbo_inductor[rocm]": AMD's kernel library, an implementation of some kernels on ROCm
# (turbo_inductor/kernels/aiter/). requirements.txt pins the version whose signatures the CPU tests check.
EXTRAS = {"rocm": ["amd-aiter>=0.1.7.post2.dev18"]}
BUILD_COMMANDS = {"build", "build_ext", "bdist_wheel", "editable_wheel", "develop", "install"}


def say(message: str) -> None:
    """``message`` on stdout, once per install: pip runs this file for its metadata too, where nothing is built."""
    if BUILD_COMMANDS & set(sys.argv[1:]):
        print(f"turbo_inductor: {message}", flush=True)


def say_skipped(reason: str) -> None:
    say(
        f"native kernels skipped ({reason}); installing the Python package alone, whose Triton and reference "
        "kernels serve every op"
    )


def optional_build(build_ext: type, required: bool, targets: str = "") -> type:
    """``build_ext`` that says whether it built the native kernels (for ``targets``). Its failure (a toolkit that
    does not match torch's CUDA, a compiler error) installs the package without them, unless they are ``required``."""

    class OptionalNativeBuild(build_ext):
        def build_extensions(self):
            try:
                super().build_extensions()
            except Exception as error:  # noqa: BLE001  (compilers and torch's checks raise all kinds)
                if required:
                    raise
                last_line = (str(error).strip().splitlines() or [repr(error)])[-1]
                say_skipped(f"their build failed: {last_line}; TURBO_INDUCTOR_NATIVE=1 shows the whole error")
                self.extensions = []  # nothing to copy into the package
                return
            say(f"native kernels built{f' for {targets}' if targets else ''}")

    return OptionalNativeBuild


def native_extension() -> tuple[list, dict]:
    """(ext_modules, cmdclass) for the native kernels, or ([], {}) after saying why they are skipped.
    With TURBO_INDUCTOR_NATIVE=1, a reason to skip them ends the install instead."""
    required = os.environ.get("TURBO_INDUCTOR_NATIVE") == "1"

    def skip(reason: str) -> tuple[list, dict]:
        if required:
            raise SystemExit(f"turbo_inductor: TURBO_INDUCTOR_NATIVE=1 requires the native kernels, but {reason}")
        say_skipped(reason)
        return [], {}

    if os.environ.get("TURBO_INDUCTOR_NATIVE", "1") == "0":
        return skip("TURBO_INDUCTOR_NATIVE=0")
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        return skip("torch is not importable while building: install with --no-build-isolation")
    rocm = torch.version.hip is not None
    if torch.version.cuda is None and not rocm:
        return skip(f"torch {torch.__version__} is built for neither CUDA nor ROCm")
    if (cpp_extension.ROCM_HOME if rocm else cpp_extension.CUDA_HOME) is None:
        return skip("no ROCm toolkit found" if rocm else "no CUDA toolkit (nvcc) found: set CUDA_HOME")
    archs = _native_archs(os.environ.get("GPU_ARCHS", ""), torch, rocm)
    if not archs:
        return skip(f"GPU_ARCHS={os.environ.get('GPU_ARCHS')!r} names no {'ROCm' if rocm else 'CUDA'} target")
    os.environ["PYTORCH_ROCM_ARCH" if rocm else "TORCH_CUDA_ARCH_LIST"] = ";".join(archs)
    say(f"building the native kernels for {';'.join(archs)}")
    sources = sorted(glob.glob("csrc/*.cu")) + sorted(glob.glob("csrc/*.cpp"))
    extension = cpp_extension.CUDAExtension(
        "turbo_inductor._native", sources, extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3"]}
    )
    return [extension], {"build_ext": optional_build(cpp_extension.BuildExtension, required, ";".join(archs))}


if __name__ == "__main__":  # as pip's build backend runs it; lowering_tests/kernels/test_native.py imports the helpers
    ext_modules, cmdclass = native_extension()
    setup(
        name="turbo_inductor",
        version="0.1.0",
        description="torch.compile backend 'primus_turbo': fused RMSNorm, SwiGLU, FP8 linear and GEMM+all-reduce "
        "kernels",
        packages=find_packages(include=["turbo_inductor", "turbo_inductor.*"]),
        package_data={"turbo_inductor.costs": ["*.json"]},  # the FP8 cost tables
        python_requires=">=3.10",
        install_requires=["torch>=2.11"],
        extras_require=EXTRAS,
        ext_modules=ext_modules,
        cmdclass=cmdclass,
        entry_points={"torch_dynamo_backends": ["primus_turbo = turbo_inductor.backend:primus_turbo"]},
    )
