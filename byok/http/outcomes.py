"""A run's outcome as its stream's last frame (Connect EndStream), and back for refusals."""

from __future__ import annotations

from byok.http.connect_envelope import ConnectError, end_stream_error, end_stream_ok, provider_error_details
from byok.loop.turn_values import Canceled, Failed, Outcome, Succeeded


def end_stream_for(outcome: Outcome) -> bytes:
    match outcome:
        case Succeeded():
            return end_stream_ok()
        case Canceled():
            return end_stream_error(ConnectError("canceled", "run was cancelled"))
        case Failed(code=code, message=message, provider=provider):
            # A provider's failure carries ErrorDetails: Cursor shows its card (retry button...).
            details = provider_error_details(message) if provider else None
            return end_stream_error(ConnectError(code, message, details))  # type: ignore[arg-type]
    raise AssertionError(f"not an outcome: {outcome!r}")


def failed(err: ConnectError) -> Failed:
    """A refusal decided in http/ (a bad run_request, a broken stream), as the run's outcome."""
    return Failed(err.code, err.message)
