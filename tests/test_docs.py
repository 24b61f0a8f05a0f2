"""The documentation cannot rot: the site builds with ``mkdocs build --strict``, the Python blocks of the
tutorial pages run and print what the pages show, and the ``lightning-ort`` commands they show parse.

Conventions in ``docs/*.md``:

- a `````python`` block runs, in page order, in one namespace per page (so later blocks see earlier
  ones), with the working directory a temporary folder in which ``examples/`` is the repository's;
- ``<!-- skip -->`` on the line before a block keeps it from running (fragments, GPU-only code);
- ``<!-- output -->`` before a `````text`` block makes it the expected standard output of the
  Python block before it, compared line by line, numbers included: a page shows what it prints on any
  x86-64 CPU, so its blocks print only figures that do not depend on the CPU's kernels (a metric that
  float rounding could change is compared with eager's, or rounded where the rounding cannot reach);
- ``<!-- output: numbers vary -->`` does the same with every number replaced by ``N``, for output
  whose figures are measured (timings) rather than computed;
- in `````console`` blocks, every ``$ lightning-ort fit|validate|test|predict ...`` line must parse
  (it is run with ``--print_config``); when the command itself ends in ``--print_config``, the lines
  shown after it must appear in what it prints, in order (a ``...`` line skips any number of lines).

``python tests/test_docs.py docs/PAGE.md`` runs a page's blocks and prints what each one printed;
``--update`` also writes that into the page's output blocks.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# Pages whose Python blocks run. Every page with Python blocks must be here or in NOT_RUN.
RUN = (
    "index.md",
    "getting-started.md",
    "cli.md",
    "precision.md",
    "memory.md",
    "debugging.md",
    "export.md",
    "faq.md",
    "distributed.md",
)
NOT_RUN = {
    "callbacks.md": "excerpts of a longer run: the blocks use a `model` and loaders defined elsewhere",
    "performance.md": "a fragment of a model's forward: q, k, v, the mask and dropout come from the model",
}
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+-]*)")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_CLI_SUBCOMMANDS = ("fit", "validate", "test", "predict")
_OUTPUT_MARKERS = ("<!-- output -->", "<!-- output: numbers vary -->")


@dataclass
class Block:
    """One fenced code block of a page."""

    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip: bool = False
    expected: str | None = None  # for Python blocks: the output block that follows, if any
    numbers_vary: bool = False  # the output block was marked ``<!-- output: numbers vary -->``


def parse(page: Path) -> list[Block]:
    """The fenced blocks of ``page``, with ``<!-- skip -->`` and ``<!-- output -->`` applied."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    last_python: Block | None = None
    marker = ""
    index = 0
    while index < len(lines):
        match = _FENCE.match(lines[index])
        if not match:
            if lines[index].strip():
                marker = lines[index].strip()
            index += 1
            continue
        indent, fence = match["indent"], match["fence"]
        end = index + 1
        while end < len(lines) and not (
            lines[end].startswith(indent)
            and lines[end].strip().startswith(fence)
            and not lines[end].strip()[len(fence) :].strip()
        ):
            end += 1
        body = [line[len(indent) :] if line.startswith(indent) else line.lstrip() for line in lines[index + 1 : end]]
        block = Block(page.name, index + 1, match["lang"], "\n".join(body) + "\n", skip=marker == "<!-- skip -->")
        if marker in _OUTPUT_MARKERS:
            assert block.lang == "text", f"{page.name}:{block.line}: {marker} must precede a ```text block"
            assert last_python is not None, (
                f"{page.name}:{block.line}: <!-- output --> without a Python block before it"
            )
            assert last_python.expected is None, f"{page.name}:{block.line}: a second output for one Python block"
            last_python.expected = block.code
            last_python.numbers_vary = marker == "<!-- output: numbers vary -->"
        if block.lang == "python":
            last_python = block
        blocks.append(block)
        marker = ""
        index = end + 1
    return blocks


def masked(text: str) -> list[str]:
    """Lines of ``text`` without trailing space or surrounding blank lines, numbers replaced by ``N``."""
    lines = [_NUMBER.sub("N", line.rstrip()) for line in text.strip("\n").splitlines()]
    return lines


def exact(text: str) -> list[str]:
    """Lines of ``text`` without trailing space or surrounding blank lines, numbers as they are."""
    return [line.rstrip() for line in text.strip("\n").splitlines()]


def pages_with_python() -> list[str]:
    return sorted(page.name for page in DOCS.glob("*.md") if any(b.lang == "python" for b in parse(page)))


@pytest.fixture
def docs_workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A scratch working directory in which ``examples/`` is the repository's, as from the repository root."""
    (tmp_path / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.setattr(sys, "argv", ["lightning-ort"])
    return tmp_path


def test_every_page_with_python_is_run_or_says_why_not() -> None:
    assert set(RUN).isdisjoint(NOT_RUN)
    undecided = [name for name in pages_with_python() if name not in RUN and name not in NOT_RUN]
    assert not undecided, f"add {undecided} to RUN (its Python blocks run) or NOT_RUN (with the reason) in {__file__}"
    missing = [name for name in RUN if not (DOCS / name).exists()]
    assert not missing, f"pages listed in RUN do not exist: {missing}"


@pytest.mark.parametrize("name", RUN)
def test_python_blocks_run_and_print_what_the_page_shows(
    name: str, docs_workdir: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    namespace: dict[str, object] = {"__name__": "__docs__"}
    for block in parse(DOCS / name):
        if block.lang != "python" or block.skip:
            continue
        capfd.readouterr()
        exec(compile(block.code, f"docs/{name}:{block.line}", "exec"), namespace)  # noqa: S102
        out = capfd.readouterr().out
        if block.expected is not None:
            compare = masked if block.numbers_vary else exact
            assert compare(out) == compare(block.expected), (
                f"docs/{name}:{block.line} printed (update the page's output block, or the block if a figure"
                f" depends on the CPU):\n{out}"
            )


def console_commands() -> list[tuple[str, int, list[str], list[str]]]:
    """``(page, line, arguments, output shown after it)`` of each ``$ lightning-ort <subcommand>`` line."""
    commands: list[tuple[str, int, list[str], list[str]]] = []
    for page in sorted(DOCS.glob("*.md")):
        for block in parse(page):
            if block.lang != "console" or block.skip:
                continue
            current: list[str] | None = None
            for offset, line in enumerate(block.code.splitlines()):
                if line.startswith("$ "):
                    words = shlex.split(line[2:], comments=True)
                    current = None
                    if words[:1] == ["lightning-ort"] and words[1:2] and words[1] in _CLI_SUBCOMMANDS:
                        current = []
                        commands.append((page.name, block.line + 1 + offset, words[1:], current))
                elif current is not None:
                    current.append(line)
    return commands


def _in_order(shown: list[str], actual: list[str]) -> bool:
    """Whether the chunks of ``shown`` (separated by ``...`` lines) appear in ``actual``, each contiguous, in order."""
    chunks: list[list[str]] = [[]]
    for line in shown:
        if line.strip() == "...":
            chunks.append([])
        else:
            chunks[-1].append(line)
    start = 0
    for chunk in filter(None, chunks):
        found = next(
            (i for i in range(start, len(actual) - len(chunk) + 1) if actual[i : i + len(chunk)] == chunk), None
        )
        if found is None:
            return False
        start = found + len(chunk)
    return True


@pytest.mark.parametrize(
    ("page", "line", "args", "shown"),
    [pytest.param(*command, id=f"{command[0]}:{command[1]}") for command in console_commands()],
)
def test_lightning_ort_commands_in_the_docs_parse(
    page: str,
    line: int,
    args: list[str],
    shown: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Each command parses; a ``--print_config`` command prints what the page shows (``...`` skips lines)."""
    from lightning_ort.cli import main

    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.setattr(sys, "argv", ["lightning-ort"])
    printing = "--print_config" in args
    with pytest.raises(SystemExit) as exited:
        main([*(arg for arg in args if arg != "--print_config"), "--print_config"])
    captured = capfd.readouterr()
    assert exited.value.code in (0, None), f"docs/{page}:{line}: {captured.err[-2000:]}"
    if printing and shown:
        assert _in_order(masked("\n".join(shown)), masked(captured.out)), (
            f"docs/{page}:{line} shows output that the command no longer prints; it prints:\n{captured.out}"
        )


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    try:
        import material  # noqa: F401
        import mkdocstrings  # noqa: F401
    except ImportError as error:
        pytest.fail(f"the docs toolchain is missing ({error}): pip install -e '.[docs]'")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr[-5000:]
    assert (tmp_path / "site" / "api" / "index.html").exists()


def _run_page_printing(page: Path, update: bool) -> None:
    """Run one page's Python blocks as the test does; print each block's output, or write it into the
    page's ``<!-- output -->`` blocks (``update``)."""
    import tempfile

    outputs: dict[int, str] = {}
    with tempfile.TemporaryDirectory() as scratch, tempfile.TemporaryFile("w+") as capture:
        (Path(scratch) / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
        os.chdir(scratch)
        sys.path.insert(0, str(ROOT))
        namespace: dict[str, object] = {"__name__": "__docs__"}
        for block in parse(page):
            if block.lang != "python" or block.skip:
                continue
            sys.stdout.flush()
            saved = os.dup(1)
            capture.seek(0)
            capture.truncate()
            os.dup2(capture.fileno(), 1)  # file-descriptor level, like pytest's capfd
            try:
                exec(compile(block.code, f"docs/{page.name}:{block.line}", "exec"), namespace)  # noqa: S102
            finally:
                sys.stdout.flush()
                os.dup2(saved, 1)
                os.close(saved)
            capture.seek(0)
            outputs[block.line] = capture.read()
            print(f"----- docs/{page.name}:{block.line} -----\n{outputs[block.line]}", end="", flush=True)
    if update:
        _write_outputs(page, outputs)


def _write_outputs(page: Path, outputs: dict[int, str]) -> None:
    """Replace the ``<!-- output -->`` block of each Python block (by its line) with ``outputs``."""
    lines = page.read_text(encoding="utf-8").splitlines(keepends=True)
    replacements = []
    blocks = parse(page)
    for block, following in zip(blocks, blocks[1:], strict=False):
        if block.lang == "python" and block.expected is not None and block.line in outputs:
            assert following.code == block.expected
            replacements.append(
                (following.line, following.line + len(following.code.splitlines()), outputs[block.line])
            )
    for first, last, text in reversed(replacements):  # the output's lines sit between its fences
        lines[first:last] = [text if text.endswith("\n") else text + "\n"]
    page.write_text("".join(lines), encoding="utf-8")


if __name__ == "__main__":
    arguments = sys.argv[1:]
    write = "--update" in arguments
    for argument in arguments:
        if argument != "--update":
            _run_page_printing(Path(argument).resolve(), write)
