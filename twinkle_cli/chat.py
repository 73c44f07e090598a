"""`twinkle-jobs chat JOB_ID`: talk to a fine-tuned model from a terminal, or ask it once in CI.

Interactive when stdin is a terminal (the conversation is kept and sent with every turn);
one-shot with `-p PROMPT`, or with the prompt on stdin when it is not a terminal. The model is the
job's final model (`fine_tuned_model`, once it succeeded) or, with `--checkpoint STEP`, that
checkpoint (`JOB_ID:ckpt-STEP`). The exit code tells a pipeline what went wrong.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import click
import httpx

from twinkle_client import APIError, StreamError, TwinkleClient, checkpoint_model

EXIT_OK = 0
EXIT_ERROR = 1  # any other failure (authentication, a server error)
EXIT_USAGE = 2  # a bad option, or a request the model refuses (400: prompt + max_tokens over its context)
EXIT_NOT_FOUND = 4  # no such job or checkpoint, or the job has no final model yet (404)
EXIT_UNAVAILABLE = 5  # no serving host, the model did not load in time, the server unreachable (503)

HELP = "/reset clears the conversation, /exit or Ctrl-D quits, Ctrl-C stops an answer"


class ChatFailed(Exception):
    """A failure to report on stderr, ending the command with `exit_code`."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def exit_code_of(exc: APIError) -> int:
    if exc.status_code == 404:
        return EXIT_NOT_FOUND
    if exc.status_code in (400, 422):
        return EXIT_USAGE
    if exc.status_code in (502, 503, 504):
        return EXIT_UNAVAILABLE
    return EXIT_ERROR


@contextmanager
def api_errors(url: str) -> Iterator[None]:
    """APIError and connection failures (to the server at `url`) as `ChatFailed` with the
    matching exit code."""
    try:
        yield
    except APIError as exc:
        raise ChatFailed(str(exc), exit_code_of(exc)) from exc
    except StreamError as exc:
        raise ChatFailed(f"the answer broke off: {exc}", EXIT_ERROR) from exc
    except (httpx.TransportError, ConnectionError) as exc:
        raise ChatFailed(f"cannot reach the server at {url}: {exc}", EXIT_UNAVAILABLE) from exc


def resolve_model(client: TwinkleClient, job_id: str, step: int | None) -> str:
    if step is not None:
        return checkpoint_model(job_id, step)  # the server says 404 if it is not a complete one
    job = client.jobs.get(job_id)
    model = job.get("fine_tuned_model")
    if not model:
        steps = [str(c["step"]) for c in client.checkpoints.list(job_id)]
        ended = bool(job.get("terminal"))  # failed or cancelled: no final model will come
        if steps:
            hint = f"; pass --checkpoint STEP (its checkpoints: {', '.join(steps)})"
        else:
            hint = " and no checkpoint" if ended else "; pass --checkpoint STEP once it has a checkpoint"
        if not ended:
            why = "until it succeeds"
        elif job["status"] == "succeeded":
            why = "any more: its final checkpoint is gone"
        else:
            why = f"(it {job['status']})"
        raise ChatFailed(f"job {job_id} has no final model {why}{hint}", EXIT_NOT_FOUND)
    return str(model)


@dataclass(frozen=True)
class Sampling:
    max_tokens: int | None  # None: as many as the model's context leaves (the server's default)
    temperature: float


def is_interactive() -> bool:
    return sys.stdin.isatty()


@click.command()
@click.argument("job_id")
@click.option("--checkpoint", "step", type=click.IntRange(min=0), default=None, help="Chat with this step")
@click.option("-p", "--prompt", default=None, help="Ask once, print the answer and exit (for CI)")
@click.option("--system", default=None, help="A system message before the conversation")
@click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="At most this many tokens per answer  [default: what the model's context leaves]",
)
@click.option("--temperature", type=click.FloatRange(min=0.0, max=2.0), default=0.7, show_default=True)
@click.option("--output", "-o", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option(
    "--url", envvar="TWINKLE_URL", default="http://127.0.0.1:8000", show_default=True, show_envvar=True
)
@click.option("--token", envvar="TWINKLE_TOKEN", default=None, show_envvar=True, help="API token")
def chat(
    job_id: str,
    step: int | None,
    prompt: str | None,
    system: str | None,
    max_tokens: int | None,
    temperature: float,
    output: str,
    url: str,
    token: str | None,
) -> None:
    """Chat with a job's fine-tuned model, or one of its checkpoints.

    \b
    Exit codes: 0 answered; 1 another error; 2 a bad option or a prompt over the model's
    context; 4 no such job or checkpoint (or the job has not succeeded: use --checkpoint);
    5 inference unavailable (no serving host, the model still loading, server unreachable).
    """
    if prompt is not None and not prompt.strip():
        raise click.UsageError("the prompt (-p) is empty")
    if prompt is None and is_interactive():
        if output == "json":
            raise click.UsageError("-o json needs a one-shot prompt (-p, or the prompt on stdin)")
    elif prompt is None:
        prompt = sys.stdin.read()
        if not prompt.strip():
            raise click.UsageError("no prompt: give -p PROMPT, or the prompt on stdin")
    settings = Sampling(max_tokens, temperature)
    try:
        with TwinkleClient(url, token) as client, api_errors(url):
            model = resolve_model(client, job_id, step)
            history = [{"role": "system", "content": system}] if system else []
            if prompt is None:
                Conversation(client, model, history, settings).run()
            else:
                ask_once(client, model, [*history, {"role": "user", "content": prompt}], settings, output)
    except ChatFailed as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(exc.exit_code)


def ask_once(
    client: TwinkleClient, model: str, messages: list[dict[str, str]], settings: Sampling, output: str
) -> None:
    """One answer: streamed to stdout as it comes, or the whole completion object with -o json."""
    sampling: dict[str, Any] = {"max_tokens": settings.max_tokens, "temperature": settings.temperature}
    if output == "json":
        answer = client.inference.chat(model, messages, **sampling)
        click.echo(json.dumps(answer, indent=2))
        return
    with client.inference.chat(model, messages, stream=True, **sampling) as stream:
        for delta in stream:
            click.echo(delta, nl=False)
    click.echo()


class Conversation:
    """The interactive loop: read a line, stream the answer, keep both for the next turn."""

    def __init__(
        self,
        client: TwinkleClient,
        model: str,
        history: list[dict[str, str]],
        settings: Sampling,
        read: Callable[[str], str] = input,
    ) -> None:
        self.client = client
        self.model = model
        self.system = list(history)
        self.history = list(history)
        self.settings = settings
        self.read = read

    def run(self) -> None:
        # Line editing and ↑ history for input(); not on every platform, where plain input() works.
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401
        click.echo(f"chatting with {self.model}  ({HELP})", err=True)
        while True:
            try:
                line = self.read("> ").strip()
            except EOFError:
                click.echo(err=True)
                return
            except KeyboardInterrupt:
                click.echo(err=True)
                continue  # Ctrl-C at the prompt clears the line, as in a shell
            if line in ("/exit", "/quit"):
                return
            if line == "/reset":
                self.history = list(self.system)
                click.echo("(conversation cleared)", err=True)
                continue
            if line:
                self.turn(line)

    def turn(self, line: str) -> None:
        messages = [*self.history, {"role": "user", "content": line}]
        try:
            stream = self.client.inference.chat(
                self.model,
                messages,
                stream=True,
                max_tokens=self.settings.max_tokens,
                temperature=self.settings.temperature,
            )
        except APIError as exc:
            if exc.status_code == 404:
                raise  # the model is gone: nothing later can answer
            click.echo(f"error: {exc}", err=True)  # a turn the user may retry (503, 400)
            return
        answer = ""
        try:
            with stream:
                for delta in stream:
                    answer += delta
                    click.echo(delta, nl=False)
        except KeyboardInterrupt:
            click.echo(" [stopped]", nl=False, err=True)  # closing the stream stops the generation
        except StreamError as exc:
            click.echo(f"\nerror: the answer broke off: {exc}", err=True)
            return  # not kept: the user may ask again
        click.echo()
        # What was shown is what the model said, even when cut short.
        self.history = [*messages, {"role": "assistant", "content": answer}]
