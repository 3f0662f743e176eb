"""Answering an agent's question when no person is there (question auto-answer), and the ledger of choices.

Prefer an option marked recommended, default, safe, standard, common, conventional, best practice,
simple or minimal; avoid one marked experimental, risky, dangerous, destructive, advanced, complex,
rewrite or over-engineered; with no signal, take the first option (question tools tell agents to put
the recommended one first). Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["AVOID", "PREFER", "Choice", "FormField", "Option", "choose", "form_fields", "restate"]

PREFER = ("recommended", "default", "safe", "standard", "common", "conventional", "best practice", "simple",
          "minimal")  # fmt: skip
AVOID = ("experimental", "risky", "dangerous", "destructive", "advanced", "complex", "rewrite",
         "over-engineered", "overengineered", "over engineered")  # fmt: skip


@dataclass(frozen=True)
class Option:
    """One answer the question offers: an id to send back, and the text a person would read."""

    id: str
    label: str
    description: str = ""


@dataclass(frozen=True)
class Choice:
    """What the kernel answered, how sure it was, and why: one entry of the decision ledger."""

    question: str
    option: Option
    confidence: float  # 0..1
    rationale: str
    low_confidence: bool


def _words(option: Option) -> str:
    return f" {option.label} {option.description} ".lower().replace("_", " ")


def _signals(text: str, words: Sequence[str]) -> list[str]:
    return [w for w in words if re.search(rf"(?<![a-z]){re.escape(w)}(?![a-z])", text)]


def choose(question: str, options: Sequence[Option]) -> Choice:
    """The auto-answer heuristic: the first preferred option that is not also avoided; else the first option
    with no avoid signal; else the first option. Confidence says which of these it was."""
    if not options:
        raise ValueError("a question with no options cannot be answered by choosing")
    scored = [(o, _signals(_words(o), PREFER), _signals(_words(o), AVOID)) for o in options]
    for option, prefer, avoid in scored:
        if prefer and not avoid:
            why = f"marked {', '.join(repr(w) for w in prefer)}"
            return Choice(question, option, 0.9, why, low_confidence=False)
    if any(avoid for _, _, avoid in scored):
        for option, _, avoid in scored:
            if not avoid:
                avoided = [repr(o.label) for o, _, a in scored if a]
                why = f"no option marked preferred; avoided {', '.join(avoided)}"
                return Choice(question, option, 0.6, why, low_confidence=False)
    option = options[0]
    why = "no option carries a signal: the first option (question tools put the recommended one first)"
    return Choice(question, option, 0.4, why, low_confidence=True)


def restate(ledger: Sequence[Choice]) -> str:
    """The ledger as the next prompt re-states it to the agent."""
    if not ledger:
        return ""
    lines = ["Decisions taken for you while you worked (no person was asked; revisit them if they are wrong):"]
    for choice in ledger:
        mark = " [low confidence]" if choice.low_confidence else ""
        lines.append(f"- {choice.question!r}: {choice.option.label!r}{mark} ({choice.rationale})")
    return "\n".join(lines)


@dataclass(frozen=True)
class FormField:
    """One field of an elicitation form: its options (an enum), or the default it carries."""

    name: str
    question: str
    options: tuple[Option, ...] = ()
    default: Any = None
    multiple: bool = False  # a multi-select: answered with a list of one choice


def form_fields(message: str, schema: Mapping[str, Any]) -> list[FormField] | str:
    """The questions an elicitation form asks, or why no choice can answer it (a field that needs free text)."""
    required = set(schema.get("required") or ())
    fields: list[FormField] = []
    for name, prop in (schema.get("properties") or {}).items():
        if not isinstance(prop, Mapping):
            return f"field {name!r} has no schema"
        question = f"{message} — {prop.get('title') or name}"
        multiple = prop.get("type") == "array"
        options = _options(prop.get("items") if multiple and isinstance(prop.get("items"), Mapping) else prop)
        if options:
            fields.append(FormField(name, question, options, multiple=multiple))
        elif prop.get("default") is not None:
            fields.append(FormField(name, question, default=prop["default"]))
        elif name in required:
            return f"field {name!r} needs an answer no option or default gives"
    return fields


def _option(entry: Mapping[str, Any]) -> Option:
    return Option(str(entry["const"]), str(entry.get("title") or entry["const"]), str(entry.get("description") or ""))


def _options(prop: Any) -> tuple[Option, ...]:
    """An enum's options: `oneOf`/`anyOf` entries with `const` and `title`, or plain `enum` values."""
    if not isinstance(prop, Mapping):
        return ()
    for key in ("oneOf", "anyOf"):
        entries = prop.get(key)
        if isinstance(entries, list) and entries:
            return tuple(_option(e) for e in entries if isinstance(e, Mapping) and "const" in e)
    values = prop.get("enum")
    if isinstance(values, list):
        return tuple(Option(str(v), str(v)) for v in values)
    return ()
