"""docs/plan-schema.json is the schema of today's VMPlan (regenerate it as
hpcvm.plan.schema's docstring says when the model changes)."""

from __future__ import annotations

import json

from hpcvm.plan.model import PLAN_SCHEMA_VERSION, VMPlan
from hpcvm.plan.schema import plan_schema_json
from tests.conftest import REPO


def test_schema_file_is_current() -> None:
    on_disk = (REPO / "docs" / "plan-schema.json").read_text()
    assert on_disk == plan_schema_json(), (
        "docs/plan-schema.json is stale: regenerate it (see hpcvm/plan/schema.py)"
    )


def test_schema_describes_every_field_and_the_version() -> None:
    schema = json.loads((REPO / "docs" / "plan-schema.json").read_text())
    assert set(schema["properties"]) == set(VMPlan.model_fields)
    assert schema["properties"]["schema_version"]["default"] == PLAN_SCHEMA_VERSION
    assert str(PLAN_SCHEMA_VERSION) in schema["$id"]
