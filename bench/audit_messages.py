"""Which 422 messages may not state their numbers (docs/hardening.md, "numbers in every 422").

Statically lists every ``SpecError(field, message)`` / ``CollectiveError(field, message)`` raise in app/,
planner/ and collectives/ and every ``raise ValueError(...)`` in app/schemas whose message has no value in it:
a plain string, or an f-string without a ``{}`` placeholder. A message built elsewhere (a variable, a call) is
listed as ``built`` for reading by hand. A candidate is only that: a message about a fixed fact (no number to
give) is read and left alone; the rest name the values received and the bound.

    PYTHONPATH=. .venv/bin/python bench/audit_messages.py [--all]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOTS = ("app", "planner", "collectives")
RAISED = ("SpecError", "CollectiveError")


def _name(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def kind(message: ast.expr | None) -> str:
    """'plain' (no value in it), 'f-string' (has a placeholder), 'states' (a fixed message that says the one value
    it can be about: "..., got 0") or 'built' (made elsewhere: read it)."""
    if message is None:
        return "plain"
    if isinstance(message, ast.Constant):
        return "states" if "got " in str(message.value) else "plain"
    if isinstance(message, ast.Call) and isinstance(message.func, ast.Attribute):  # f"...".replace(...)
        return kind(message.func.value)
    if isinstance(message, ast.JoinedStr):
        return "f-string" if any(isinstance(v, ast.FormattedValue) for v in message.values) else "plain"
    if isinstance(message, ast.BinOp):  # "a" + f"{b}", or "... %d" % x
        parts = (kind(message.left), kind(message.right))
        return "f-string" if isinstance(message.op, ast.Mod) or "f-string" in parts else min(parts)
    return "built"


def raises(path: Path, schemas: bool) -> list[tuple[int, str, str, str]]:
    """(line, exception, kind, source of the message) of every raise of a 422 exception in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _name(node.func)
        if name in RAISED:
            message = node.args[1] if len(node.args) > 1 else None
        elif name == "ValueError" and schemas:
            message = node.args[0] if node.args else None
        else:
            continue
        text = ast.unparse(message) if message is not None else ""
        found.append((node.lineno, name, kind(message), text))
    return found


def audit(show_all: bool = False) -> dict[str, int]:
    counts = {"plain": 0, "built": 0, "f-string": 0, "states": 0}
    for root in ROOTS:
        for path in sorted(Path(root).rglob("*.py")):
            schemas = path.parts[:2] == ("app", "schemas")
            for line, name, how, text in raises(path, schemas):
                counts[how] += 1
                if show_all or how not in ("f-string", "states"):
                    print(f"{path}:{line}: {name} [{how}] {text[:150]}")
    return counts


if __name__ == "__main__":
    counts = audit("--all" in sys.argv)
    total = sum(counts.values())
    print(
        f"{total} raises: {counts['f-string']} with a placeholder, {counts['states']} fixed stating their value, "
        f"{counts['plain']} plain, {counts['built']} built"
    )
