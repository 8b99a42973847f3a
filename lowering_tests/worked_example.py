"""Runs docs/adding-an-op.md's worked example in this process: each block as the module its heading names (the
package's modules by their dotted names, so that their relative imports resolve), the pass added to the pipeline's
fuse phase, then the example's tests. ``python lowering_tests/worked_example.py``; system/test_docs.py runs it in a
process of its own, so that the example's op and kernels register nowhere else."""

import linecache
import pathlib
import re
import sys
import types

ROOT = pathlib.Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^## \d+\. .*?`([\w/]+\.py)`\n(.*?)```python\n(.*?)```", re.S | re.M)


def blocks() -> list[tuple[str, str]]:
    """(path, code) of each block of the worked example, in order."""
    return [(path, code) for path, _, code in BLOCK.findall((ROOT / "docs/adding-an-op.md").read_text())]


def main() -> None:
    sys.path[:0] = [str(ROOT)]
    import conftest  # noqa: F401  (the Triton interpreter on a CPU, before any kernel loads)
    import turbo_inductor  # noqa: F401
    from turbo_inductor.passes import PASSES, Phase, check_order

    tests = {}
    for path, code in blocks():
        name = path.removesuffix(".py").replace("/", ".")
        module = types.ModuleType(name)
        module.__file__, module.__package__ = str(ROOT / path), name.rpartition(".")[0]
        sys.modules[name] = module
        # Triton's @jit reads a kernel's source through inspect, which finds a file absent from disk in linecache.
        linecache.cache[module.__file__] = (len(code), None, code.splitlines(True), module.__file__)
        exec(compile(code, module.__file__, "exec"), module.__dict__)
        if name.startswith("turbo_inductor."):
            setattr(sys.modules[module.__package__], name.rpartition(".")[2], module)
        else:
            tests.update({key: value for key, value in module.__dict__.items() if key.startswith("test_")})
        for value in module.__dict__.values():
            if isinstance(value, type) and getattr(value, "phase", None) is Phase.FUSE and value.__module__ == name:
                last_fuse = max(i for i, p in enumerate(PASSES) if p.phase is Phase.FUSE)
                PASSES.insert(last_fuse + 1, value())
    check_order(PASSES)
    assert tests, "the example's tests ran"
    for test_name, test in tests.items():
        test()
        print(f"passed {test_name}")


if __name__ == "__main__":
    main()
