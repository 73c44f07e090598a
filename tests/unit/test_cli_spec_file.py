"""A spec file with `--set` overrides, as `jobs validate` and `jobs submit` read it (a pipeline
keeps one file and varies a field per run), and the command's `--version`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from test_api_support import *  # noqa: F403
from test_api_support import BOOTSTRAP, Api, spec_body
from test_cli_admin import client_of

from twinkle_cli import resources
from twinkle_cli.main import cli


@pytest.fixture()
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    body = spec_body(spec={**spec_body()["spec"], "training": {"max_steps": 4, "batch_size": 2}})
    path.write_text(yaml.safe_dump(body))
    return path


def validate(spec_file: Path, *overrides: str) -> tuple[int, str]:
    args = ["jobs", "validate", "-f", str(spec_file), "-o", "json"]
    for override in overrides:
        args += ["--set", override]
    result = CliRunner().invoke(cli, args)
    return result.exit_code, result.output


def test_an_override_replaces_one_field_and_keeps_the_rest_of_its_section(spec_file: Path) -> None:
    code, out = validate(
        spec_file, "training.max_steps=9", "optimizer.lr=2e-4", "adapter.target_modules=[q_proj, v_proj]"
    )
    assert code == 0, out
    spec = json.loads(out)
    assert spec["training"]["max_steps"] == 9 and spec["training"]["batch_size"] == 2  # the file's
    assert spec["optimizer"]["lr"] == 2e-4  # a YAML number, not the string "2e-4"
    assert spec["adapter"]["target_modules"] == ["q_proj", "v_proj"]  # a section the file lacks


def test_an_override_is_validated_like_the_file(spec_file: Path) -> None:
    code, out = validate(spec_file, "training.max_stepz=9")
    assert code == 1
    assert "unknown field 'spec.training.max_stepz' (did you mean 'spec.training.max_steps'?)" in out
    code, out = validate(spec_file, "training.max_steps=0")
    assert code == 1 and "spec.training.max_steps" in out
    # The field as the message names it is taken too.
    code, out = validate(spec_file, "spec.training.max_steps=7")
    assert code == 0 and json.loads(out)["training"]["max_steps"] == 7


def test_validate_checks_the_whole_job_body_and_names_the_field_of_a_cross_check(
    tmp_path: Path, spec_file: Path
) -> None:
    body = yaml.safe_load(spec_file.read_text())
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**body, "priority": "high", "max_retries": -3, "metadata": [1]}))
    code, out = validate(bad)
    assert code == 1  # as the API would refuse it, not "valid"
    assert "priority: Input should be a valid integer" in out
    assert "max_retries: Input should be greater than or equal to 0" in out
    assert "metadata: Input should be a valid dictionary" in out
    code, out = validate(
        spec_file,
        "model.strategy=native_fsdp",
        "model.device_mesh={fsdp_size: 3}",
        "resources.nproc_per_node=2",
    )
    assert code == 1
    assert "spec.model.device_mesh: dp_size (-1) x fsdp_size (3) must equal" in out
    assert "spec.spec" not in out


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("training.max_steps",), "expected KEY=VALUE"),
        (("training..max_steps=3",), "expected KEY=VALUE"),
        (("training=3", "training.max_steps=4"), "training is set to a value and used as a section"),
        (("training.max_steps=[1",), "training.max_steps: '[1' is not a YAML value"),
    ],
)
def test_a_malformed_override_is_a_usage_error_naming_it(
    spec_file: Path, overrides: tuple[str, ...], message: str
) -> None:
    code, out = validate(spec_file, *overrides)
    assert code == 2  # click's usage error: nothing was validated, let alone submitted
    assert "--set" in out and message in out


def test_submit_sends_the_file_with_the_overrides(
    api: Api, spec_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resources, "TwinkleClient", lambda _url, token: client_of(api, token))
    runner = CliRunner(env={"TWINKLE_TOKEN": BOOTSTRAP, "TWINKLE_URL": "http://testserver"})
    args = ["jobs", "submit", "-f", str(spec_file), "--set", "training.max_steps=7", "-o", "json"]
    result = runner.invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    job = json.loads(result.output)
    stored = api.client.get(f"/v1/jobs/{job['id']}", params={"expand": "spec"}, headers=api.admin).json()
    assert stored["name"] == "demo"  # the file's job body, not only its spec
    assert stored["spec"]["training"]["max_steps"] == 7 and stored["spec"]["training"]["batch_size"] == 2


def test_submit_prints_the_job_id_alone_on_stdout(
    api: Api, spec_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JOB=$(twinkle-jobs jobs submit -f spec.yaml) holds the id; the status goes to stderr."""
    monkeypatch.setattr(resources, "TwinkleClient", lambda _url, token: client_of(api, token))
    runner = CliRunner(env={"TWINKLE_TOKEN": BOOTSTRAP, "TWINKLE_URL": "http://testserver"})
    result = runner.invoke(cli, ["jobs", "submit", "-f", str(spec_file)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    job_id = result.stdout.strip()
    assert job_id.startswith("job-") and "\n" not in job_id
    assert api.client.get(f"/v1/jobs/{job_id}", headers=api.admin).json()["status"] == "queued"
    assert f"queued; wait for it with: twinkle-jobs jobs wait {job_id} --follow" in result.stderr
    # A clone is a new job too: CLONE=$(twinkle-jobs jobs clone ...) holds its id.
    cloned = runner.invoke(
        cli, ["jobs", "clone", job_id, "--set", "training.max_steps=5"], catch_exceptions=False
    )
    assert cloned.exit_code == 0, cloned.output
    clone_id = cloned.stdout.strip()
    assert clone_id.startswith("job-") and clone_id != job_id and "\n" not in clone_id
    assert api.client.get(f"/v1/jobs/{clone_id}", headers=api.admin).json()["name"] == "demo"
    assert f"queued; wait for it with: twinkle-jobs jobs wait {clone_id} --follow" in cloned.stderr


def test_version() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("twinkle-jobs, version ")


def test_submit_uploads_a_dataset_named_by_a_relative_local_path(
    api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resources, "TwinkleClient", lambda _url, token: client_of(api, token))
    work = tmp_path / "work"  # the directory the user runs the command in
    (work / "data").mkdir(parents=True)
    (work / "data" / "train.jsonl").write_text('{"text": "hello"}\n{"text": "world"}\n')
    monkeypatch.chdir(work)
    spec = {
        "model": {"model_id": "org/tiny-llama"},
        "data": {"train_file": "data/train.jsonl", "validation_file": "./data/train.jsonl"},
        "training": {"batch_size": 2},  # the file's two rows
    }
    (work / "job.yaml").write_text(yaml.safe_dump({"name": "local-data", "spec": spec}))
    runner = CliRunner(env={"TWINKLE_TOKEN": BOOTSTRAP, "TWINKLE_URL": "http://testserver"})
    result = runner.invoke(cli, ["jobs", "submit", "-f", "job.yaml", "-o", "json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (uploaded,) = api.client.get("/v1/files", headers=api.admin).json()["data"]  # one upload for both
    assert uploaded["filename"] == "train.jsonl"
    assert f"uploaded data/train.jsonl as {uploaded['id']} (spec.data.train_file)" in result.stderr
    job_id = json.loads(result.stdout)["id"]  # the notice went to stderr
    stored = api.client.get(f"/v1/jobs/{job_id}", params={"expand": "spec"}, headers=api.admin).json()
    assert stored["spec"]["data"]["train_file"] == stored["spec"]["data"]["validation_file"] == uploaded["id"]

    # Submitted again (a pipeline's next run, or after a refusal): the same file, not a copy.
    again = runner.invoke(cli, ["jobs", "submit", "-f", "job.yaml", "-o", "json"], catch_exceptions=False)
    assert again.exit_code == 0, again.output
    listed = api.client.get("/v1/files", headers=api.admin).json()["data"]
    assert [f["id"] for f in listed] == [uploaded["id"]]
    assert f"data/train.jsonl is {uploaded['id']}, uploaded earlier (spec.data.train_file)" in again.stderr
    # Other content under the same name is a new upload.
    (work / "data" / "train.jsonl").write_text('{"text": "changed"}\n{"text": "too"}\n')
    changed = runner.invoke(cli, ["jobs", "submit", "-f", "job.yaml", "-o", "json"], catch_exceptions=False)
    assert changed.exit_code == 0, changed.output
    assert len(api.client.get("/v1/files", headers=api.admin).json()["data"]) == 2


def test_a_relative_dataset_path_that_is_not_here_is_left_to_the_server(
    api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resources, "TwinkleClient", lambda _url, token: client_of(api, token))
    monkeypatch.chdir(tmp_path)
    spec = {"model": {"model_id": "org/tiny-llama"}, "data": {"train_file": "missing.jsonl"}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({"spec": spec}))
    runner = CliRunner(env={"TWINKLE_TOKEN": BOOTSTRAP, "TWINKLE_URL": "http://testserver"})
    result = runner.invoke(cli, ["jobs", "submit", "-f", "job.yaml"], catch_exceptions=False)
    assert result.exit_code == 1 and "422" in result.output and "spec.data.train_file" in result.output
    assert api.client.get("/v1/files", headers=api.admin).json()["data"] == []


def test_a_job_file_may_come_on_standard_input(
    api: Api, spec_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make-spec | twinkle-jobs jobs submit -f -` in a pipeline, in YAML or JSON."""
    monkeypatch.setattr(resources, "TwinkleClient", lambda _url, token: client_of(api, token))
    runner = CliRunner(env={"TWINKLE_TOKEN": BOOTSTRAP, "TWINKLE_URL": "http://testserver"})
    as_json = json.dumps(yaml.safe_load(spec_file.read_text()))
    for text in (spec_file.read_text(), as_json):
        args = ["jobs", "submit", "-f", "-", "--set", "training.max_steps=3"]
        result = runner.invoke(cli, args, input=text, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        stored = api.client.get(
            f"/v1/jobs/{result.stdout.strip()}", params={"expand": "spec"}, headers=api.admin
        ).json()
        assert stored["name"] == "demo" and stored["spec"]["training"]["max_steps"] == 3
    result = runner.invoke(cli, ["jobs", "validate", "-f", "-"], input=spec_file.read_text())
    assert result.exit_code == 0 and "<stdin>: valid" in result.output
    result = runner.invoke(cli, ["jobs", "validate", "-f", "-"], input="- not\n- a mapping\n")
    assert result.exit_code == 2 and "<stdin>: expected a mapping at the top level" in result.output


def test_a_misspelt_top_level_key_is_named_by_validate_and_submit(tmp_path: Path, spec_file: Path) -> None:
    body = yaml.safe_load(spec_file.read_text())
    typo = tmp_path / "typo.yaml"
    typo.write_text(yaml.safe_dump({**body, "priorty": 5}))
    for command in ("validate", "submit"):
        result = CliRunner(env={"TWINKLE_TOKEN": "t"}).invoke(cli, ["jobs", command, "-f", str(typo)])
        assert result.exit_code == 2, result.output  # a usage error, before anything is sent
        assert "unknown top-level key 'priorty' (did you mean 'priority'?)" in result.output
        assert "Traceback" not in result.output


def test_a_spec_file_of_any_suffix_may_be_yaml_and_bad_bytes_are_named(
    tmp_path: Path, spec_file: Path
) -> None:
    as_text = tmp_path / "job.txt"
    as_text.write_text(spec_file.read_text())
    assert validate(as_text)[0] == 0
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(spec_file.read_bytes() + b"# caf\xe9\n")
    code, output = validate(latin)
    assert code == 2 and "not UTF-8 text" in output


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    """`twinkle-jobs jobs events J --follow | head -1`: the closed pipe is not a network error."""
    import subprocess
    import sys

    code = (
        "import click\n"
        "from twinkle_cli.resources import handle_api_errors\n"
        "@handle_api_errors\n"
        "def talk():\n"
        "    for i in range(100000):\n"
        "        click.echo(f'line {i}')\n"
        "talk()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"line 0\n"
    proc.stdout.close()  # as `head -1` does
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and err == b"", err.decode()
