"""The console's entries as values, and the checks a request body goes through to become one.

Sans-IO. Every problem is a ``FieldError`` naming the field (``headers.x-key``,
``targets[1]``), which the control API answers as a 400 with that name. Keys and header values
travel in ``ProviderSecrets`` (kept out of reprs), never in the entries' public fields.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final

import attrs

from byok.config import PROVIDER_KINDS
from byok.config_reader import Table, check_url, pick
from byok.config_requests import provider_headers

ID_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,99}")
ID_RULE: Final = "1-100 characters: letters, digits and . _ : - (not starting with a symbol)"
EFFORTS: Final = ("low", "medium", "high")
DEFAULT_FIRST_TOKEN_TIMEOUT_S: Final = 30.0
DEFAULT_COOLDOWN_S: Final = 60.0
MAX_TARGETS: Final = 8


class FieldError(Exception):
    """One bad field of a request: what it is called and what is wrong with it."""

    def __init__(self, field: str, problem: str, status: int = 400) -> None:
        self.field = field
        self.problem = " ".join(problem.split())
        self.status = status
        super().__init__(f"{field}: {self.problem}" if field else self.problem)


def _error(source: str, key: str, problem: str) -> FieldError:
    return FieldError(key, problem)


def check_id(value: object, field: str = "id") -> str:
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise FieldError(field, f"expected an id of {ID_RULE}, got {value!r}"[:300])
    return value


@attrs.frozen
class ProviderSecrets:
    api_key: str | None = attrs.field(default=None, repr=False)
    headers: tuple[tuple[str, str], ...] = attrs.field(default=(), repr=False)

    def to_json(self) -> str:
        return json.dumps({"api_key": self.api_key, "headers": [list(h) for h in self.headers]})

    @classmethod
    def from_json(cls, text: str) -> ProviderSecrets:
        obj = json.loads(text)
        return cls(obj.get("api_key"), tuple((n, v) for n, v in obj.get("headers", ())))


@attrs.frozen
class ProviderEntry:
    id: str
    kind: str
    base_url: str
    enabled: bool = True
    # What the API may show of the secrets: the key's last four characters, the header names.
    key_last4: str | None = None
    header_names: tuple[str, ...] = ()


@attrs.frozen
class ModelEntry:
    id: str
    provider: str
    upstream_model: str
    context_tokens: int
    display_name: str | None = None
    max_output_tokens: int | None = None
    thinking: bool = False
    effort: str | None = None
    vision: bool = True
    enabled: bool = True
    position: int = 0
    extra_body: tuple[tuple[str, Any], ...] = attrs.field(default=(), hash=False)


@attrs.frozen
class AliasEntry:
    id: str
    targets: tuple[str, ...]
    display_name: str | None = None
    first_token_timeout_s: float = DEFAULT_FIRST_TOKEN_TIMEOUT_S
    cooldown_s: float = DEFAULT_COOLDOWN_S
    enabled: bool = True
    position: int = 0


Entry = ProviderEntry | ModelEntry | AliasEntry


# --- storage form --------------------------------------------------------------------------


def entry_data(entry: Entry) -> str:
    """The entry's public fields as stored (``console_entries.data``)."""
    fields = attrs.asdict(entry, recurse=False)
    fields.pop("id")
    if isinstance(entry, ModelEntry):
        fields["extra_body"] = dict(entry.extra_body)
    return json.dumps(fields, separators=(",", ":"))


def entry_from_data(kind: str, entry_id: str, data: str) -> Entry:
    fields = json.loads(data)
    if kind == "provider":
        fields["header_names"] = tuple(fields.get("header_names", ()))
        return ProviderEntry(id=entry_id, **fields)
    if kind == "model":
        fields["extra_body"] = tuple(fields.get("extra_body", {}).items())
        return ModelEntry(id=entry_id, **fields)
    fields["targets"] = tuple(fields["targets"])
    return AliasEntry(id=entry_id, **fields)


# --- request bodies ------------------------------------------------------------------------

_PROVIDER_FIELDS = ("id", "kind", "base_url", "api_key", "headers", "enabled")
_MODEL_FIELDS = (
    "id",
    "provider",
    "upstream_model",
    "context_tokens",
    "display_name",
    "max_output_tokens",
    "thinking",
    "effort",
    "vision",
    "enabled",
    "position",
    "extra_body",
)
_ALIAS_FIELDS = (
    "id",
    "targets",
    "display_name",
    "first_token_timeout_s",
    "cooldown_s",
    "enabled",
    "position",
)


def _table(body: object) -> Table:
    if not isinstance(body, dict):
        raise FieldError("", "the request body must be a JSON object")
    return Table("body", "", body, _error)


def _id_of(t: Table, path_id: str | None) -> str:
    given = t.data.get("id")
    if path_id is not None:
        if given is not None and given != path_id:
            raise FieldError("id", f"an entry's id cannot change (it is {path_id!r})")
        return path_id
    if given is None:
        raise FieldError("id", "missing required field")
    return check_id(given)


def _nullable(t: Table, key: str, read: Any, current: Any) -> Any:
    """A field the body may set, clear (null) or leave out (keeps ``current``)."""
    if key not in t.data:
        return current
    if t.data[key] is None:
        return None
    return read(key)


def parse_provider(
    body: object,
    current: ProviderEntry | None = None,
    secrets: ProviderSecrets | None = None,
    *,
    path_id: str | None = None,
) -> tuple[ProviderEntry, ProviderSecrets]:
    """A provider from a create (``current`` None) or update body; what the body leaves out
    keeps its current value. ``api_key``: a string sets it, null removes it."""
    t = _table(body)
    t.check_keys(_PROVIDER_FIELDS)
    pid = _id_of(t, path_id)
    kind = pick(t.string("kind", required=current is None), current.kind if current else "")
    if kind not in PROVIDER_KINDS:
        raise FieldError("kind", f"unknown kind {kind!r} (expected one of: {', '.join(PROVIDER_KINDS)})")
    url = t.string("base_url", required=current is None)
    base_url = check_url(t, "base_url", url) if url is not None else (current.base_url if current else "")
    secrets = secrets or ProviderSecrets()
    api_key = _nullable(t, "api_key", t.string, secrets.api_key)
    if api_key is not None and any(c.isspace() for c in api_key):
        raise FieldError("api_key", "a key holds no spaces or line breaks (pasted with extra text?)")
    headers = secrets.headers
    if "headers" in t.data:
        headers = provider_headers(t, api_key is not None) if t.data["headers"] is not None else ()
    elif api_key is not None and any(n in ("authorization", "x-api-key") for n, _ in headers):
        raise FieldError("api_key", "a header already sends a key (authorization / x-api-key)")
    enabled = pick(t.boolean("enabled"), current.enabled if current else True)
    entry = ProviderEntry(
        id=pid,
        kind=kind,
        base_url=base_url,
        enabled=enabled,
        key_last4=api_key[-4:] if api_key else None,
        header_names=tuple(n for n, _ in headers),
    )
    return entry, ProviderSecrets(api_key, headers)


def parse_model(body: object, current: ModelEntry | None = None, *, path_id: str | None = None) -> ModelEntry:
    t = _table(body)
    t.check_keys(_MODEL_FIELDS)
    mid = _id_of(t, path_id)
    new = current is None
    provider = t.string("provider", required=new)
    if provider is not None:
        check_id(provider, "provider")
    effort = _nullable(t, "effort", t.string, current.effort if current else None)
    if effort is not None and effort not in EFFORTS:
        raise FieldError("effort", f"expected one of: {', '.join(EFFORTS)} (or null), got {effort!r}")
    extra = current.extra_body if current else ()
    if "extra_body" in t.data:
        extra = tuple(t.json_table("extra_body").items()) if t.data["extra_body"] is not None else ()
    old: Mapping[str, Any] = attrs.asdict(current, recurse=False) if current else {}
    return ModelEntry(
        id=mid,
        provider=pick(provider, old.get("provider", "")),
        upstream_model=pick(t.string("upstream_model", required=new), old.get("upstream_model", "")),
        context_tokens=pick(t.integer("context_tokens", required=new), old.get("context_tokens", 0)),
        display_name=_nullable(t, "display_name", t.string, old.get("display_name")),
        max_output_tokens=_nullable(t, "max_output_tokens", t.integer, old.get("max_output_tokens")),
        thinking=pick(t.boolean("thinking"), old.get("thinking", False)),
        effort=effort,
        vision=pick(t.boolean("vision"), old.get("vision", True)),
        enabled=pick(t.boolean("enabled"), old.get("enabled", True)),
        position=pick(t.integer("position", minimum=0), old.get("position", 0)),
        extra_body=extra,
    )


def parse_alias(body: object, current: AliasEntry | None = None, *, path_id: str | None = None) -> AliasEntry:
    t = _table(body)
    t.check_keys(_ALIAS_FIELDS)
    aid = _id_of(t, path_id)
    targets = t.strings("targets")
    if targets is None and current is None:
        raise FieldError("targets", "missing required field")
    if targets is not None:
        if not targets:
            raise FieldError("targets", "an alias needs at least one target model")
        if len(targets) > MAX_TARGETS:
            raise FieldError("targets", f"at most {MAX_TARGETS} targets")
        for i, target in enumerate(targets):
            check_id(target, f"targets[{i}]")
            if target in targets[:i]:
                raise FieldError(f"targets[{i}]", f"{target!r} is listed twice")
    old: Mapping[str, Any] = attrs.asdict(current, recurse=False) if current else {}
    return AliasEntry(
        id=aid,
        targets=tuple(targets) if targets is not None else old["targets"],
        display_name=_nullable(t, "display_name", t.string, old.get("display_name")),
        first_token_timeout_s=pick(
            t.number("first_token_timeout_s"), old.get("first_token_timeout_s", DEFAULT_FIRST_TOKEN_TIMEOUT_S)
        ),
        cooldown_s=pick(t.number("cooldown_s"), old.get("cooldown_s", DEFAULT_COOLDOWN_S)),
        enabled=pick(t.boolean("enabled"), old.get("enabled", True)),
        position=pick(t.integer("position", minimum=0), old.get("position", 0)),
    )
