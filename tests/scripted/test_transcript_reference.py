"""The user's transcript reference (docs/transcript.md) stays in step with the shipped schema: a section for
every record type, in the enum's order, a table row for every field the schema lists (its Required column
agreeing), a link that reaches the schema, and example lines the schema accepts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from harness.pytest_plugin import LOOP_SCRIPTED
from harness.record._records import transcript_schema

pytestmark = LOOP_SCRIPTED

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "transcript.md"
SCHEMA = transcript_schema()
TYPES: list[str] = SCHEMA["properties"]["type"]["enum"]
COMMON = "Common fields"  # the section with the fields every record has

_HEADING = re.compile(r"^#{2,3} +(.+?) *$")
_ROW = re.compile(r"^\| *`([^`]+)` *\|")


def sections(text: str) -> dict[str, list[str]]:
    """The doc's `##` and `###` sections, in order, by title (a record type's title is its name in
    backticks): each its lines up to the next such heading. Lines in code blocks are never headings."""
    found: dict[str, list[str]] = {}
    lines: list[str] | None = None
    fenced = False
    for line in text.splitlines():
        fenced ^= line.startswith("```")
        heading = None if fenced else _HEADING.match(line)
        if heading:
            lines = found.setdefault(heading.group(1), [])
        elif lines is not None:
            lines.append(line)
    return found


def rows(lines: list[str]) -> dict[str, list[str]]:
    """A section's table rows by field (the first cell, in backticks): field, type, required, meaning."""
    table = {}
    for line in lines:
        match = _ROW.match(line)
        if match:
            table[match.group(1)] = [cell.strip() for cell in line.strip().strip("|").split("|")]
    return table


def _expected() -> dict[str, tuple[dict[str, object], list[str]]]:
    """Each section's title and the fields (and required fields) the schema gives it."""
    expected = {COMMON: (SCHEMA["properties"], SCHEMA["required"])}
    for name in TYPES:
        record = SCHEMA["$defs"]["records"][name]
        expected[f"`{name}`"] = (record["properties"], record.get("required", []))
    return expected


def section_problems(text: str) -> list[str]:
    """Record types with no section, sections for types the schema lacks, and sections out of order."""
    found = sections(text)
    problems = [f"no section for {title}" for title in _expected() if title not in found]
    problems += [f"a section for {title}, which is not a record type of the schema"
                 for title in found if title.startswith("`") and title.strip("`") not in TYPES]  # fmt: skip
    in_doc = [title.strip("`") for title in found if title.strip("`") in TYPES and title.startswith("`")]
    if in_doc != [name for name in TYPES if name in in_doc]:
        problems.append(f"the record sections are not in the schema enum's order: {in_doc}")
    return problems


def field_problems(text: str) -> list[str]:
    """Fields the schema lists that a section's table lacks, rows for fields it does not list, and a
    Required column that says otherwise than the schema's `required`."""
    found = sections(text)
    problems = []
    for title, (fields, required) in _expected().items():
        if title not in found:
            continue  # section_problems names it
        table = rows(found[title])
        problems += [f"{title}: no row for the field `{field}`" for field in fields if field not in table]
        problems += [f"{title}: a row for `{field}`, a field the schema does not list"
                     for field in table if field not in fields]  # fmt: skip
        for field, cells in table.items():
            if len(cells) != 4:
                problems.append(f"{title}: the row for `{field}` has {len(cells)} cells, not 4")
            elif field in required and cells[2] != "yes":
                problems.append(f"{title}: `{field}` is required, the table says {cells[2]!r}")
            elif field in fields and field not in required and cells[2] == "yes":
                problems.append(f"{title}: `{field}` is not required, the table says 'yes'")
    return problems


def test_every_record_type_of_the_schema_has_a_section_in_the_enums_order():
    problems = section_problems(DOC.read_text(encoding="utf-8"))
    assert not problems, "docs/transcript.md:\n" + "\n".join(problems)


def test_every_field_the_schema_lists_is_in_its_record_types_table():
    problems = field_problems(DOC.read_text(encoding="utf-8"))
    assert not problems, "docs/transcript.md:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        ("| `limits` |", "| limits |", "`run_start`: no row for the field `limits`"),
        ("### `egress`", "### egress", "no section for `egress`"),
        ("| `killed` | boolean | yes |", "| `killed` | boolean | no |", "`turn_cancelled`: `killed` is required"),
        ("| `bytes` | integer | if `truncated` |", "| `bytes` | integer | yes |", "Common fields: `bytes` is not"),
        ("### `usage`", "### `tokens`", "a section for `tokens`, which is not a record type"),
    ],
)
def test_the_checks_name_what_the_doc_lost(old, new, problem):
    text = DOC.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    broken = text.replace(old, new)
    found = section_problems(broken) + field_problems(broken)
    assert any(p.startswith(problem) for p in found), found


def test_the_docs_link_to_the_schema_resolves_to_the_shipped_file():
    targets = re.findall(r"\]\(([^)\s]*transcript\.schema\.json)\)", DOC.read_text(encoding="utf-8"))
    assert targets, "docs/transcript.md does not link to transcript.schema.json"
    for target in targets:
        path = (DOC.parent / target).resolve()
        assert path.is_file(), f"the link {target!r} leads to {path}, which does not exist"
        assert path == (ROOT / "harness" / "transcript.schema.json").resolve(), target
        assert json.loads(path.read_text(encoding="utf-8")) == SCHEMA  # the one the package ships


def test_the_docs_example_lines_are_records_the_schema_accepts():
    blocks = re.findall(r"^```json\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.DOTALL | re.MULTILINE)
    examples = [json.loads(line) for block in blocks for line in block.splitlines() if line.strip()]
    assert {"rpc", "policy", "task_end", "terminal"} <= {r["type"] for r in examples}
    validator = jsonschema.Draft202012Validator(SCHEMA)
    for record in examples:
        errors = [e.message for e in validator.iter_errors(record)]
        assert not errors, (record["seq"], record["type"], errors)
