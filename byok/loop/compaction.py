"""Compaction as values: when a request would not fit, the summary message that replaces the
history, and how many summaries a history holds (sans-IO; the turn machine decides with these).

A compacted history starts over with the summary, a ``role=user, origin=summary`` message (and
the user's new message when the turn compacts before its first call). It is committed as a new
root revision, so the older messages stay in the store and in
their revisions (history is append-only; an edit or a restore of an older checkpoint still finds
them) and leave the provider's projection.
"""

from __future__ import annotations

from byok.model.messages import Message
from byok.model.usage import Usage

# A token is about four characters of English and fewer of code or other scripts: three keeps
# the estimate on the safe side (an early compaction costs a call, a late one fails the turn).
_CHARS_PER_TOKEN = 3
# Kept free for the model's answer and the estimate's error, besides its output limit.
_HEADROOM_SHARE = 0.10
_DEFAULT_OUTPUT_RESERVE = 8192


def tokens_of(text: str) -> int:
    return (len(text) + _CHARS_PER_TOKEN - 1) // _CHARS_PER_TOKEN


def context_limit(context_tokens: int, max_output_tokens: int | None) -> int:
    """The most input tokens a request may have before the turn compacts its history: the
    window less the model's output limit (8,192 when unset) and a tenth of the window."""
    reserve = max_output_tokens or _DEFAULT_OUTPUT_RESERVE
    return max(0, int(context_tokens * (1 - _HEADROOM_SHARE)) - reserve)


def next_request(usage: Usage) -> int:
    """The next request of the turn holds this call's prompt and its output, at least."""
    return usage.input_tokens + usage.output_tokens


def kept_tail(messages: tuple[Message, ...]) -> int:
    """Where the summarized part of ``messages`` ends: a history that ends with the user's new
    message (the turn compacts before its first call) keeps that message as it is, after the
    summary; any other history is summarized whole."""
    if messages and messages[-1].role == "user" and messages[-1].origin in ("user", "runtime"):
        return len(messages) - 1
    return len(messages)


def worth_compacting(messages: tuple[Message, ...], limit: int) -> bool:
    """Whether compacting ``messages`` before the turn's first call could make it fit: there is
    history before the user's new message, and the new message alone fits."""
    cut = kept_tail(messages)
    return cut > 0 and sum(tokens_of(m.text) for m in messages[cut:]) < limit


def summary_count(messages: tuple[Message, ...]) -> int:
    """How many times the history was compacted: the count the summary heading it carries."""
    if not messages or messages[0].origin != "summary":
        return 0
    _, count, _ = messages[0].event_id.split(":", 2)
    return int(count)


def heading_summary(messages: tuple[Message, ...]) -> str:
    """The event id of the summary ``messages`` start with ("" when they do not)."""
    return messages[0].event_id if messages and messages[0].origin == "summary" else ""


def first_call_on_summary(messages: tuple[Message, ...]) -> bool:
    """Whether a model call on ``messages`` may be the first on the summary they start with: no
    answer follows it yet. A history whose summary a model has answered after is one the
    provider has seen already (a restarted daemon cannot know it from its memory)."""
    return bool(heading_summary(messages)) and not any(m.role == "assistant" for m in messages[1:])


def summary_message(summary: str, request_id: str, count: int) -> Message:
    """The message a compacted history starts with; ``count``: this summary's number (1 for the
    first compaction of the conversation)."""
    text = (
        "This conversation was compacted: what happened before this point is summarized below.\n\n"
        f"<conversation_summary>\n{summary.strip()}\n</conversation_summary>\n\n"
        "Continue from where the summary ends. If a task was in progress, carry on with it; do not "
        "ask the user to repeat what the summary already says."
    )
    return Message(role="user", origin="summary", text=text, event_id=f"summary:{count}:{request_id}")


def summary_text(message: Message) -> str:
    """The summary itself, as the model wrote it, from a summary message."""
    start = message.text.find("<conversation_summary>\n")
    end = message.text.rfind("\n</conversation_summary>")
    if start < 0 or end < start:
        return message.text
    return message.text[start + len("<conversation_summary>\n") : end]
