"""The refusals of the served model: the stream ids it takes, the WebSocket
close codes (RFC 6455 section 7.4, and 4000-4999 for this application) and
their HTTP statuses, and :class:`Refused`, which carries both."""
import re

STREAM_ID = re.compile(r"[A-Za-z0-9_.\-]{1,64}")

# WebSocket close codes (RFC 6455 section 7.4, and 4000-4999 for this application)
UNSUPPORTED, INVALID, POLICY = 1003, 1007, 1008   # 1009: picows, past --max-frame
INTERNAL, RESTART, TRY_LATER = 1011, 1012, 1013
UNAUTHORIZED, FORBIDDEN = 4401, 4403   # no token where one is needed; a wrong one
NOT_FOUND, CONFLICT, GONE = 4404, 4409, 4410
CLOSE_WAIT = 5.0   # seconds a client has to answer the server's close frame


# the reason a refusal counts under in the metrics, by close code (a Refused
# may name a finer one); the codes not here (1011, 1012, 4410) are not refusals
REASONS = {UNSUPPORTED: "bad_frame", INVALID: "bad_frame", POLICY: "bad_request",
           TRY_LATER: "overloaded", UNAUTHORIZED: "no_token", FORBIDDEN: "wrong_token",
           NOT_FOUND: "not_found", CONFLICT: "conflict"}
# every reason, so that each counter exists from the start
REASON_NAMES = sorted({*REASONS.values(), "table_full", "queue_full", "too_many_connections",
                       "draining", "bad_state"})


class Refused(Exception):
    """A request the server refuses: a WebSocket close code (or HTTP status),
    why, and the reason it counts under in the metrics (REASON_NAMES; by
    default that of the code)."""

    def __init__(self, code, status, message, reason=None):
        super().__init__(message)
        self.code, self.status, self.message = code, status, message
        self.reason = reason or REASONS.get(code, "bad_request")
