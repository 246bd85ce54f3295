"""Build the context workloads shipped in draftnas/data/prompts: edit, code-qa and doc-qa.

Material we may ship, its licence in each prompt's `source`:
- edit and code-qa: functions and classes of CPython's standard library (PSF-2.0), read from the Python
  that runs this script;
- doc-qa: sections of this repository's own guides (Apache-2.0, as the package).

The choice is deterministic given the sources (sorted files, a fixed seed): run it again to rebuild the
sets, `python scripts/make_workloads.py [edit|code-qa|doc-qa ...]` (it rewrites the files named, all three
by default). doc-qa reads the guides as they are now: rebuilding it after the guides change changes the set.
"""

from __future__ import annotations

import ast
import json
import random
import re
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "draftnas" / "data" / "prompts"
PER_SET = 36
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"
EDIT_SET = 72  # edit is the workload whose search a bench holds to its prediction: twice the prompts
STDLIB_MODULES = (
    "argparse", "csv", "configparser", "difflib", "email/_header_value_parser", "ftplib", "gettext",
    "http/cookiejar", "imaplib", "inspect", "json/encoder", "json/decoder", "logging/__init__",
    "logging/handlers", "mailbox", "netrc", "optparse", "pathlib", "pickletools", "platform", "plistlib",
    "pprint", "shutil", "smtplib", "string", "tarfile", "textwrap", "tokenize", "trace", "urllib/parse",
    "urllib/request", "uuid", "zipfile", "calendar", "cmd", "fractions", "statistics", "shlex", "sched",
)
EDITS = (
    "Add type hints to every parameter and to the return value of this function. Keep everything else as "
    "it is, and return the whole function.",
    "Add a docstring to this function that says what it does, its arguments and what it returns. Keep the "
    "code unchanged and return the whole function.",
    "Add error handling to this function: where an argument could be None, raise a ValueError with a clear "
    "message. Return the whole updated function.",
    "Rename the local variable `{var}` to `{new}` everywhere in this function. Change nothing else and "
    "return the whole function.",
    "Add logging to this function: a `logger.debug` call when it starts (with its arguments) and before "
    "each return. Return the whole updated function.",
    "Rewrite this function so that every string formatting uses f-strings, and add a short comment above "
    "each loop saying what it does. Return the whole function.",
)
QUESTIONS = (
    "Explain step by step what this code does.",
    "What does each function or method here return, and in which cases does it raise an exception?",
    "List the parameters of each function here and what each one is for.",
    "Are there edge cases this code does not handle? Point to the lines and suggest fixes.",
    "Write unit tests (pytest) for the main function in this code.",
)
DOC_QUESTIONS = (
    "Summarise this document in a few bullet points, keeping its commands and flags exactly as written.",
    "List every command and flag this document mentions, each with what the document says it does.",
    "According to this document, what should a user run first, and what does it produce? Quote the "
    "commands.",
    "Rewrite this section as a short FAQ (questions and answers) that keeps every command verbatim.",
)


def stdlib_file(name: str) -> Path:
    return Path(sysconfig.get_paths()["stdlib"]) / f"{name}.py"


def functions(path: Path, low: int, high: int) -> list[tuple[str, str]]:
    """(qualified name, source) of functions and methods of `low`..`high` lines in a module."""
    text = path.read_text("utf-8")
    tree = ast.parse(text)
    lines = text.splitlines()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.end_lineno is not None:
            n = node.end_lineno - node.lineno + 1
            if low <= n <= high:
                body = lines[node.lineno - 1 : node.end_lineno]
                indent = min(len(x) - len(x.lstrip()) for x in body if x.strip())
                found.append((node.name, "\n".join(x[indent:] for x in body)))
    return found


def local_name(source: str) -> str | None:
    """A local variable the function assigns (for the rename edit), longest first, if any."""
    found = set(re.findall(r"^\s+([a-z_][a-z0-9_]{2,})\s*=[^=]", source, re.M))
    names = sorted(found, key=lambda s: (-len(s), s))  # ties by name: the same set whatever the hash seed
    return names[0] if names else None


def edit_set(rng: random.Random) -> list[dict[str, str]]:
    """EDIT_SET prompts: one function per module first (the first PER_SET are the set as first shipped), then
    a second function of each module, so that a held-out third of the set is large enough for a bench whose
    median a search can be held to."""
    pool = [(m, f, s) for m in STDLIB_MODULES for f, s in functions(stdlib_file(m), 18, 70)]
    rng.shuffle(pool)
    rows: list[dict[str, str]] = []
    used: dict[str, int] = {}
    taken: set[tuple[str, str]] = set()
    for per_module in (1, 2):
        for module, name, source in pool:
            if len(rows) == (PER_SET if per_module == 1 else EDIT_SET):
                break
            if used.get(module, 0) >= per_module or (module, name) in taken:
                continue
            # the instruction cycles so that the held-out prompts (every third) meet every kind too
            k = (len(rows) + 2 * (len(rows) // 3)) % len(EDITS)
            var = local_name(source)
            if "{var}" in EDITS[k] and var is None:
                continue
            used[module] = used.get(module, 0) + 1
            taken.add((module, name))
            ask = EDITS[k].format(var=var, new=f"{var}_value" if var else "")
            rows.append(
                {"id": f"edit-{len(rows):03d}", "domain": "edit", "language": "en",
                 "text": f"{ask}\n\n```python\n{source}\n```",
                 "source": f"CPython {PY} Lib/{module}.py, {name} (PSF-2.0)"}
            )
    return rows


def code_qa_set(rng: random.Random) -> list[dict[str, str]]:
    pool = [(m, f, s) for m in STDLIB_MODULES for f, s in functions(stdlib_file(m), 30, 110)]
    rng.shuffle(pool)
    rows, seen = [], set()
    for module, name, source in pool:
        if len(rows) == PER_SET or module in seen:
            continue
        seen.add(module)
        ask = QUESTIONS[len(rows) % len(QUESTIONS)]
        rows.append(
            {"id": f"code-qa-{len(rows):03d}", "domain": "code-qa", "language": "en",
             "text": f"```python\n{source}\n```\n\n{ask}",
             "source": f"CPython {PY} Lib/{module}.py, {name} (PSF-2.0)"}
        )
    return rows


def sections(path: Path, low: int, high: int) -> list[tuple[str, str]]:
    """(heading, text) of `##` sections of a Markdown page between `low` and `high` characters."""
    parts = re.split(r"(?m)^(?=## )", path.read_text("utf-8"))
    out = []
    for part in parts:
        if part.startswith("## ") and low <= len(part) <= high:
            out.append((part.splitlines()[0][3:].strip(), part.strip()))
    return out


def doc_qa_set(rng: random.Random) -> list[dict[str, str]]:
    pages = sorted((ROOT / "docs").rglob("*.md"))
    pool = [(p, h, t) for p in pages for h, t in sections(p, 1200, 7000)]
    rng.shuffle(pool)
    rows = []
    for page, heading, text in pool[:PER_SET]:
        ask = DOC_QUESTIONS[len(rows) % len(DOC_QUESTIONS)]
        rows.append(
            {"id": f"doc-qa-{len(rows):03d}", "domain": "doc-qa", "language": "en",
             "text": f"{text}\n\n{ask}",
             "source": f"draftnas {page.relative_to(ROOT)}, section {heading!r} (Apache-2.0)"}
        )
    return rows


def main() -> None:
    makers = {"edit": edit_set, "code-qa": code_qa_set, "doc-qa": doc_qa_set}
    wanted = sys.argv[1:] or list(makers)
    unknown = [w for w in wanted if w not in makers]
    if unknown:
        raise SystemExit(f"unknown workload {unknown[0]!r}: choose from {', '.join(makers)}")
    for name in wanted:
        make = makers[name]
        rows = make(random.Random(f"draftnas-{name}"))
        if len(rows) < 24:
            raise SystemExit(f"{name}: only {len(rows)} prompts found (want >= 24)")
        path = OUT / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
        sizes = sorted(len(r["text"]) for r in rows)
        print(f"{path.relative_to(ROOT)}: {len(rows)} prompts, {sizes[0]}-{sizes[-1]} characters")


if __name__ == "__main__":
    main()
