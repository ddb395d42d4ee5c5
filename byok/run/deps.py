"""What every run shares: the config, the store, prompts and tools, the provider HTTP client,
the call log, the activity counter and the catalog of models (the daemon makes one of each)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import attrs
import httpx

from byok.config import Config
from byok.console.catalog import Catalog
from byok.cursor.prompting import ModeAssets
from byok.cursor.tools.base import ToolDef
from byok.model.request import ToolSpec
from byok.run.call_log import CallLog
from byok.run.failover import Cooldowns
from byok.run.stored_render import StoredRenders
from byok.run.upkeep import RunActivity
from byok.store import AsyncStore


@attrs.frozen
class ToolSetup:
    registry: Mapping[str, ToolDef]
    specs_by_mode: Mapping[str, tuple[ToolSpec, ...]]
    backends: frozenset[str] = frozenset()  # server-side tool backends configured ("search", "images")


def tool_setup(
    registry: Mapping[str, ToolDef],
    specs_by_mode: Mapping[str, tuple[ToolSpec, ...]],
    backends: frozenset[str],
) -> ToolSetup:
    """The tools each mode offers: its manifest, less the tools whose backend is not configured
    (clarification 14: never offered, so never called with a made-up result)."""

    def usable(spec: ToolSpec) -> bool:
        tool = registry.get(spec.name)
        return tool is None or tool.backend is None or tool.backend in backends

    offered = {mode: tuple(s for s in specs if usable(s)) for mode, specs in specs_by_mode.items()}
    return ToolSetup(registry, offered, backends)


@attrs.frozen
class RunDeps:
    config: Config
    store: AsyncStore
    prompts: dict[str, ModeAssets]
    tools: ToolSetup
    http: httpx.AsyncClient
    call_log: CallLog
    wall_ms: Callable[[], int] = attrs.field(default=lambda: int(time.time() * 1000))
    activity: RunActivity = attrs.Factory(RunActivity)
    renders: StoredRenders = attrs.Factory(StoredRenders)  # saved at the caches' release, shutdown
    # The providers and models runs use: the config file's and the console's (console/catalog.py).
    catalog: Catalog = attrs.Factory(lambda self: Catalog(self.config), takes_self=True)
    # Which alias targets failed lately (run/failover.py), shared by every run.
    cooldowns: Cooldowns = attrs.Factory(Cooldowns)
