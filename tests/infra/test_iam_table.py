"""docs/security.md's role-by-role IAM table is the synthesized stack's: every role, each statement
its policies allow and the table's resource policy, rendered from the session's template
(``tests/infra/iam_table.py``; regenerate with ``python -m tests.infra.iam_table --write``)."""

from tests.infra import iam_table


def test_every_role_is_described(synth):
    paths = [path for path, _, _ in iam_table.rows(synth.stack, synth.json)]
    assert len(paths) == len(synth.resources("AWS::IAM::Role"))
    assert [p for p in paths if not iam_table.PURPOSE.get(p)] == []
    assert set(iam_table.PURPOSE) == set(paths)  # no description of a role the stack no longer has


def test_the_documented_table_is_the_synthesized_one(synth):
    assert iam_table.documented() == iam_table.render(synth.stack, synth.json), (
        "docs/security.md's IAM table differs from the stack: run python -m tests.infra.iam_table --write"
    )


def test_the_table_shows_the_narrowing_that_matters(synth):
    """Spot checks of what the table must say (so a rendering that drops conditions fails)."""
    text = iam_table.documented()
    row = {path: cells for path, _, cells in iam_table.rows(synth.stack, synth.json)}
    assert any(
        "dynamodb:GetItem on <Storage/Table> if ForAllValues:StringLike dynamodb:LeadingKeys [KEY#*]" in c
        for c in row["Api/AuthorizerFunctionRole"]
    )
    worker = " ".join(row["Workers/Model0/Task/TaskRole"])
    assert (
        "T#*#BUDGET" in worker
        and "dynamodb:GetItem on <Storage/Table> if ForAllValues:StringLike dynamodb:LeadingKeys [T#*#BUDGET]" in worker
    )
    assert "BudgetsAppenderOnly" in text and "AuditAppenderOnly" in text
