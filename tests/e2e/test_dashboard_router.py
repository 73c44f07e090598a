"""The dashboard's routes, without a browser: the page, its assets, and the schemas the form uses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from server.dashboard.router import STATIC_DIR, router
from server.errors import install_error_handlers
from server.jobs.schemas import JobCreate
from twinkle_core.spec import JobSpec


@pytest.fixture()
def client() -> TestClient:
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(router)
    return TestClient(app)


def test_index_loads_the_app_module(client: TestClient) -> None:
    response = client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/dashboard/static/app.js">' in response.text
    assert client.get("/dashboard/", follow_redirects=False).headers["location"] == "/"


def test_every_asset_is_served_with_a_type_browsers_accept(client: TestClient) -> None:
    expected = {".js": "text/javascript", ".css": "text/css", ".html": "text/html", ".svg": "image/svg+xml"}
    files = [p for p in STATIC_DIR.rglob("*") if p.is_file()]
    assert files
    for path in files:
        relative = path.relative_to(STATIC_DIR).as_posix()
        response = client.get(f"/dashboard/static/{relative}")
        assert response.status_code == 200, relative
        assert response.headers["content-type"].startswith(expected[path.suffix]), relative
        assert response.headers["cache-control"] == "no-cache"
        assert response.content == path.read_bytes()


@pytest.mark.parametrize(
    "path", ["%2e%2e/router.py", "..%2F..%2Frouter.py", "lib", "nope.js", "%2Fetc%2Fpasswd"]
)
def test_nothing_outside_the_static_files_is_served(client: TestClient, path: str) -> None:
    response = client.get(f"/dashboard/static/{path}")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_every_module_import_resolves() -> None:
    """A typo in an import path only shows up in a browser otherwise: check the whole graph."""
    import_re = re.compile(r"""^\s*import\s[^;]*?from\s+["'](\.[^"']+)["']""", re.MULTILINE | re.DOTALL)
    modules = sorted(STATIC_DIR.rglob("*.js"))
    for module in modules:
        for target in import_re.findall(module.read_text()):
            assert (module.parent / target).resolve().is_file(), f"{module.name} imports missing {target}"
    entry = (STATIC_DIR / "index.html").read_text()
    assert "/dashboard/static/app.js" in entry and (STATIC_DIR / "app.js").is_file()


def test_jobspec_schema_is_the_models(client: TestClient) -> None:
    schema = client.get("/dashboard/api/jobspec-schema").json()
    assert schema == JobSpec.model_json_schema()
    assert {"model", "adapter", "data", "training", "optimizer", "scheduler", "resources"} <= set(
        schema["properties"]
    )


def test_job_fields_schema_carries_the_api_constraints(client: TestClient) -> None:
    fields = client.get("/dashboard/api/job-fields-schema").json()["properties"]
    assert set(fields) == {"name", "priority", "max_retries", "timeout_seconds"}
    assert fields == {name: JobCreate.model_json_schema()["properties"][name] for name in fields}
    assert fields["priority"]["minimum"] == -100 and fields["priority"]["maximum"] == 100


def test_the_api_server_serves_the_dashboard(tmp_path: Path) -> None:
    """The real app: the page at `/`, the assets, and none of it in the API's OpenAPI document."""
    from jobcore.settings import Settings
    from server.app import create_app

    with TestClient(create_app(Settings(data_dir=tmp_path), dispatch=lambda job_id: None)) as real:
        assert '<script type="module"' in real.get("/").text
        assert real.get("/dashboard/static/app.js").headers["content-type"].startswith("text/javascript")
        assert real.get("/dashboard/api/jobspec-schema").json() == JobSpec.model_json_schema()
        paths = real.get("/openapi.json").json()["paths"]
        assert "/v1/jobs" in paths
        assert not [path for path in paths if path == "/" or path.startswith("/dashboard")]


def test_static_dir_holds_no_third_party_bundles() -> None:
    """The dashboard is our own small code: no minified vendor files committed."""
    for path in Path(STATIC_DIR).rglob("*.js"):
        longest = max(len(line) for line in path.read_text().splitlines())
        assert longest < 200, f"{path.name} has a {longest}-character line (minified code?)"
