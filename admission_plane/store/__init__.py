"""The storage layer: entities, statements, rows, the unit of work, the doorbell and the schema check.

Nothing here knows the admission rules; the service layer (:mod:`admission_plane.service`)
composes these pieces. Where things live:

* :mod:`.model` — the SQLAlchemy entities (the schema as Alembic compares it);
* :mod:`.statements` — every SQL statement, one module per job; :mod:`.rows` the records they return;
* :mod:`.tx` — compiled statements run on the driver's cursor; :mod:`.unit_of_work` — one
  transaction per operation (how admission is serialised on each dialect);
* :mod:`.doorbell` — how committed writers wake waiting connectors;
* :mod:`.schema_spec` / :mod:`.schema_check` — the expected schema and the fail-closed check;
* :mod:`.engine` — engine construction, the one place connections are configured;
* :mod:`.status` — the operator's read-only picture.
"""

from __future__ import annotations

from .engine import DATABASE_URL_VARIABLE, create_admission_engine, parse_url
from .schema_check import check_schema, schema_version

__all__ = ["DATABASE_URL_VARIABLE", "check_schema", "create_admission_engine", "parse_url", "schema_version"]
