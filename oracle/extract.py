"""Pull the candidate module (the code that defines `ModelNew`) out of a model's completion.

`candidate_from_completion` is the one way from a completion's text to what the oracle judges: a `Candidate`
(source, backend, content hash), or the `no_code` verdict that says why there is none.

Small code models wrap their answer in prose, reasoning sections, several drafts and sometimes a cut-off
final block. Everything here is trusted-side text work: nothing is executed, only `ast.parse`d. Failures
never raise; they come back as a one-line reason written to be fed to the model's next round.
"""

from __future__ import annotations

import ast
import keyword
import re
import textwrap
from dataclasses import dataclass, field

from oracle.candidate import BACKENDS, Candidate
from oracle.verdict import Verdict
from tasks.ast_parse import parse
from tasks.model import Task

TARGET = "ModelNew"

REASON_EMPTY = "the completion is empty: answer with one ```python block that defines `class ModelNew`"
REASON_NOT_TEXT = "the completion is not text"
REASON_NO_CODE = "the completion contains no code: answer with one ```python block that defines `class ModelNew`"
REASON_NO_MODELNEW = "no Python code block defines `class ModelNew` at module level"
REASON_THINK_ONLY = "the completion ended inside <think> before giving code that defines `class ModelNew`"
REASON_CUT_OFF = "the answer was cut off (its last code block never closed) before it defined `class ModelNew`"

# Fence languages that are certainly not the Python module (CUDA/C++ sources shown beside it, shell, output).
_NON_PYTHON = frozenset(
    "cuda cu cuh cpp c++ cxx cc c h hpp hxx bash sh shell zsh console terminal text txt plaintext output "
    "json yaml yml toml ini diff patch make makefile cmake markdown md html xml sql rust go java js ts".split()
)

_FENCE_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n]*)$")
_THINK_OPEN = re.compile(r"<(?:think|thinking|reasoning)>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</(?:think|thinking|reasoning)>", re.IGNORECASE)
_MODELNEW_TEXT = re.compile(rf"^(?:class[ \t]+{TARGET}\b|{TARGET}[ \t]*(?::[^=\n]*)?=(?!=))", re.MULTILINE)
# A line where unfenced code can start: prose before it is dropped.
_CODE_START = re.compile(
    r"^(?:import[ \t]+\w|from[ \t]+[\w.]+[ \t]+import[ \t]|class[ \t]+\w|(?:async[ \t]+)?def[ \t]+\w|@\w"
    r"|[A-Za-z_]\w*[ \t]*=(?!=))"
)
# Prose: two words, a lone word with punctuation, or a markdown list/emphasis/quote marker.
_PROSE = re.compile(
    r"^(?:[^\W\d_][\w'\u2019-]*[,:;!?.]?[ \t]+[^\W\d_(]|[^\W\d_][\w'\u2019-]*[!?.:][ \t]*$"
    r"|\*\*|[-*+][ \t]|\d+[.)][ \t]|>)"
)
_MAX_PROSE_ROUNDS = 200


@dataclass(frozen=True)
class Extraction:
    """The outcome of reading one completion: the module and its backend, or why there is none."""

    source: str | None  # the candidate module, or None
    backend: str | None  # detected (or given) backend, or None
    reason: str  # when source is None: one line saying why, for the model; otherwise a short note


@dataclass(frozen=True)
class _Block:
    """One piece of code found in the completion."""

    code: str
    lang: str = ""
    closed: bool = True  # False: the fence never closed, the answer was probably cut off
    fenced: bool = True


@dataclass(frozen=True)
class _ParseError:
    line: int | None
    msg: str


@dataclass
class _Region:
    """What one stretch of text (outside or inside <think>) offers."""

    candidates: list[_Block] = field(default_factory=list)
    has_code: bool = False
    cut_off: bool = False  # the last fenced block never closed


# ---------------------------------------------------------------- parsing helpers


def _parse(code: str) -> ast.Module | _ParseError:
    """`ast.parse` that never raises: garbage, null bytes and surrogates become a `_ParseError`."""
    try:
        return parse(code)
    except SyntaxError as exc:
        return _ParseError(exc.lineno, exc.msg or "invalid syntax")
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, surrogates, absurd nesting
        return _ParseError(None, str(exc) or type(exc).__name__)


def _binds_target(target: ast.expr) -> bool:
    if isinstance(target, ast.Name):
        return target.id == TARGET
    if isinstance(target, (ast.Tuple, ast.List)):
        return any(_binds_target(elt) for elt in target.elts)
    return False


def _defines_model_new(tree: ast.Module) -> bool:
    """A top-level `class ModelNew` or `ModelNew = ...`: what the oracle will import."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == TARGET:
            return True
        if isinstance(node, ast.Assign) and any(_binds_target(t) for t in node.targets):
            return True
        if isinstance(node, ast.AnnAssign) and node.value is not None and _binds_target(node.target):
            return True
    return False


def _is_candidate(code: str) -> bool:
    """Code that defines ModelNew, or tried to (a broken block still counts, so its error is reported)."""
    tree = _parse(code)
    if isinstance(tree, ast.Module):
        return _defines_model_new(tree)
    return bool(_MODELNEW_TEXT.search(code))


def _strip_blank_ends(code: str) -> str:
    lines = code.split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(lines) + "\n" if lines else ""


# ---------------------------------------------------------------- <think> sections


def _split_think(text: str) -> tuple[str, str, bool]:
    """(text outside reasoning sections, text inside them, whether the last one never closed).

    A leading `</think>` with no opening tag means the template opened the section in the prompt.
    """
    outside: list[str] = []
    inside: list[str] = []
    first_close, first_open = _THINK_CLOSE.search(text), _THINK_OPEN.search(text)
    if first_close and (first_open is None or first_close.start() < first_open.start()):
        inside.append(text[: first_close.start()])
        text = text[first_close.end() :]
    while True:
        opened = _THINK_OPEN.search(text)
        if opened is None:
            outside.append(text)
            return "\n".join(outside), "\n".join(inside), False
        outside.append(text[: opened.start()])
        rest = text[opened.end() :]
        closed = _THINK_CLOSE.search(rest)
        if closed is None:
            inside.append(rest)
            return "\n".join(outside), "\n".join(inside), True
        inside.append(rest[: closed.start()])
        text = rest[closed.end() :]


# ---------------------------------------------------------------- fenced blocks


def _fence_lang(info: str) -> str:
    words = info.strip().split()
    return words[0].strip("{}.").lower() if words else ""


def _block_body(lines: list[str], closed: bool) -> str:
    """The block's code, dedented (fences inside list items are indented).

    A block that never closed may end in a half-written fence, or the model forgot the fence and went on
    with its explanation: both are dropped.
    """
    code = textwrap.dedent("\n".join(lines))
    if not closed:
        lines = code.split("\n")
        while lines and re.fullmatch(r"[ \t]*`{1,2}[ \t]*", lines[-1]):
            lines = lines[:-1]
        code = "\n".join(_drop_prose(lines))
    return _strip_blank_ends(code)


def _fenced_blocks(text: str) -> tuple[list[_Block], str]:
    """Every fenced block in order, and the text outside all of them (for unfenced code)."""
    lines = text.split("\n")
    blocks: list[_Block] = []
    outside: list[str] = []
    i = 0
    while i < len(lines):
        opened = _FENCE_OPEN.match(lines[i])
        if opened is None or (opened["fence"][0] == "`" and "`" in opened["info"]):
            outside.append(lines[i])
            i += 1
            continue
        fence = opened["fence"]
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        end = next((j for j in range(i + 1, len(lines)) if closing.match(lines[j])), None)
        body = lines[i + 1 : end if end is not None else len(lines)]
        blocks.append(_Block(_block_body(body, end is not None), _fence_lang(opened["info"]), end is not None))
        i = end + 1 if end is not None else len(lines)
    return blocks, "\n".join(outside)


# ---------------------------------------------------------------- unfenced code


def _looks_like_prose(line: str) -> bool:
    """A column-0 line of chat ("Here's the code:", "This fuses both ops.") rather than broken code."""
    if not line or line[0].isspace():
        return False
    first = re.match(r"[A-Za-z_]\w*", line)
    if first and keyword.iskeyword(first.group()):
        return False
    return bool(_PROSE.match(line))


def _drop_bare_names(lines: list[str], tree: ast.Module) -> list[str]:
    """Blank top-level lines that are a lone word ("Done"): valid syntax, but chat, and a NameError on import."""
    lines = list(lines)
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Name) and node.end_lineno == node.lineno:
            lines[node.lineno - 1] = ""
    return lines


def _drop_prose(lines: list[str]) -> list[str]:
    """Blank the prose lines that stop the code from parsing; stop at the first error that is not prose."""
    lines = list(lines)
    for _ in range(_MAX_PROSE_ROUNDS):
        tree = _parse("\n".join(lines))
        if isinstance(tree, ast.Module):
            return _drop_bare_names(lines, tree)
        if tree.line is None or not 1 <= tree.line <= len(lines) or not _looks_like_prose(lines[tree.line - 1]):
            return lines
        lines[tree.line - 1] = ""
    return lines


def _bare_code(text: str) -> _Block | None:
    """Unfenced code with chat around it, or None when no line looks like the start of Python code."""
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if _CODE_START.match(line)), None)
    if start is None:
        return None
    code = _strip_blank_ends("\n".join(_drop_prose(lines[start:])))
    return _Block(code, fenced=False) if code else None


# ---------------------------------------------------------------- choosing the module


def _scan(text: str) -> _Region:
    """Candidate blocks in one stretch of text: fenced Python blocks first, else unfenced code."""
    blocks, outside = _fenced_blocks(text)
    candidates = [b for b in blocks if b.lang not in _NON_PYTHON and _is_candidate(b.code)]
    if candidates:
        return _Region(candidates, True)
    bare = _bare_code(outside)
    if bare is not None and _is_candidate(bare.code):
        return _Region([bare], True)
    cut_off = bool(blocks) and not blocks[-1].closed and blocks[-1].lang not in _NON_PYTHON
    return _Region([], bool(blocks) or bare is not None, cut_off)


def _syntax_reason(error: _ParseError, block: _Block) -> str:
    where = f" at line {error.line}" if error.line else ""
    reason = f"the code defining ModelNew has a syntax error{where}: {error.msg}"
    if not block.closed:
        reason += " (the answer was cut off before its code block closed)"
    return reason


def _found_note(block: _Block, index: int, count: int) -> str:
    kind = "fenced code block" if block.fenced else "unfenced code"
    if count == 1:
        return f"took `ModelNew` from the {kind}"
    if index == count - 1:
        return f"took the last of {count} code blocks that define `ModelNew`"
    return f"took block {index + 1} of {count} that define `ModelNew`: the later ones have syntax errors"


def _choose(candidates: list[_Block]) -> tuple[str | None, str]:
    """The last candidate that parses; models refine, so later drafts win over earlier ones."""
    last_error = _ParseError(None, "invalid syntax")
    for index in range(len(candidates) - 1, -1, -1):
        parsed = _parse(candidates[index].code)
        if isinstance(parsed, ast.Module):
            return candidates[index].code, _found_note(candidates[index], index, len(candidates))
        if index == len(candidates) - 1:
            last_error = parsed
    return None, _syntax_reason(last_error, candidates[-1])


def _as_text(text: object) -> str | None:
    if isinstance(text, str):
        return text
    if isinstance(text, (bytes, bytearray)):
        return bytes(text).decode("utf-8", errors="replace")
    return None


def extract_source(text: str) -> tuple[str | None, str]:
    """(source, reason): the module that defines ModelNew, or None and a one-line reason for the model.

    Code inside <think> sections is used only when nothing outside them defines ModelNew.
    """
    completion = _as_text(text)
    if completion is None:
        return None, REASON_NOT_TEXT
    if not completion.strip():
        return None, REASON_EMPTY
    outside, inside, think_open = _split_think(completion)
    region = _scan(outside)
    if not region.candidates and inside.strip():
        thought = _scan(inside)
        if thought.candidates:
            source, reason = _choose(thought.candidates)
            return source, (f"{reason} (inside <think>)" if source is not None else reason)
        if think_open and not outside.strip():
            return None, REASON_THINK_ONLY
        region.has_code = region.has_code or thought.has_code
    if region.candidates:
        return _choose(region.candidates)
    if region.cut_off:
        return None, REASON_CUT_OFF
    return None, REASON_NO_MODELNEW if region.has_code else REASON_NO_CODE


# ---------------------------------------------------------------- backend detection

_TEXT_LOADER = re.compile(r"\bload_inline\b|\bcpp_extension\s*\.\s*load\s*\(")
_TEXT_CUDA_SOURCES = re.compile(r"""\bcuda_sources["']?\s*[=:]\s*(?!None\b|\[\s*\]|\(\s*\)|""(?!")|''(?!'))\S""")
_TEXT_TRITON_IMPORT = re.compile(r"^[ \t]*(?:import[ \t]+triton\b|from[ \t]+triton\b)", re.MULTILINE)
_TEXT_TRITON_JIT = re.compile(r"^[ \t]*@[ \t]*(?:triton[ \t]*\.[ \t]*)?jit\b", re.MULTILINE)


@dataclass
class _Imports:
    """Local names that the module binds to the extension loader and to Triton, aliases included."""

    loader_funcs: dict[str, str] = field(default_factory=dict)  # local name -> "load_inline" | "load"
    ext_modules: set[str] = field(default_factory=set)  # names bound to torch.utils.cpp_extension
    triton_modules: set[str] = field(default_factory=set)  # names bound to the triton package
    triton_jit: set[str] = field(default_factory=set)  # names bound to triton.jit
    triton: bool = False  # triton (or a submodule) is imported at all


def _collect_imports(tree: ast.Module) -> _Imports:
    found = _Imports()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                _note_import(found, alias)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                _note_import_from(found, node.module, alias)
    return found


def _note_import(found: _Imports, alias: ast.alias) -> None:
    if alias.name == "torch.utils.cpp_extension" and alias.asname:
        found.ext_modules.add(alias.asname)
    if alias.name == "triton":
        found.triton = True
        found.triton_modules.add(alias.asname or "triton")
    elif alias.name.startswith("triton."):
        found.triton = True
        if not alias.asname:  # `import triton.language` binds `triton` too
            found.triton_modules.add("triton")


def _note_import_from(found: _Imports, module: str, alias: ast.alias) -> None:
    local = alias.asname or alias.name
    if module == "torch.utils.cpp_extension" and alias.name in ("load_inline", "load"):
        found.loader_funcs[local] = alias.name
    elif module == "torch.utils" and alias.name == "cpp_extension":
        found.ext_modules.add(local)
    if module == "triton" or module.startswith("triton."):
        found.triton = True
        if module == "triton" and alias.name == "jit":
            found.triton_jit.add(local)


def _dotted(node: ast.AST) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _loader_kind(func: ast.expr, imports: _Imports) -> str | None:
    """"load_inline" or "load" when the call builds a torch C++/CUDA extension."""
    name = _dotted(func)
    if name is None:
        return "load_inline" if isinstance(func, ast.Attribute) and func.attr == "load_inline" else None
    if name in imports.loader_funcs:
        return imports.loader_funcs[name]
    head, _, last = name.rpartition(".")
    if last == "load_inline":
        return "load_inline"
    if last == "load" and (head.endswith("cpp_extension") or head in imports.ext_modules):
        return "load"
    return None


def _argument(call: ast.Call, keyword_name: str, position: int | None = None) -> ast.expr | None:
    """The argument by keyword, or by position when the parameter can be given positionally."""
    for kw in call.keywords:
        if kw.arg == keyword_name:
            return kw.value
    if position is None or len(call.args) <= position:
        return None
    return call.args[position]


def _is_empty(node: ast.expr) -> bool:
    """None, "", [] or [""]: a cuda_sources that compiles no CUDA."""
    if isinstance(node, ast.Constant):
        return node.value is None or (isinstance(node.value, str) and not node.value.strip())
    if isinstance(node, (ast.List, ast.Tuple)):
        return all(_is_empty(elt) for elt in node.elts)
    return False


def _names_cuda_file(node: ast.expr) -> bool:
    return any(
        isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.endswith((".cu", ".cuh"))
        for n in ast.walk(node)
    )


def _loader_call_backend(call: ast.Call, kind: str, source: str) -> str:
    """cuda when the call compiles CUDA sources (or the module holds __global__ kernels for it), else cpp."""
    if any(kw.arg is None for kw in call.keywords) or any(isinstance(a, ast.Starred) for a in call.args):
        return "cuda" if _TEXT_CUDA_SOURCES.search(source) or "__global__" in source else "cpp"
    if kind == "load_inline":
        cuda = _argument(call, "cuda_sources", 2)
        if cuda is not None and not _is_empty(cuda):
            return "cuda"
    else:
        sources = _argument(call, "sources", 1)
        if sources is not None and _names_cuda_file(sources):
            return "cuda"
    with_cuda = _argument(call, "with_cuda")
    if isinstance(with_cuda, ast.Constant) and with_cuda.value is True:
        return "cuda"
    return "cuda" if "__global__" in source else "cpp"


def _uses_triton_jit(tree: ast.Module, imports: _Imports) -> bool:
    """`@triton.jit` (or `triton.jit(fn)`, `@jit` from triton) anywhere in the module."""
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Attribute, ast.Name)):
            continue
        name = _dotted(node)
        if name is None:
            continue
        head, _, last = name.rpartition(".")
        if (last == "jit" and head in imports.triton_modules) or (not head and name in imports.triton_jit):
            return True
    return False


def _backend_from_ast(tree: ast.Module, source: str) -> str:
    imports = _collect_imports(tree)
    kinds = [
        _loader_call_backend(node, kind, source)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and (kind := _loader_kind(node.func, imports)) is not None
    ]
    if "cuda" in kinds:
        return "cuda"
    if kinds:
        return "cpp"
    if imports.triton and _uses_triton_jit(tree, imports):
        return "triton"
    return "torch"


def _backend_from_text(source: str) -> str:
    """The same rules on plain text, for source that does not parse."""
    if _TEXT_LOADER.search(source):
        return "cuda" if _TEXT_CUDA_SOURCES.search(source) or "__global__" in source else "cpp"
    if _TEXT_TRITON_IMPORT.search(source) and _TEXT_TRITON_JIT.search(source):
        return "triton"
    return "torch"


def detect_backend(source: str) -> str:
    """One of BACKENDS: how the oracle must build and check this module (docs/oracle.md, Build and Own
    kernel)."""
    tree = _parse(source)
    if isinstance(tree, ast.Module):
        return _backend_from_ast(tree, source)
    return _backend_from_text(source)


def extract(text: str, backend: str = "auto") -> Extraction:
    """Extract the module and settle its backend; an explicit backend is the user's word and wins."""
    if backend != "auto" and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected 'auto' or one of {', '.join(BACKENDS)}")
    source, reason = extract_source(text)
    if source is None:
        return Extraction(None, None, reason)
    detected = detect_backend(source)
    if backend == "auto" or backend == detected:
        return Extraction(source, detected, reason)
    return Extraction(source, backend, f"{reason}; backend {backend} as given (the code looks like {detected})")


# ---------------------------------------------------------------- completion -> candidate


def no_code_verdict(task: Task, message: str, device: str = "cpu") -> Verdict:
    """The verdict on a completion that holds nothing to judge, with the fields every verdict has."""
    return Verdict(task=task.id, status="no_code", message=message, device=device, sizes=dict(task.sizes))


def candidate_from_completion(task: Task, text: str, backend: str = "auto", device: str = "cpu") -> Candidate | Verdict:
    """What the oracle judges for a completion: the candidate module with its backend and hash, or a
    `no_code` verdict with the reason, written for the model. `backend` as for `extract`."""
    found = extract(text, backend)
    if found.source is None:
        return no_code_verdict(task, found.reason, device)
    return Candidate.make(task.id, found.source, found.backend or "torch")
