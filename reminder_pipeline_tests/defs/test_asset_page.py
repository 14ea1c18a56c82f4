"""The dispatcher asset's page names and links what feeds it: the schedule, the jobs that record
its materializations, the runbook; every runbook link is an absolute URL under the docs base URL
(``REMINDER_DOCS_BASE_URL``). No server: the definitions and the workspace files only."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from dagster import UrlMetadataValue

import reminder_pipeline
from reminder_pipeline.config import DEFAULT_DOCS_BASE_URL, ConfigError, docs_base_url
from reminder_pipeline.definitions import defs
from reminder_pipeline.defs.assets import (
    CODE_LOCATION,
    DISPATCH_ASSET_KEY,
    DISPATCH_RUNBOOK,
    DISPATCH_SCHEDULE,
    WRITING_JOBS,
    dispatch_asset,
)
from reminder_pipeline.defs.checks import runbook_link

REPO_ROOT = Path(reminder_pipeline.__file__).resolve().parent.parent
WORKSPACES = (
    REPO_ROOT / "workspace.yaml",
    REPO_ROOT / "docker" / "workspace.yaml",
    REPO_ROOT / "reminder_pipeline" / "dagster_workspace.yaml",
)
ENV = {"DAGSTER_WEBSERVER_PORT": "3456", "REMINDER_DOCS_BASE_URL": "https://git.test/r/docs"}


def test_the_names_linked_are_the_definitions_schedule_and_writing_jobs():
    repo = defs.get_repository_def()
    assert repo.get_schedule_def(DISPATCH_SCHEDULE).job_name in WRITING_JOBS
    # Every job with the step that records the materialization, and only those.
    recording = {j.name for j in repo.get_all_jobs() if j.graph.has_node_named("relay_outbox")}
    assert recording == set(WRITING_JOBS)
    for path in WORKSPACES:
        [entry] = yaml.safe_load(path.read_text())["load_from"]
        [(_, target)] = entry.items()  # python_module or grpc_server
        assert target["location_name"] == CODE_LOCATION, path
    assert (REPO_ROOT / "docs" / DISPATCH_RUNBOOK).is_file()


def test_the_description_and_metadata_link_the_schedule_the_jobs_and_the_runbook():
    spec = dispatch_asset(ENV)
    assert spec.key == DISPATCH_ASSET_KEY
    ui = "http://127.0.0.1:3456/locations/reminder_pipeline"
    links = {k: v.value for k, v in spec.metadata.items() if isinstance(v, UrlMetadataValue)}
    assert links == {
        "schedule": f"{ui}/schedules/reminder_dispatch_schedule",
        "job reminder_dispatch": f"{ui}/jobs/reminder_dispatch",
        "job reminder_catch_up": f"{ui}/jobs/reminder_catch_up",
        "runbook": "https://git.test/r/docs/runbooks/reminder-dispatch.md",
    }
    assert f"[reminder_dispatch_schedule]({ui}/schedules/reminder_dispatch_schedule)" in (
        spec.description or ""
    )
    assert f"[reminder_catch_up]({ui}/jobs/reminder_catch_up)" in (spec.description or "")


def test_runbook_links_are_absolute_urls_under_the_docs_base():
    link = runbook_link("docs/runbooks/outbox-backlog.md#stuck-relay", "https://git.test/d/")
    assert isinstance(link, UrlMetadataValue)
    assert link.value == "https://git.test/d/runbooks/outbox-backlog.md#stuck-relay"
    # The default: this checkout's docs directory, a file: URL that exists.
    assert docs_base_url({}) == DEFAULT_DOCS_BASE_URL
    assert DEFAULT_DOCS_BASE_URL.startswith("file:///") and DEFAULT_DOCS_BASE_URL.endswith("/")
    assert (REPO_ROOT / "docs").as_uri() + "/" == DEFAULT_DOCS_BASE_URL
    assert docs_base_url({"REMINDER_DOCS_BASE_URL": " https://h/x "}) == "https://h/x/"


@pytest.mark.parametrize(
    "bad", ["docs/", "ftp://h/docs/", "https://", "https:///docs", "javascript:alert(1)"]
)
def test_a_docs_base_url_that_is_not_absolute_is_one_line(bad):
    with pytest.raises(ConfigError) as error:
        docs_base_url({"REMINDER_DOCS_BASE_URL": bad})
    message = str(error.value)
    assert message.startswith("REMINDER_DOCS_BASE_URL=") and "\n" not in message
