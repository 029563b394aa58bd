"""The JSON Schema of ``hpcvm plan --format json`` (docs/plan-schema.json).

Generated from the VMPlan model so the documented schema cannot drift from the code; a
unit test fails when docs/plan-schema.json is not what this returns. Regenerate with:

    .venv/bin/python -c 'from hpcvm.plan.schema import plan_schema_json as s; print(s(), end="")' \
        > docs/plan-schema.json
"""

from __future__ import annotations

import json
from typing import Any

from hpcvm.plan.model import PLAN_SCHEMA_VERSION, VMPlan

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def plan_schema() -> dict[str, Any]:
    schema = VMPlan.model_json_schema()
    return {
        "$schema": SCHEMA_DIALECT,
        "$id": f"https://hpcvm.invalid/plan-schema-v{PLAN_SCHEMA_VERSION}.json",
        **schema,
    }


def plan_schema_json() -> str:
    return json.dumps(plan_schema(), indent=2) + "\n"
