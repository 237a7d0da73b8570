"""Bad input is a typed error with a clear message, and nothing is half-written."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable

import pytest
from pydantic import TypeAdapter, ValidationError

from tests.conftest import RuntimeFactory
from tests.helpers import add
from turnkit import (
    Agent,
    ConfigurationError,
    ContentTooLargeError,
    DuplicateToolError,
    EmptyContentError,
    InvalidInputError,
    InvalidSessionIdError,
    ModelCredentialsError,
    ModelFamily,
    ModelUnreachableError,
    RuntimeClosedError,
    RuntimeConfig,
    SessionNotFoundError,
    SessionRuntime,
    StoreError,
    UnknownModelError,
    tool,
)
from turnkit.blocks import ContentPart, ImagePart, TextPart, UserBlock
from turnkit.runtime import MessageContent
from turnkit.runtime._validate import inline_bytes
from turnkit.testing import ModelStep, ScriptedModel, call, collect_events


async def _nothing_written(runtime_factory: RuntimeFactory, session_id: str) -> None:
    probe = runtime_factory(Agent(model=ScriptedModel([])))
    await probe.open()
    assert await probe.store.list_turns(session_id) == []  # type: ignore[arg-type]
    with pytest.raises(SessionNotFoundError):
        await probe.history(session_id)


@pytest.mark.parametrize("content", ["", "   \n\t "])
async def test_empty_content(runtime_factory: RuntimeFactory, content: str) -> None:
    model = ScriptedModel([ModelStep.text_reply("never")])
    runtime = runtime_factory(Agent(model=model))
    with pytest.raises(EmptyContentError, match="empty"):
        await collect_events(runtime.execute_message("s1", content))
    assert model.calls == []
    await _nothing_written(runtime_factory, "s1")


@pytest.mark.parametrize(
    ("content", "request_id"),
    [("a\x00b", None), ([TextPart(text="ok"), TextPart(text="\x00")], None), ("ok", "r\x00")],
)
async def test_a_nul_character_no_database_can_store_is_refused(
    runtime_factory: RuntimeFactory, content: MessageContent, request_id: str | None
) -> None:
    model = ScriptedModel([ModelStep.text_reply("never")])
    runtime = runtime_factory(Agent(model=model))
    with pytest.raises(InvalidInputError, match="U\\+0000"):
        await collect_events(runtime.execute_message("s1", content, request_id=request_id))
    with pytest.raises(InvalidInputError, match="title"):
        await runtime.create_session("s1", title="a\x00")
    assert model.calls == []
    await _nothing_written(runtime_factory, "s1")


@pytest.mark.parametrize(
    "content",
    [
        "caf\udce9",  # bytes decoded with surrogateescape
        [TextPart(text="ok"), TextPart(text="\ud800")],
        [ImagePart(url="https://example.org/\ud800.png")],
    ],
)
async def test_a_lone_surrogate_no_database_can_store_is_refused(
    runtime_factory: RuntimeFactory, content: MessageContent
) -> None:
    model = ScriptedModel([ModelStep.text_reply("never")])
    runtime = runtime_factory(Agent(model=model))
    with pytest.raises(InvalidInputError, match="lone surrogate \\(U\\+D"):
        await collect_events(runtime.execute_message("s1", content))
    with pytest.raises(InvalidInputError, match="lone surrogate"):
        await runtime.create_session("s1", title="a\udcff")
    assert model.calls == []
    await _nothing_written(runtime_factory, "s1")


async def test_a_message_that_is_neither_text_nor_parts_is_refused(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime = runtime_factory(Agent(model=ScriptedModel([])))
    with pytest.raises(InvalidInputError, match="not int"):
        await collect_events(runtime.execute_message("s1", 42))  # type: ignore[arg-type]
    await _nothing_written(runtime_factory, "s1")


async def test_a_picture_by_url_must_come_by_http_or_a_data_url(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime = runtime_factory(Agent(model=ScriptedModel([])))
    with pytest.raises(InvalidInputError, match="'javascript'"):
        await collect_events(runtime.execute_message("s1", [ImagePart(url="javascript:alert(1)")]))
    page = ImagePart(url="data:text/html,<script>alert(1)</script>")
    with pytest.raises(InvalidInputError, match="image type .*'text/html'"):
        await collect_events(runtime.execute_message("s1", [page]))
    await _nothing_written(runtime_factory, "s1")


async def test_a_picture_over_the_limit_is_refused_however_it_is_sent(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime = runtime_factory(Agent(model=ScriptedModel([])))
    too_big = b"\x89PNG" + bytes(20 * 1024 * 1024)
    as_url = "data:image/png;base64," + base64.b64encode(too_big).decode()
    for picture in (ImagePart(data=too_big), ImagePart(url=as_url)):
        with pytest.raises(ContentTooLargeError, match="limit is 20971520"):
            await collect_events(runtime.execute_message("s1", [picture]))
    await _nothing_written(runtime_factory, "s1")
    with pytest.raises(InvalidInputError, match="holds no bytes"):
        await collect_events(
            runtime.execute_message("s1", [ImagePart(url="data:image/png;base64,")])
        )
    for broken in ("data:image/png;base64,!!!", "data:image/png;base64,aGVsbG8"):
        with pytest.raises(InvalidInputError, match="says base64 but its data is not base64"):
            await collect_events(runtime.execute_message("s1", [ImagePart(url=broken)]))
    await _nothing_written(runtime_factory, "s1")
    at_limit = "data:image/png;base64," + base64.b64encode(bytes(20 * 1024 * 1024)).decode()
    assert inline_bytes(ImagePart(url=at_limit)) == 20 * 1024 * 1024  # the limit is allowed
    assert ImagePart(data=b"\x89PNG", media_type="IMAGE/PNG").media_type == "image/png"


@pytest.mark.parametrize(
    ("build", "says"),
    [
        (lambda: ImagePart(data=b""), "an image's `data` is empty"),
        (lambda: ImagePart(), "exactly one of `url` or `data`"),
        (lambda: ImagePart(url="https://x.test/a.png", data=b"x"), "exactly one of"),
        (lambda: ImagePart(data=b"x", media_type="text/html"), "'text/html' is not an image"),
        (lambda: ImagePart(data="!!!"), "`data` text must be base64"),
        (lambda: ImagePart(url="https://x.test/a.png", size=3), "size: Extra inputs"),
        (lambda: TextPart(text=3), "text: Input should be a valid string"),
        (lambda: TextPart(), "text: Field required"),
    ],
    ids=["empty", "none", "both", "not-image", "not-base64", "extra", "text-type", "no-text"],
)
def test_a_content_part_built_wrong_is_invalid_input(
    build: Callable[[], object], says: str
) -> None:
    """A message part built wrong in Python raises `InvalidInputError`, as over HTTP.

    It raised pydantic's `ValidationError`, which no `except TurnkitError` catches. The
    error is a `ValueError` too, so a part inside a model pydantic validates still makes
    that model's `ValidationError`.
    """
    with pytest.raises(InvalidInputError, match=re.escape(says)) as raised:
        build()
    assert raised.value.code == "invalid-input"
    assert isinstance(raised.value, ValueError)
    assert isinstance(raised.value.__cause__, ValidationError)
    with pytest.raises(ValidationError, match="`data` is empty"):
        UserBlock(text="look", attachments=({"data": b""},))  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="Extra inputs"):
        TypeAdapter(ContentPart).validate_json('{"kind": "image", "url": "x", "size": 3}')


@pytest.mark.parametrize("session_id", ["", "has space", "x" * 129, "../etc", "-leading"])
async def test_session_id_with_unknown_format(
    runtime_factory: RuntimeFactory, session_id: str
) -> None:
    runtime = runtime_factory(Agent(model=ScriptedModel([])))
    with pytest.raises(InvalidSessionIdError, match="unknown format") as info:
        await collect_events(runtime.execute_message(session_id, "hello"))
    assert info.value.code == "invalid-session-id"


async def test_oversized_content(runtime_factory: RuntimeFactory, database_url: str) -> None:
    runtime = runtime_factory(
        Agent(model=ScriptedModel([])),
        config=RuntimeConfig(database_url=database_url, max_content_chars=10),
    )
    with pytest.raises(ContentTooLargeError, match="limit is 10"):
        await collect_events(runtime.execute_message("s1", "x" * 11))
    await _nothing_written(runtime_factory, "s1")


def test_agent_with_two_tools_of_one_name() -> None:
    twin = tool(name="add")(lambda a: a)  # type: ignore[arg-type]
    with pytest.raises(DuplicateToolError, match="two tools are named 'add'"):
        Agent(model=ScriptedModel([]), tools=[add, twin])


class _NoSchema:
    """A plain class: pydantic has no schema for it."""


def _takes_a_plain_class(thing: _NoSchema) -> str:
    return "x"


def _takes_a_callback(callback: Callable[[int], int]) -> str:
    return "x"


@pytest.mark.parametrize("fn", [_takes_a_plain_class, _takes_a_callback])
def test_a_tool_parameter_type_with_no_schema_is_a_configuration_error(
    fn: Callable[..., str],
) -> None:
    with pytest.raises(ConfigurationError, match="has a parameter whose type has no JSON schema"):
        tool(fn)


def test_a_tool_decorated_on_a_method_is_refused_and_a_bound_method_works() -> None:
    with pytest.raises(ConfigurationError, match=r"takes `self`.*tool\(instance\.lookup\)"):

        class Service:
            @tool
            async def lookup(self, city: str) -> str:
                return city

    class Plain:
        async def lookup(self, city: str) -> str:
            return city

    bound = tool(Plain().lookup)
    assert bound.spec().parameters["required"] == ["city"]


@pytest.mark.parametrize(
    ("name", "flags"),
    [
        ("read_tool_result", {}),
        ("ask_user", {"clarifications": True}),
        ("write_file", {"planning": True}),
    ],
)
def test_a_tool_named_like_a_built_in_the_agent_is_offered_is_refused(
    name: str, flags: dict[str, bool]
) -> None:
    mine = tool(name=name)(lambda text: text)  # type: ignore[arg-type]
    with pytest.raises(DuplicateToolError, match=f"the tool '{name}' has the name of a built-in"):
        Agent(model=ScriptedModel([]), tools=[mine], **flags)  # type: ignore[arg-type]
    # Without the feature that offers the built-in, the name is the app's to use.
    if flags:
        assert Agent(model=ScriptedModel([]), tools=[mine]).registry().names == (name,)


async def test_an_unknown_effort_is_invalid_input(runtime_factory: RuntimeFactory) -> None:
    runtime = runtime_factory(Agent(model=ScriptedModel([])))
    with pytest.raises(InvalidInputError, match="effort 'extreme' is not one of"):
        await collect_events(runtime.execute_message("s1", "x", effort="extreme"))  # type: ignore[arg-type]
    await _nothing_written(runtime_factory, "s1")


def test_a_misspelt_approval_policy_is_refused_where_it_is_given() -> None:
    with pytest.raises(ConfigurationError, match="approval policy 'Always' of the tool 'f'"):
        tool(name="f", approval="Always")(lambda x: x)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="approval policy 'alway' of the agent"):
        Agent(model=ScriptedModel([]), approval="alway")  # type: ignore[arg-type]


def test_model_string_litellm_cannot_resolve(database_url: str) -> None:
    from turnkit import SessionRuntime

    with pytest.raises(UnknownModelError, match="no-such-provider-model-xyz"):
        SessionRuntime(
            agent=Agent(model="no-such-provider-model-xyz"),
            config=RuntimeConfig(database_url=database_url),
        )


async def test_per_message_agent_with_unknown_model_writes_nothing(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime = runtime_factory(Agent(model=ScriptedModel([])))
    with pytest.raises(UnknownModelError):
        await collect_events(
            runtime.execute_message("s1", "hi", agent=Agent(model="no-such-provider-model-xyz"))
        )
    await _nothing_written(runtime_factory, "s1")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"idle_window_s": 10, "ceiling_s": 5}, "cannot exceed"),
        ({"ceiling_s": 600, "credential_lifetime_s": 600}, "must exceed the ceiling"),
        ({"max_content_chars": 0}, "at least 1"),
        ({"recovery_concurrency": 0}, "recovery_concurrency must be at least 1"),
        ({"budget_reserve_tokens": -5}, "cannot be negative"),
        ({"lease_ttl_s": float("inf")}, "lease_ttl_s must be a positive number"),
        ({"lease_ttl_s": 1e300}, "at most a year"),
        ({"idle_window_s": float("nan")}, "idle_window_s must be a positive number"),
        ({"max_attempts": 0}, "^max_attempts must be at least 1"),
        ({"database_url": ""}, "^database_url is a sqlite:///… or postgresql://… URL, not ''"),
        ({"database_url": 123}, "^database_url is a sqlite:///… or postgresql://… URL, not 123"),
        ({"database_schema": ""}, "^database schema '' is not a plain PostgreSQL name"),
        ({"database_schema": 5}, "^database_schema is a schema name or None, not 5"),
        (
            {"database_url": "postgresql://127.0.0.1/test", "database_schema": "Team-A"},
            "^database schema 'Team-A' is not a plain PostgreSQL name",
        ),
        ({"database_schema": "tk"}, "^database_schema 'tk' applies to PostgreSQL only"),
    ],
)
def test_bad_configuration(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        RuntimeConfig(**kwargs)  # type: ignore[arg-type]


BAD_DATABASE_URLS = [
    ("mysql://x", "turnkit supports SQLite and PostgreSQL, not 'mysql://x': write sqlite:///"),
    ("turnkit.db", "'turnkit.db' is a file path, not a URL: write sqlite:///turnkit.db for"),
    ("/var/lib/t.db", "'/var/lib/t.db' is a file path, not a URL: write sqlite:////var/lib/t.db"),
    ("sqlite:/x.db", "'sqlite:/x.db' is not a database URL: write sqlite:///path/to/file.db"),
    ("sqlite://x.db", "'sqlite://x.db' names a host, which SQLite has none of"),  # in memory
    ("sqlite://data/t.db", "write sqlite:///data/t.db (three slashes"),
    ("sqlite:///", "'sqlite:///' names no file"),
    ("SQLITE:///x.db", "write its scheme in lowercase (sqlite:)"),
    ("postgresql://app:S3cret@db:5x/turnkit", "'postgresql://***@db:5x/turnkit' is not a"),
    ("mysql://app:S3cret@db/turnkit", "not 'mysql://app:***@db/turnkit'"),
]


@pytest.mark.parametrize(("url", "says"), BAD_DATABASE_URLS)
def test_a_database_url_turnkit_cannot_open_is_refused_when_built(url: str, says: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        RuntimeConfig(database_url=url)
    message = str(caught.value)
    assert message.startswith("database_url: ")
    assert says in message
    assert "\n" not in message
    assert "S3cret" not in message


@pytest.mark.parametrize(("url", "says"), BAD_DATABASE_URLS)
async def test_a_store_built_on_such_a_url_refuses_it_too(url: str, says: str) -> None:
    from turnkit.store.sql import SqlStore

    with pytest.raises(StoreError) as caught:
        SqlStore.from_url(url)
    assert says in str(caught.value)
    assert "S3cret" not in str(caught.value)


def test_a_bad_database_url_in_the_environment_is_refused_when_read() -> None:
    from turnkit.quickstart import runtime_from_env

    with pytest.raises(ConfigurationError, match="write sqlite:///turnkit.db for a SQLite file"):
        runtime_from_env({"TURNKIT_DATABASE_URL": "turnkit.db"})


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://",
        "sqlite:///:memory:",
        "sqlite:///data/turnkit.db",
        "sqlite:////var/lib/turnkit.db",
        "sqlite+pysqlite:///turnkit.db",
        "postgresql://",
        "postgres://app@db/turnkit",
        "postgresql+asyncpg://app:pw@db:5432/turnkit?sslmode=require",
    ],
)
def test_database_urls_turnkit_opens_are_taken(url: str) -> None:
    assert RuntimeConfig(database_url=url).database_url == url


def test_agent_cannot_skip_synthesize() -> None:
    with pytest.raises(ConfigurationError, match="synthesize and post-turn always run"):
        Agent(model=ScriptedModel([]), skip_stages=frozenset({"synthesize"}))  # type: ignore[arg-type]


def test_errors_pickle_and_carry_codes() -> None:
    import pickle

    err = InvalidSessionIdError("bad id", session_id="a b")
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is InvalidSessionIdError
    assert again.details == {"session_id": "a b"}
    assert "invalid-session-id" in str(again)
    for error in (
        ModelCredentialsError("no key", model="openai/x", variable="OPENAI_API_KEY"),
        ModelUnreachableError("refused", model="openai/x", address="http://127.0.0.1:9"),
    ):
        back = pickle.loads(pickle.dumps(error))
        assert (type(back), back.details, str(back)) == (type(error), error.details, str(error))


def _plain(a: int) -> int:
    return a


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Agent(model=ScriptedModel([]), tools=[_plain]), "'_plain', not a tool: decorate"),
        (lambda: Agent(model=ScriptedModel([]), tools=add), "list of tools .*not FunctionTool"),
        (lambda: Agent(model=123), "`model` is a model string .*not int"),
        (lambda: ModelFamily("f", ["openai/a"]), "rung 0 .*LiteLLMClient\\('openai/a'\\)"),
        (lambda: SessionRuntime(agent="openai/x"), "`agent` is a turnkit.Agent, not str"),
        (
            lambda: SessionRuntime(agent=Agent(model=ScriptedModel([])), config={"a": 1}),
            "`config` is a turnkit.RuntimeConfig, not dict",
        ),
    ],
    ids=["plain-function", "one-tool", "model-int", "family-strings", "agent-str", "config-dict"],
)
def test_a_wrong_type_at_construction_is_a_configuration_error(
    build: Callable[[], object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        build()


async def test_a_closed_runtime_refuses_work_until_it_is_opened_again(tmp_path: object) -> None:
    model = ScriptedModel([ModelStep.text_reply("One."), ModelStep.text_reply("Two.")])
    runtime = SessionRuntime(
        agent=Agent(model=model),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path}/closed.db"),
    )
    await collect_events(runtime.execute_message("s1", "hi"))  # opens on first use
    await runtime.close()
    closed = "the runtime is closed"
    with pytest.raises(RuntimeClosedError, match=closed):
        await collect_events(runtime.execute_message("s1", "again"))
    with pytest.raises(RuntimeClosedError, match=closed):
        await runtime.submit("s1", "again")
    with pytest.raises(RuntimeClosedError, match=closed):
        await runtime.history("s1")
    assert len(model.calls) == 1  # nothing ran, nothing reopened
    async with runtime:  # opened again on purpose
        events = await collect_events(runtime.execute_message("s1", "again"))
        assert events[-1].type == "done"
        assert len(await runtime.history("s1")) == 2
    never_opened = SessionRuntime(
        agent=Agent(model=ScriptedModel([ModelStep.text_reply("Later.")])),
        config=RuntimeConfig(database_url=f"sqlite:///{tmp_path}/lazy.db"),
    )
    await never_opened.close()  # (a lifespan that only closes): it still opens on first use
    assert (await collect_events(never_opened.execute_message("s1", "hi")))[-1].type == "done"
    await never_opened.close()


async def test_a_resolution_that_is_not_one_is_invalid_input(
    runtime_factory: RuntimeFactory,
) -> None:
    model = ScriptedModel([ModelStep.tool_call_reply(call("add", a=1, b=2))])
    runtime = runtime_factory(Agent(model=model, tools=[add], approval="always"))
    events = await collect_events(runtime.execute_message("s1", "add them"))
    [asked] = [e for e in events if e.type == "approval.requested"]
    with pytest.raises(InvalidInputError, match=r"Approve\(\), Deny\(note=...\) or Answer"):
        await runtime.resume(asked.turn_id, asked.request_id, "approve")  # type: ignore[arg-type]
    assert (await runtime.turn(asked.turn_id)).status == "awaiting_approval"


async def test_reads_of_a_session_or_turn_that_is_not_there_say_so(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime = runtime_factory(Agent(model=ScriptedModel([ModelStep.text_reply("Hi.")])))
    await collect_events(runtime.execute_message("s1", "hi"))
    for read in (runtime.pending, runtime.queue, runtime.view, runtime.history):
        with pytest.raises(SessionNotFoundError, match="no session 'nope'"):
            await read("nope")
    assert await runtime.pending("s1") == []  # there, with nothing waiting
    [turn] = await runtime.store.list_turns("s1")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="after_seq is 0 or more, not -1"):
        [e async for e in runtime.events(turn.turn_id, after_seq=-1)]
