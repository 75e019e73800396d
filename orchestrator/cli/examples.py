"""`corral examples [DIR]`: write the example jobs, queues and workers where a user can run them.

They ship inside the package (`orchestrator/examples`, a link to the checkout's
examples/ that the wheel stores as files), so the README's commands work after
a plain `pip install`: `corral examples` writes `examples/` into the current
directory, and `corral submit examples/jobs/train.yaml` from there runs
`python3 examples/worker.py` in that directory (the submitter's, see
orchestrator/cli/submitter.py).

`worker.py` is written as the toy worker's own source (orchestrator/demo_worker.py,
standard library only), not the checkout's wrapper that imports it: it runs
under any `python3` on a node, corral installed there or not.
"""

from __future__ import annotations

import argparse
import importlib.resources
import sys
from collections.abc import Callable
from importlib.resources.abc import Traversable
from pathlib import Path

from orchestrator.cli.errors import OK, USAGE, CliError

#: The written file whose text comes from a module instead (self-contained, see above).
FROM_MODULE = {"worker.py": "demo_worker.py"}


def example_files() -> dict[str, bytes]:
    """Relative path -> bytes of every example file the package holds."""
    root = importlib.resources.files("orchestrator") / "examples"
    if not root.is_dir():
        raise CliError("this corral has no examples (orchestrator/examples is missing from the install)")
    out: dict[str, bytes] = {}

    def walk(node: Traversable, prefix: str) -> None:
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            rel = f"{prefix}{child.name}"
            if child.is_dir():
                if child.name != "__pycache__":
                    walk(child, rel + "/")
            elif child.name.endswith((".py", ".yaml", ".md")):
                out[rel] = child.read_bytes()

    walk(root, "")
    for name, module in FROM_MODULE.items():
        if name in out:
            out[name] = (importlib.resources.files("orchestrator") / module).read_bytes()
    return out


def write_examples(dest: Path, *, force: bool = False) -> list[Path]:
    """Write every example under `dest`; refuses (exit 2) to overwrite a file that differs unless `force`.

    Nothing to write where `dest` is the package's own examples (a checkout's examples/, an editable install).
    """
    root = importlib.resources.files("orchestrator") / "examples"
    if isinstance(root, Path) and dest.resolve() == root.resolve():
        return []
    return write_files(dest, example_files(), force=force, executable=lambda rel: rel.endswith(".py"))


def write_files(dest: Path, files: dict[str, bytes], *, force: bool = False,
                executable: Callable[[str], bool] = lambda rel: False) -> list[Path]:
    """Write `files` (relative path -> bytes) under `dest`, the files corral ships for users to keep
    (`corral examples`, `corral monitoring`); refuses (exit 2) to overwrite a file that differs unless `force`."""
    clashes = [rel for rel, data in files.items()
               if (dest / rel).exists() and ((dest / rel).is_dir() or (dest / rel).read_bytes() != data)]
    if clashes and not force:
        raise CliError(f"{dest} already has {', '.join(clashes[:5])}{' ...' if len(clashes) > 5 else ''} "
                       "(different from corral's): --force overwrites", USAGE)
    written = []
    for rel, data in files.items():
        path = dest / rel
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        except OSError as e:
            raise CliError(f"cannot write {path}: {e.strerror or e}", USAGE) from None
        if executable(rel):
            path.chmod(0o755)
        written.append(path)
    return written


async def examples(args: argparse.Namespace) -> int:
    dest = Path(args.dir)
    written = write_examples(dest, force=args.force)
    if not written:
        print(f"{dest}/ holds corral's own examples already (a checkout's): nothing to write", file=sys.stderr)
        return OK
    print(f"wrote {len(written)} files to {dest}/ (see its README.md; the jobs name examples/worker.py, so "
          "submit them from the directory that holds examples/)", file=sys.stderr)
    for path in written:
        print(path)
    return OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("examples", help="write the example jobs, queues and workers into a directory",
                       description="Write the example job specs, queue file and worker scripts (those of the "
                                   "README) into DIR (default ./examples). Jobs run in the directory they are "
                                   "submitted from, so submit them from DIR's parent, as the README does.")
    p.add_argument("dir", nargs="?", default="examples", metavar="DIR", help="where (default: ./examples)")
    p.add_argument("--force", action="store_true", help="overwrite files that differ")
    p.set_defaults(handler=examples)
