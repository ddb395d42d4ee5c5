"""Per-mode prompt assets and the one runtime message each RunRequest turns into.

Every mode directory under ``prompt/modes/`` holds a static ``system.md`` and a ``runtime.md``
template. Assets are validated when loaded so a broken asset fails the daemon at start-up rather
than in the middle of a user's turn.

A user turn is projected as exactly one ``role=user, origin=runtime`` message: request context,
open files, selected context, time and the user's query all live in that single message, keyed by
``run-request:{request_id}`` so it is appended exactly once and replayed byte-for-byte afterwards.
Rendering is a single regex pass over the template: substituted values are never scanned again, so
user text that happens to contain ``{{...}}`` is inserted verbatim and never expanded.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import attrs

from byok.cursor.agent_modes import REQUIRED_MODES
from byok.model.images import ImagePart
from byok.model.messages import Message
from byok.pb.agent import v1 as agent

PLACEHOLDERS = frozenset({"REQUEST_CONTEXT", "OPEN_FILES", "SELECTED_CONTEXT", "TIMESTAMP", "USER_QUERY"})
REQUIRED_PLACEHOLDERS = ("TIMESTAMP", "USER_QUERY")
SYSTEM_FILE = "system.md"
RUNTIME_FILE = "runtime.md"

# Anything placeholder-shaped, so a typo like {{USER_QUERRY}} is caught instead of leaking through.
_ANY_PLACEHOLDER = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
# A placeholder alone on its line also owns the blank lines after it, so an empty value removes the
# whole line and its spacing; otherwise it is substituted in place.
_SUBSTITUTION = re.compile(
    r"^\{\{(?P<line>[A-Z_]+)\}\}(?P<tail>\n(?:[ \t]*\n)*|\Z)|\{\{(?P<inline>[A-Z_]+)\}\}",
    re.MULTILINE,
)
_BLANK_RUN = re.compile(r"\n(?:[ \t]*\n)+")


class PromptAssetError(Exception):
    """A prompt asset is missing or malformed; the message is one line naming the file."""


@attrs.frozen
class ModeAssets:
    mode: str
    system: str
    runtime_template: str


def default_prompt_root() -> Path:
    here = Path(__file__).resolve()
    # A wheel ships the assets inside the package as byok/_prompt; checked first because in an
    # installed tree parents[2] is site-packages, where a "prompt" directory would be someone else's.
    packaged = here.parents[1] / "_prompt"
    if packaged.is_dir():
        return packaged
    # Source checkouts and editable installs: the repository's prompt/ directory.
    return here.parents[2] / "prompt"


def load_prompt_assets(root: Path) -> dict[str, ModeAssets]:
    modes_dir = root / "modes"
    if not modes_dir.is_dir():
        raise PromptAssetError(f"{modes_dir}: prompt modes directory not found")
    assets: dict[str, ModeAssets] = {}
    for mode_dir in sorted(p for p in modes_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        system = _read_asset(mode_dir / SYSTEM_FILE)
        template = _read_asset(mode_dir / RUNTIME_FILE)
        validate_template(template, source=str(mode_dir / RUNTIME_FILE))
        assets[mode_dir.name] = ModeAssets(mode=mode_dir.name, system=system, runtime_template=template)
    for mode in REQUIRED_MODES:
        if mode not in assets:
            raise PromptAssetError(f"{modes_dir / mode}: required mode directory is missing")
    return assets


def _read_asset(path: Path) -> str:
    if not path.is_file():
        raise PromptAssetError(f"{path}: required prompt file is missing")
    text = path.read_text(encoding="utf-8").strip()
    if not text:
        raise PromptAssetError(f"{path}: prompt file is empty")
    return text


def validate_template(template: str, *, source: str = "runtime template") -> None:
    names = [m.group(1) for m in _ANY_PLACEHOLDER.finditer(template)]
    for name in names:
        if name not in PLACEHOLDERS:
            allowed = ", ".join(sorted(PLACEHOLDERS))
            raise PromptAssetError(f"{source}: unknown placeholder {{{{{name}}}}} (allowed: {allowed})")
        if names.count(name) > 1:
            # A repeated placeholder would duplicate its content (e.g. the user query) in the message.
            raise PromptAssetError(f"{source}: placeholder {{{{{name}}}}} appears more than once")
    for name in REQUIRED_PLACEHOLDERS:
        if name not in names:
            raise PromptAssetError(f"{source}: template lacks required placeholder {{{{{name}}}}}")


# ---------------------------------------------------------------------------------------------
# Rendering helpers. Each returns "" when there is nothing to say, so empty sections vanish.


def _attr(value: str) -> str:
    return value.replace("&", "&amp;").replace('"', "&quot;").replace("\n", " ")


def _block(tag: str, body: str, **attributes: str) -> str:
    head = tag + "".join(f' {k}="{_attr(v)}"' for k, v in attributes.items() if v)
    body = body.strip("\n")
    return f"<{head}>\n{body}\n</{tag}>" if body else f"<{head}/>"


def _section(tag: str, items: Iterable[str]) -> str:
    body = "\n".join(item for item in items if item)
    return f"<{tag}>\n{body}\n</{tag}>" if body else ""


def _lines(pairs: Iterable[tuple[str, str]]) -> str:
    return "\n".join(f"{label}: {value}" for label, value in pairs if value)


def _tree(node: agent.LsDirectoryTreeNode, depth: int = 0) -> list[str]:
    name = node.abs_path if depth == 0 else re.split(r"[/\\]", node.abs_path.rstrip("/\\"))[-1]
    unlisted = not node.children_were_processed and node.num_files
    hint = f" ({node.num_files} files, not listed)" if unlisted else ""
    out = [f"{'  ' * depth}{name}/{hint}"]
    for child in node.children_dirs:
        out.extend(_tree(child, depth + 1))
    out.extend(f"{'  ' * (depth + 1)}{f.name}" for f in node.children_files)
    return out


@attrs.frozen
class ContextSections:
    """The rendered blocks of ``{{REQUEST_CONTEXT}}``, in message order; "" when absent.

    Exposed separately so the token breakdown can size rules/skills/subagents/MCP from exactly the
    text the model sees.
    """

    user_info: str = ""
    git_status: str = ""
    rules: str = ""
    agent_skills: str = ""
    subagents: str = ""
    mcp_instructions: str = ""
    project_layout: str = ""

    def joined(self) -> str:
        return "\n\n".join(s for s in attrs.astuple(self) if s)


def _user_info(env: agent.RequestContextEnv | None) -> str:
    if env is None:
        return ""
    body = _lines(
        [
            ("OS", env.os_version),
            ("Shell", env.shell),
            ("Workspace paths", ", ".join(env.workspace_paths)),
            ("Working directory", env.process_working_directory or ""),
            ("Project folder", env.project_folder),
            ("Terminals folder", env.terminals_folder),
            ("Agent transcripts folder", env.agent_transcripts_folder),
            ("Shared notes folder", env.agent_shared_notes_folder),
            ("Conversation notes folder", env.agent_conversation_notes_folder),
            ("Artifacts folder", env.artifacts_folder or ""),
            ("Time zone", env.time_zone),
        ]
    )
    notes = []
    if env.is_working_dir_home_dir:
        notes.append("The working directory is the user's home directory.")
    if env.sandbox_enabled:
        notes.append("Terminal commands run inside a sandbox.")
    return _section("user_info", [body, *notes])


def _git_repo(repo: agent.GitRepoInfo) -> str:
    head = _lines(
        [("Repository", repo.path), ("Branch", repo.branch_name), ("Remote", repo.remote_url or "")]
    )
    status = repo.status.strip("\n")
    return f"{head}\nStatus:\n{status}" if status else head


def _rule(rule: agent.CursorRule) -> str:
    kind = rule.type
    applies, globs, description = "", "", ""
    if kind is not None:
        if kind.global_ is not None:
            applies = "always"
        elif kind.file_globbed is not None:
            globs = ", ".join(kind.file_globbed.globs)
        elif kind.agent_fetched is not None:
            description = kind.agent_fetched.description
        elif kind.manually_attached is not None:
            applies = "attached by the user"
    if not rule.content.strip() and not description:
        return ""
    return _block(
        "rule", rule.content, path=rule.full_path, applies=applies, globs=globs, description=description
    )


def request_context_sections(request_context: agent.RequestContext | None) -> ContextSections:
    rc = request_context
    if rc is None:
        return ContextSections()
    # Several repositories get one blank line between them; the outer tag keeps them together.
    git = "\n\n".join(_git_repo(r) for r in rc.git_repos if r.path or r.status or r.branch_name)
    return ContextSections(
        user_info=_user_info(rc.env),
        git_status=f"<git_status>\n{git}\n</git_status>" if git else "",
        rules=_section("rules", (_rule(r) for r in [*rc.rules, *rc.non_file_rules])),
        # Skills are listed, not inlined: the model reads a skill's file when its description fits.
        agent_skills=_section(
            "agent_skills",
            (
                _block("skill", s.description, path=s.full_path)
                for s in rc.agent_skills
                if not s.disable_model_invocation and (s.description or s.full_path)
            ),
        ),
        subagents=_section(
            "subagents",
            (_block("subagent", s.description, name=s.name, path=s.full_path) for s in rc.custom_subagents),
        ),
        mcp_instructions=_section(
            "mcp_instructions",
            (
                _block("mcp_server", m.instructions, name=m.server_name or m.server_identifier)
                for m in rc.mcp_instructions
                if m.instructions.strip()
            ),
        ),
        project_layout=_section("project_layout", ("\n".join(_tree(n)) for n in rc.project_layouts)),
    )


def _open_files(request_context: agent.RequestContext | None) -> str:
    if request_context is None:
        return ""
    files = request_context.file_contents
    # The map's wire order is not meaningful; sorting keeps the message bytes stable.
    return _section("open_files", (_block("file", files[path], path=path) for path in sorted(files)))


def _span(rng: agent.Range | None) -> str:
    if rng is None or rng.start is None:
        return ""
    end = rng.end.line if rng.end is not None else rng.start.line
    return f"{rng.start.line}-{end}"


def _selected_items(sc: agent.SelectedContext) -> Iterable[str]:
    # Textual parts, in a fixed order, and where the images are: their bytes travel as the
    # message's image parts, in the same order (cursor/pasted_images.py). Other binary
    # attachments (videos, documents, browsers) and opaque references (invocation context,
    # recent agents, agentic git actions) carry no text the model could use here.
    for n, image in enumerate(sc.selected_images, start=1):
        yield _block("image", "", index=str(n), path=image.path)
    for f in sc.files:
        yield _block("file", f.content, path=f.relative_path or f.path)
    for c in sc.code_selections:
        yield _block("code_selection", c.content, path=c.relative_path or c.path, lines=_span(c.range))
    for t in sc.terminals:
        yield _block("terminal", t.content, title=t.title or "", path=t.path or "")
    for t in sc.terminal_selections:
        yield _block("terminal_selection", t.content, title=t.title or "", lines=_span(t.range))
    for d in sc.folders:
        tree = "\n".join(_tree(d.directory_tree)) if d.directory_tree else ""
        yield _block("folder", tree, path=d.relative_path or d.path)
    for r in sc.cursor_rules:
        yield _rule(r.rule) if r.rule is not None else ""
    for cmd in sc.cursor_commands:
        yield _block("command", cmd.content, name=cmd.name)
    for skill in sc.selected_skills:
        yield _block("skill", skill.content, path=skill.full_path)
    if sc.git_diff is not None:
        yield _block("git_diff", sc.git_diff.content)
    if sc.git_diff_from_branch_to_main is not None:
        yield _block("branch_diff", sc.git_diff_from_branch_to_main.content)
    for commit in sc.git_commits:
        parts = (commit.message, commit.description or "", commit.diff)
        yield _block("git_commit", "\n\n".join(p for p in parts if p), sha=commit.sha)
    for link in sc.external_links:
        yield _block("link", link.pdf_content or "", url=link.url, filename=link.filename or "")
    for pr in sc.selected_pull_requests:
        yield _block(
            "pull_request", pr.description or "", number=str(pr.number), url=pr.url, title=pr.title or ""
        )
    for doc in sc.documentations:
        yield _block("documentation", "", name=doc.name)
    for log in sc.console_logs:
        yield _block("console_log", log.message, level=log.level)
    for ui in sc.ui_elements:
        yield _block(
            "ui_element", ui.element, xpath=ui.xpath, text=ui.text_content, component=ui.component or ""
        )
    for chat in sc.past_chats:
        yield _block("past_chat", "", name=chat.name, id=chat.agent_id)
    for sub in sc.selected_subagents:
        yield _block("subagent", "", name=sub.name)
    for text in [*sc.extra_context, *(e.data for e in sc.extra_context_entries if e.data)]:
        yield _block("extra_context", text)


def _selected_context(selected: agent.SelectedContext | None) -> str:
    return _section("selected_context", _selected_items(selected)) if selected is not None else ""


def render_runtime_message(
    template: str,
    *,
    user_message: agent.UserMessage,
    request_context: agent.RequestContext | None,
    now_iso: str,
    time_zone: str | None,
) -> str:
    """Render ``template`` for one RunRequest. Pure: the same inputs give the same string.

    ``time_zone`` falls back to the request's ``env.time_zone`` when None.
    """
    validate_template(template)
    env = request_context.env if request_context is not None else None
    zone = time_zone if time_zone is not None else (env.time_zone if env is not None else "")
    values = {
        "REQUEST_CONTEXT": request_context_sections(request_context).joined(),
        "OPEN_FILES": _open_files(request_context),
        "SELECTED_CONTEXT": _selected_context(user_message.selected_context),
        "TIMESTAMP": f"{now_iso} ({zone})" if zone else now_iso,
        # Verbatim: the user's text is never stripped, escaped or re-scanned for placeholders.
        "USER_QUERY": f"<user_query>\n{user_message.text}\n</user_query>",
    }

    def substitute(match: re.Match[str]) -> str:
        if match.group("line") is not None:
            value = values[match.group("line")]
            return value + match.group("tail") if value else ""
        return values[match.group("inline")]

    # Collapse blank-line runs in the (trusted) template before the single substitution pass; doing
    # it afterwards would also rewrite user text.
    skeleton = _BLANK_RUN.sub("\n\n", template.strip())
    # Values start and end with a tag or the timestamp, so trimming the ends never touches user text.
    return _SUBSTITUTION.sub(substitute, skeleton).strip("\n")


def build_runtime_message(
    template: str,
    *,
    request_id: str,
    user_message: agent.UserMessage,
    request_context: agent.RequestContext | None,
    now_iso: str,
    time_zone: str | None,
    images: tuple[ImagePart, ...] = (),
) -> Message:
    """The run's runtime message; ``images``: the message's images (resolve_images), in order."""
    text = render_runtime_message(
        template,
        user_message=user_message,
        request_context=request_context,
        now_iso=now_iso,
        time_zone=time_zone,
    )
    return Message(
        role="user", origin="runtime", text=text, event_id=f"run-request:{request_id}", attachments=images
    )
