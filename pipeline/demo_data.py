"""The demo's summarization task: Python functions from the standard library -> their docstrings.

Code-to-text summarization (the task of CodeSearchNet's docstring benchmarks) is the one real
summarization job whose data every machine already has: each documented function of the
standard library gives an input (the function with its docstring removed) and a human-written
reference summary (the docstring's first paragraph). Summaries copy parameter and attribute
names from their input, which is what prompt lookup feeds on.

Files are split by a hash of their path: one in ten is held out, and the demo's prompts come
only from held-out files.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import sysconfig
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path

_SKIP_PARTS = {"site-packages", "dist-packages", "__pycache__", "ensurepip"}  # not the stdlib's own code
_TEST_PARTS = {"test", "tests", "idlelib", "lib2to3", "turtledemo"}  # trained on, never a demo prompt


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None, max_file_bytes: int = 300_000, tests: bool = True) -> list[str]:
    """Relative paths of the stdlib's own ``.py`` files, sorted (deterministic for one Python).
    Test suites, IDLE and the like have documented functions too (a third more data); `tests=False`
    leaves them out, for prompts that show library code."""
    root = root or stdlib_root()
    skip = _SKIP_PARTS if tests else _SKIP_PARTS | _TEST_PARTS
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip and not d.startswith("."))
        for name in filenames:
            if not name.endswith(".py"):
                continue
            path = Path(dirpath) / name
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if 200 <= size <= max_file_bytes:
                out.append(path.relative_to(root).as_posix())
    return sorted(out)


def is_library(relpath: str) -> bool:
    """Not part of a test suite, IDLE or the like."""
    return not set(relpath.split("/")[:-1]) & _TEST_PARTS


def is_heldout(relpath: str, heldout_mod: int = 10) -> bool:
    return int(hashlib.sha1(relpath.encode()).hexdigest(), 16) % heldout_mod == 0


def split_files(files: Sequence[str], heldout_mod: int = 10) -> tuple[list[str], list[str]]:
    """(train, held-out): a stable split by a hash of each relative path."""
    return ([f for f in files if not is_heldout(f, heldout_mod)],
            [f for f in files if is_heldout(f, heldout_mod)])


def read_source(root: Path, rel: str) -> str | None:
    try:
        return (root / rel).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def summary_of(docstring: str) -> str:
    """The docstring's first paragraph on one line: what a reader of an index wants."""
    return " ".join(docstring.strip().split("\n\n")[0].split())


def functions(root: Path, rel: str, undocumented: bool = False) -> Iterator[dict]:
    """Documented functions of one file: {code (docstring removed), summary, file, name, params, line};
    with `undocumented`, the functions without a docstring instead (summary None)."""
    try:
        source = (root / rel).read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return
    lines = source.splitlines(keepends=True)
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or len(node.body) < 2:
            continue  # undocumented, or nothing but a docstring
        doc = ast.get_docstring(node, clean=True)
        start = (node.decorator_list[0].lineno if node.decorator_list else node.lineno) - 1
        if undocumented:
            if doc is None:
                yield {"code": textwrap.dedent("".join(lines[start:node.end_lineno])).rstrip() + "\n", "summary": None,
                       "file": rel, "name": node.name, "params": _params(node), "line": node.lineno}
            continue
        if not doc or not isinstance(node.body[0], ast.Expr):
            continue
        summary = summary_of(doc)
        first = node.body[0]
        code = textwrap.dedent("".join(lines[start:first.lineno - 1] + lines[first.end_lineno:node.end_lineno]))
        if summary and code.strip():
            yield {"code": code.rstrip() + "\n", "summary": summary, "file": rel, "name": node.name,
                   "params": _params(node), "line": node.lineno}


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = node.args
    return [a.arg for a in (*args.posonlyargs, *args.args, args.vararg, *args.kwonlyargs, args.kwarg) if a]


_WORD = re.compile(r"[A-Za-z]+")
_FILLER = {"the", "a", "an", "of", "to", "and", "in", "is", "for", "if", "or", "this", "it", "be", "that", "with",
           "as", "on", "by"}


def grounding(example: dict) -> float:
    """Share of the summary's content words (snake_case split, lower case) that occur in the code."""
    def words(text: str) -> set[str]:
        return {w.lower() for w in _WORD.findall(text.replace("_", " "))}
    summary = words(example["summary"]) - _FILLER
    return len(summary & words(example["code"])) / len(summary) if summary else 0.0


def examples(files: Sequence[str], root: Path | None = None) -> list[dict]:
    root = root or stdlib_root()
    return [ex for rel in files for ex in functions(root, rel)]


_IDENTIFIER = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")


def identifier_words(name: str) -> str:
    """`_is_dataclassInstance` -> "is dataclass instance" (lower case, as mid-sentence words)."""
    return " ".join(re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name).replace("_", " ").split()).lower()


def split_identifiers(code: str) -> str:
    """Every compound identifier written as its words: `self._user_id = getUserId()` ->
    `self.user id = get user id()`. A byte-level BPE would cut `_user_id` into `_user` and `_id`,
    tokens that never occur in a summary, which says ` user` and ` id`; split, the code's names
    and the summary's words are the same tokens, and a small model can learn to copy them."""
    def words(m: re.Match) -> str:
        name = m.group(0)
        split = identifier_words(name)
        return split if split and (" " in split or name.startswith("_")) else name
    return _IDENTIFIER.sub(words, code)

