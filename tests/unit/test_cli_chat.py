"""`twinkle-jobs chat`: one-shot answers for CI, the interactive conversation, and exit codes a
pipeline can branch on.

Driven against the OpenAI protocol's stand-in (tests/support/openai_standin.py) over real HTTP;
the command against the real server and serving host is in the integration tests.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest
from click.testing import CliRunner, Result
from openai_standin import FAILED_JOB, FINE_TUNED, JOB, RUNNING_JOB, TOKEN, Standin, serve_standin

from twinkle_cli import chat as chat_module
from twinkle_cli.chat import EXIT_NOT_FOUND, EXIT_UNAVAILABLE, EXIT_USAGE
from twinkle_cli.main import cli

Invoke = Callable[..., Result]


@pytest.fixture(scope="module")
def standin() -> Iterator[Standin]:
    yield from serve_standin()


@pytest.fixture()
def run(standin: Standin, monkeypatch: pytest.MonkeyPatch) -> Invoke:
    monkeypatch.setattr("twinkle_client.client.time.sleep", lambda _s: None)  # no back-off waits

    def invoke(*args: str, input: str | None = None, tty: bool = False) -> Result:
        monkeypatch.setattr(chat_module, "is_interactive", lambda: tty)
        env = {"TWINKLE_URL": standin.url, "TWINKLE_TOKEN": TOKEN}
        return CliRunner().invoke(cli, ["chat", *args], input=input, env=env)

    return invoke


def test_one_shot_prints_the_streamed_answer(run: Invoke, standin: Standin) -> None:
    result = run(JOB, "-p", "hello there world", "--max-tokens", "2", "--temperature", "0")
    assert result.exit_code == 0, result.output
    assert result.stdout == "hello there \n"
    sent = standin.state.requests[-1]
    assert sent["model"] == FINE_TUNED  # the job's final model, found through the server
    assert (sent["stream"], sent["max_tokens"], sent["temperature"]) == (True, 2, 0.0)
    # Without --max-tokens the server sizes the answer to the context left: a fixed default
    # (256) was over the whole context of a small model, and every answer was refused.
    assert run(JOB, "-p", "hello there").exit_code == 0
    assert "max_tokens" not in standin.state.requests[-1]


def test_checkpoint_and_system_message_and_json(run: Invoke, standin: Standin) -> None:
    result = run(
        RUNNING_JOB,
        "--checkpoint",
        "2",
        "--system",
        "be brief",
        "-p",
        "hi",
        "--max-tokens",
        "8",
        "-o",
        "json",
    )
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"]["content"] == "be brief hi "
    assert standin.state.requests[-1]["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]


def test_the_prompt_can_come_on_stdin(run: Invoke) -> None:
    result = run(JOB, "--max-tokens", "3", input="piped prompt text\n")
    assert (result.exit_code, result.stdout) == (0, "piped prompt text \n")


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["job-nope", "-p", "hi"], EXIT_NOT_FOUND, "not found"),
        ([JOB, "--checkpoint", "3", "-p", "hi"], EXIT_NOT_FOUND, "does not exist"),
        ([RUNNING_JOB, "-p", "hi"], EXIT_NOT_FOUND, "pass --checkpoint STEP (its checkpoints: 2)"),
        (
            [FAILED_JOB, "-p", "hi"],
            EXIT_NOT_FOUND,
            "has no final model (it failed) and no checkpoint",
        ),
        ([JOB, "-p", "  "], EXIT_USAGE, "the prompt (-p) is empty"),
        ([JOB, "--checkpoint", "2", "-p", "hi"], EXIT_UNAVAILABLE, "loading"),
        ([JOB, "-p", "hi", "--max-tokens", "100"], EXIT_USAGE, "param: messages"),
        ([JOB, "-p", "hi", "--temperature", "9"], EXIT_USAGE, "--temperature"),
        ([JOB], EXIT_USAGE, "no prompt"),
    ],
)
def test_exit_codes(run: Invoke, args: list[str], code: int, says: str) -> None:
    result = run(*args, input="")
    assert result.exit_code == code, result.output
    assert says in result.output


def test_an_unreachable_server_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("twinkle_client.client.time.sleep", lambda _s: None)
    env = {"TWINKLE_URL": "http://127.0.0.1:9", "TWINKLE_TOKEN": TOKEN}
    result = CliRunner().invoke(cli, ["chat", JOB, "-p", "hi"], env=env)
    assert result.exit_code == EXIT_UNAVAILABLE
    assert "cannot reach the server at http://127.0.0.1:9" in result.output


def test_interactive_keeps_the_conversation(run: Invoke, standin: Standin) -> None:
    lines = "first words\n/reset\nagain\nmore\n/exit\n"
    result = run(JOB, "--max-tokens", "8", input=lines, tty=True)
    assert result.exit_code == 0, result.output
    assert "first words \n" in result.stdout and "again more \n" in result.stdout
    turns = [r["messages"] for r in standin.state.requests[-3:]]
    assert turns[0] == [{"role": "user", "content": "first words"}]
    assert turns[1] == [{"role": "user", "content": "again"}]  # /reset forgot the first exchange
    assert turns[2] == [
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "again "},
        {"role": "user", "content": "more"},
    ]


def test_interactive_survives_a_failed_turn(run: Invoke, standin: Standin) -> None:
    # A model still loading (503, retried, then given up) and an answer that breaks off: each is
    # reported, neither ends the conversation nor enters its history.
    lines = "hello BREAK\nstill here\n/exit\n"
    result = run(JOB, "--max-tokens", "8", input=lines, tty=True)
    assert result.exit_code == 0, result.output
    assert "the answer broke off" in result.output and "still here \n" in result.stdout
    assert standin.state.requests[-1]["messages"] == [{"role": "user", "content": "still here"}]

    result = run(JOB, "--checkpoint", "2", input="hi\n/exit\n", tty=True)
    assert result.exit_code == 0 and "the model is loading" in result.output
