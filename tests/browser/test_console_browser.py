"""The console in a real Chromium (Debian's, driven by Playwright; no browser is downloaded):
add a provider against the fake provider, discover its models, put one in Cursor's picker, run
a simulated Cursor turn on it, watch the call arrive live with its usage, open its detail.
Screenshots go to test-artifacts/console/ (gitignored)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio

from byok.config_load import load_config
from byok.console.token import new_token
from byok.daemon import run_daemon
from byok.devtools.cursor_sim import CursorSim, user_turn
from tests.support.fake_provider import FakeProvider, chat_text_script

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "console"
BROWSER_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
KEY = "sk-browser-test-key-7d2f"
TIMEOUT_MS = 15_000

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the test extras (make test)")
if not CHROMIUM.exists():
    pytest.skip("Debian's chromium is missing: `make test` installs it", allow_module_level=True)


@attrs.define
class Served:
    base_url: str
    provider_url: str
    provider: FakeProvider
    data_dir: Path
    token: trio.lowlevel.TrioToken

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run an async function in the daemon's trio thread and wait for it."""
        return trio.from_thread.run(fn, *args, trio_token=self.token)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    """A daemon with no models of its own and a fake provider, in a trio thread of their own
    (Playwright's sync API owns this one)."""
    data_dir = tmp_path / "data"
    config_path = tmp_path / "byok.toml"
    config_path.write_text(
        f'[server]\nhost = "127.0.0.1"\nport = 0\ndata_dir = "{data_dir}"\nupstream = "http://127.0.0.1:9"\n'
    )
    config = load_config(config_path)
    ready: queue.Queue[Served | BaseException] = queue.Queue()
    stop = threading.Event()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            provider = FakeProvider()
            provider_url = await provider.start(nursery)
            base_url, shutdown = await nursery.start(run_daemon, config)
            ready.put(Served(base_url, provider_url, provider, data_dir, trio.lowlevel.current_trio_token()))
            while not stop.is_set():
                await trio.sleep(0.05)
            shutdown()
            nursery.cancel_scope.cancel()

    def thread() -> None:
        try:
            trio.run(main)
        except BaseException as e:  # surfaced to the test below
            ready.put(e)

    worker = threading.Thread(target=thread, daemon=True)
    worker.start()
    got = ready.get(timeout=60)
    if isinstance(got, BaseException):
        raise got
    try:
        yield got
    finally:
        stop.set()
        worker.join(timeout=30)


async def _simulated_turn(base_url: str, model_id: str) -> str:
    async with httpx.AsyncClient(timeout=30) as client:
        tr = await CursorSim(base_url, client).run(
            "req-browser-1",
            user_turn("hello", conversation_id="conv-browser", model_id=model_id, message_id="m1"),
        )
    assert tr.end_stream == {}, tr.end_stream
    return tr.text()


def test_provider_to_live_call_in_chromium(served: Served) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    served.provider.models = [{"id": "fake-large", "context_window": 64000}, {"id": "fake-small"}]
    token = new_token(served.data_dir)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=BROWSER_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(TIMEOUT_MS)
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{served.base_url}/byok/#token={token}")
            assert "token=" not in page.url  # taken from the fragment, then cleared

            form = page.locator("#add-provider")
            form.locator("input[name=id]").fill("fakeprov")
            form.locator("select[name=kind]").select_option("openai_chat")
            form.locator("input[name=base_url]").fill(served.provider_url)
            form.locator("input[name=api_key]").fill(KEY)
            form.locator("button[type=submit]").click()
            row = page.locator("#providers tr[data-provider=fakeprov]")
            row.wait_for()
            assert "…7d2f" in row.inner_text() and KEY not in page.content()

            row.locator("button.discover").click()
            found = page.locator("#discovered tr[data-model=fake-large]")
            found.wait_for()
            assert "64,000" in found.inner_text()
            found.locator("button.enable").click()
            page.locator("#models tr[data-model=fake-large]").wait_for()
            page.screenshot(path=str(ARTIFACTS / "1-providers-and-models.png"), full_page=True)

            page.click("nav a[href='#/calls']")
            expect = sync_api.expect
            expect(page.locator("#live-state")).to_have_text("live", timeout=TIMEOUT_MS)
            served.provider.enqueue(chat_text_script(["Hello", " from the console"], usage=(321, 12)))
            assert served.call(_simulated_turn, served.base_url, "fake-large") == "Hello from the console"

            call_row = page.locator("#calls tbody tr").first
            page.wait_for_function(
                "document.querySelector('#calls tbody tr .usage-input')?.textContent === '321'"
            )
            assert "fake-large" in call_row.inner_text() and "fakeprov" in call_row.inner_text()
            assert call_row.locator(".usage-output").inner_text() == "12"
            page.screenshot(path=str(ARTIFACTS / "2-live-call.png"), full_page=True)

            call_row.click()
            detail = page.locator("#call-detail")
            detail.wait_for()
            text = detail.inner_text()
            assert "req-browser-1" in text and "conv-browser" in text and "321" in text
            page.screenshot(path=str(ARTIFACTS / "3-call-detail.png"), full_page=True)

            for name in ("usage", "conversations", "aliases", "connect"):
                page.click(f"nav a[href='#/{name}']")
                page.wait_for_selector("main h2")
                page.wait_for_load_state("networkidle")
                page.screenshot(path=str(ARTIFACTS / f"4-{name}.png"), full_page=True)
            assert "--test-backend-url=" in page.locator("#cursor-command").inner_text()
            assert errors == []
        finally:
            browser.close()
