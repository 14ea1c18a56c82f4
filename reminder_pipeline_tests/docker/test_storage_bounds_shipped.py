"""Dagster's storage in compose and Helm carries the connection bounds the code gives it.

The Dagster processes of a deployment read ``DAGSTER_PG_URL`` (compose) or the chart's
``postgresql.postgresqlParams`` (rendered into ``postgres_db.params``) as they are: nothing of
ours adds the libpq keepalives, ``tcp_user_timeout`` and the session's statement timeout there.
So the shipped files must say them, with the values ``store.engine.dagster_storage_url`` adds
for ``reminder-pipeline up`` (one home: ``reminder_pipeline/store/pg_client.py``).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import yaml

from reminder_pipeline.store.engine import dagster_storage_url

ROOT = Path(__file__).resolve().parents[2]


def _expected() -> dict[str, str]:
    """The query ``dagster_storage_url`` gives a URL that sets none of its own."""
    url = dagster_storage_url("postgresql+psycopg2://u:p@db:5432/dagster")
    return dict(parse_qsl(urlsplit(url).query))


def test_compose_dagster_storage_urls_carry_the_bounds() -> None:
    text = (ROOT / "docker" / "compose.yaml").read_text(encoding="utf-8")
    urls = re.findall(r"DAGSTER_PG_URL: (postgresql\+psycopg2://.+)$", text, re.MULTILINE)
    assert len(urls) == 2, urls  # Dagster's processes, and the exporter's read-only login
    for url in urls:
        # After the database: the password's ${…:?message} has a '?' of its own.
        query = url.partition("/dagster?")[2]
        assert dict(parse_qsl(query)) == _expected(), url


def test_helm_postgresql_params_carry_the_bounds() -> None:
    values = yaml.safe_load((ROOT / "docker" / "helm" / "values.yaml").read_text("utf-8"))
    params = {k: str(v) for k, v in values["postgresql"]["postgresqlParams"].items()}
    assert params == _expected()
