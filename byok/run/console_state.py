"""The console's entries as the daemon keeps them: read from SQLite at start, written through
here, and handed to the catalog after every write, so the next run sees them.

What may change is decided here, against the whole catalog: ids are unique across the config
file's and the console's entries (models and aliases share the namespace Cursor sees), a model
names a provider that exists, an alias targets models, and nothing is deleted from under what
uses it. Entries from the config file are read-only. A refusal is a ``FieldError`` naming the
field (409 when the request is well formed but the catalog refuses it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs
import trio

from byok.config import Config
from byok.console.catalog import Catalog, ConsoleEntries, model_config
from byok.console.entries import (
    AliasEntry,
    Entry,
    FieldError,
    ModelEntry,
    ProviderEntry,
    ProviderSecrets,
    entry_data,
    entry_from_data,
    parse_alias,
    parse_model,
    parse_provider,
)
from byok.console.secret_box import SecretBox, SecretBoxError
from byok.store import AsyncStore, SQLiteStore
from byok.store import console_tables as tables

log = logging.getLogger("byok.console")

CONFLICT = 409


def _conflict(field: str, problem: str) -> FieldError:
    return FieldError(field, problem, CONFLICT)


def _not_found(kind: str, entry_id: str) -> FieldError:
    return FieldError("id", f"no {kind} {entry_id!r}", 404)


class ConsoleState:
    def __init__(
        self, store: AsyncStore, box: SecretBox, catalog: Catalog, wall_ms: Callable[[], int]
    ) -> None:
        self.store = store
        self.box = box
        self.catalog = catalog
        self._wall_ms = wall_ms
        # Providers whose stored key does not open (another key file): listed, not served.
        self.unreadable: set[str] = set()
        # One change at a time: each is checked against the catalog its write then replaces.
        self._lock = trio.Lock()

    @classmethod
    async def open(
        cls, store: AsyncStore, box: SecretBox, config: Config, wall_ms: Callable[[], int]
    ) -> ConsoleState:
        state = cls(store, box, Catalog(config), wall_ms)
        await state.reload()
        return state

    async def reload(self) -> None:
        rows = await self.store.call(SQLiteStore.transact, tables.entries)
        providers, models, aliases = [], [], []
        self.unreadable = set()
        for row in rows:
            entry = entry_from_data(row.kind, row.id, row.data)
            if isinstance(entry, ProviderEntry):
                try:
                    secrets = self._open(row.id, row.sealed)
                except SecretBoxError as e:
                    log.warning("%s", e)
                    self.unreadable.add(row.id)
                    entry, secrets = _disabled(entry), ProviderSecrets()
                providers.append((entry, secrets))
            elif isinstance(entry, ModelEntry):
                models.append(entry)
            else:
                aliases.append(entry)
        self.catalog.use_console(ConsoleEntries(tuple(providers), tuple(models), tuple(aliases)))

    def _open(self, provider_id: str, sealed: bytes | None) -> ProviderSecrets:
        if sealed is None:
            return ProviderSecrets()
        return ProviderSecrets.from_json(self.box.open(sealed, f"provider:{provider_id}"))

    # --- lookups -------------------------------------------------------------------------------
    def provider_entry(self, pid: str) -> tuple[ProviderEntry, ProviderSecrets] | None:
        return next(((e, s) for e, s in self.catalog.console.providers if e.id == pid), None)

    def model_entry(self, mid: str) -> ModelEntry | None:
        return next((m for m in self.catalog.console.models if m.id == mid), None)

    def alias_entry(self, aid: str) -> AliasEntry | None:
        return next((a for a in self.catalog.console.aliases if a.id == aid), None)

    def _read_only(self, kind: str, entry_id: str) -> None:
        file = self.catalog.file
        found = file.provider(entry_id) if kind == "provider" else file.model(entry_id)
        if found is not None:
            raise _conflict(
                "id", f"{kind} {entry_id!r} comes from the config file {file.source}: edit it there"
            )

    # --- changes, one at a time -------------------------------------------------------------------
    async def put_provider(self, body: object, path_id: str | None = None) -> ProviderEntry:
        async with self._lock:
            return await self._put_provider(body, path_id)

    async def delete_provider(self, pid: str) -> None:
        async with self._lock:
            await self._delete_provider(pid)

    async def put_model(self, body: object, path_id: str | None = None) -> ModelEntry:
        async with self._lock:
            return await self._put_model(body, path_id)

    async def delete_model(self, mid: str) -> None:
        async with self._lock:
            await self._delete_model(mid)

    async def put_alias(self, body: object, path_id: str | None = None) -> AliasEntry:
        async with self._lock:
            return await self._put_alias(body, path_id)

    async def delete_alias(self, aid: str) -> None:
        async with self._lock:
            await self._delete_alias(aid)

    # --- providers ------------------------------------------------------------------------------
    async def _put_provider(self, body: object, path_id: str | None = None) -> ProviderEntry:
        current = self.provider_entry(path_id) if path_id is not None else None
        if path_id is not None:
            self._read_only("provider", path_id)
            if current is None:
                raise _not_found("provider", path_id)
        entry, secrets = parse_provider(body, *(current or (None, None)), path_id=path_id)
        if current is None:
            self._read_only("provider", entry.id)
            if self.provider_entry(entry.id) is not None:
                raise _conflict("id", f"provider {entry.id!r} exists already")
        for model in self.catalog.console.models:
            if model.provider == entry.id:
                model_config(model, entry.kind)  # a kind change must still fit its models
        sealed = None
        if secrets.api_key is not None or secrets.headers:
            sealed = self.box.seal(secrets.to_json(), f"provider:{entry.id}")
        await self._write("provider", entry, sealed)
        return entry

    async def _delete_provider(self, pid: str) -> None:
        self._read_only("provider", pid)
        if self.provider_entry(pid) is None:
            raise _not_found("provider", pid)
        users = [m.id for m in self.catalog.console.models if m.provider == pid]
        if users:
            raise _conflict("id", f"provider {pid!r} serves model(s) {', '.join(users)}: delete them first")
        await self._delete("provider", pid)

    # --- models ---------------------------------------------------------------------------------
    async def _put_model(self, body: object, path_id: str | None = None) -> ModelEntry:
        current = self.model_entry(path_id) if path_id is not None else None
        if path_id is not None:
            self._read_only("model", path_id)
            if current is None:
                raise _not_found("model", path_id)
        entry = parse_model(body, current, path_id=path_id)
        if current is None:
            self._read_only("model", entry.id)
            if self.model_entry(entry.id) is not None or self.alias_entry(entry.id) is not None:
                raise _conflict("id", f"model id {entry.id!r} is taken")
        kind = self._provider_kind(entry.provider)
        if kind is None:
            raise FieldError("provider", f"no provider {entry.provider!r}")
        model_config(entry, kind)
        await self._write("model", entry, None)
        return entry

    def _provider_kind(self, pid: str) -> str | None:
        file = self.catalog.file.provider(pid)
        if file is not None:
            return file.kind
        found = self.provider_entry(pid)
        return found[0].kind if found is not None else None

    async def _delete_model(self, mid: str) -> None:
        self._read_only("model", mid)
        if self.model_entry(mid) is None:
            raise _not_found("model", mid)
        users = [a.id for a in self.catalog.console.aliases if mid in a.targets]
        if users:
            raise _conflict("id", f"model {mid!r} is a target of alias(es) {', '.join(users)}")
        await self._delete("model", mid)

    # --- aliases --------------------------------------------------------------------------------
    async def _put_alias(self, body: object, path_id: str | None = None) -> AliasEntry:
        current = self.alias_entry(path_id) if path_id is not None else None
        if path_id is not None and current is None:
            raise _not_found("alias", path_id)
        entry = parse_alias(body, current, path_id=path_id)
        if current is None:
            self._read_only("model", entry.id)
            if self.model_entry(entry.id) is not None or self.alias_entry(entry.id) is not None:
                raise _conflict("id", f"model id {entry.id!r} is taken")
        for i, target in enumerate(entry.targets):
            if self.catalog.file.model(target) is None and self.model_entry(target) is None:
                raise FieldError(f"targets[{i}]", f"no model {target!r} (aliases target models only)")
        await self._write("alias", entry, None)
        return entry

    async def _delete_alias(self, aid: str) -> None:
        if self.alias_entry(aid) is None:
            raise _not_found("alias", aid)
        await self._delete("alias", aid)

    # --- writes ---------------------------------------------------------------------------------
    async def _write(self, kind: str, entry: Entry, sealed: bytes | None) -> None:
        data = entry_data(entry)
        await self.store.call(
            SQLiteStore.transact, tables.put_entry, kind, entry.id, data, sealed, self._wall_ms(), write=True
        )
        await self.reload()

    async def _delete(self, kind: str, entry_id: str) -> None:
        await self.store.call(SQLiteStore.transact, tables.delete_entry, kind, entry_id, write=True)
        await self.reload()


def _disabled(entry: ProviderEntry) -> ProviderEntry:
    return attrs.evolve(entry, enabled=False)
