"""Every error code the gateway can send is in docs/errors.md, and every code there is one
the code can send.

The codes are found in the source with ``ast`` (nothing is imported): every constant of
``Code`` (``gateway/protocol/errors.py``), and every code spelled out elsewhere: the
first arguments of a call whose name says error, failure or refusal (``EngineError``,
``ProtocolError``, an HTTP ``_error``, ``report_failure``), a ``code=`` (or ``default=``)
argument or parameter default, a ``"code"`` entry of a dict, the values of a dict keyed
by ``Code`` (the duplex dialect's spellings), a class's ``code`` attribute, a module's
upper-case string constants and a video engine's ``ERROR_CODES``. What that finds and the
gateway never sends as a code is listed below, each with why.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from support.docs import ROOT

SOURCES = sorted([*ROOT.glob("gateway/**/*.py"), *ROOT.glob("orchestrator/**/*.py")])
SNAKE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
_CALLS = re.compile(r"error|Error|fail|refus")

NOT_SENT = {
    "store_error": "a store exception's code: clients are told store_unavailable",
    "session_fenced": "the store's fencing exception: the host lets the session go (4009), no error event",
    "journal_trimmed": "a session.resync_required reason, not an error code",
    "client_ahead": "a session.resync_required reason, not an error code",
    "max_state_mib": "the limit label of omni_tenant_refusals_total; the client gets rate_limit_exceeded",
    "httptools": "the name of uvicorn's HTTP protocol",
    "ultrafast": "libx264's preset",
    "other": "the tenant label of principals outside the keys file (metrics)",
    "video": "the kind of a video host",
    "marin": "GPT-Live's default voice",
    "delegate": "the name of the function the Live model delegates with",
    "pace": "the Wake key of GPT-Live's paced output (gateway/session/live_spelling.py)",
}


def spelled_codes(source: str) -> set[str]:
    """The code-like string constants of one module, in the places codes are spelled."""
    found: set[str] = set()

    def add(node: ast.AST | None) -> None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and SNAKE.match(node.value):
            found.add(node.value)

    tree = ast.parse(source)
    for stmt in tree.body:  # module constants: INVALID_OFFER = "invalid_offer", ERROR_CODES = (...)
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            name = stmt.targets[0].id
            if name.lstrip("_").isupper():
                listed = stmt.value.elts if isinstance(stmt.value, ast.Tuple) and name == "ERROR_CODES" else None
                for value in listed or [stmt.value]:
                    add(value)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if _CALLS.search(name):
                for arg in node.args[:2]:
                    add(arg)
            for kw in node.keywords:
                if kw.arg in ("code", "error_code", "default"):
                    add(kw.value)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "code":
                    add(value)
                if isinstance(key, ast.Attribute) and isinstance(key.value, ast.Name) and key.value.id == "Code":
                    add(value)
        elif isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and any(
                    isinstance(t, ast.Name) and (t.id == "code" or node.name == "Code") for t in stmt.targets
                ):
                    add(stmt.value)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            positional = [*args.posonlyargs, *args.args]
            pairs = [*zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True),
                     *zip(args.kwonlyargs, args.kw_defaults, strict=True)]  # fmt: skip
            for arg, default in pairs:
                if arg.arg in ("code", "default"):
                    add(default)
    return found


def sent() -> set[str]:
    return set().union(*(spelled_codes(p.read_text()) for p in SOURCES)) - NOT_SENT.keys()


def documented() -> set[str]:
    """The codes in the first column of docs/errors.md's tables (the close codes aside)."""
    text = (ROOT / "docs" / "errors.md").read_text().split("## Close codes")[0]
    rows = [line.split("|")[1] for line in text.splitlines() if line.startswith("| `")]
    return {code for row in rows for code in re.findall(r"`([a-z0-9_]+)`", row)}


def test_every_code_the_gateway_sends_is_in_the_table() -> None:
    missing = sorted(sent() - documented())
    assert not missing, f"sent but not in docs/errors.md: {missing}"


def test_every_code_in_the_table_is_one_the_gateway_sends() -> None:
    stale = sorted(documented() - sent())
    assert not stale, f"in docs/errors.md but sent nowhere: {stale}"


def test_the_codes_found_include_each_way_a_code_is_spelled() -> None:
    """The finder is not empty-handed: a code of each kind of place is found."""
    found = sent()
    assert len(found) > 100
    assert {"string_above_max_length", "invalid_offer", "session_resume_expired", "upstream_lost", "tts_failed",
            "too_many_pending_interactions", "unsupported_sampling_param", "replica_lost"} <= found  # fmt: skip


def test_a_new_code_is_found(tmp_path: Path) -> None:
    source = (
        "class Gone(Exception):\n    code = 'a_class_code'\n"
        "def f(code: str = 'a_default_code'):\n"
        "    raise EngineError('an_engine_code', 'a message')\n"
        "X = {'code': 'a_dict_code'}\nNEW_CODE = 'a_module_code'\nreport(code='a_keyword_code')\n"
    )
    assert spelled_codes(source) == {"a_class_code", "a_default_code", "an_engine_code", "a_dict_code",
                                     "a_module_code", "a_keyword_code"}  # fmt: skip
