"""The refusals of the served model: the stream ids it takes, the WebSocket
close codes (RFC 6455 section 7.4, and 4000-4999 for this application) and
their HTTP statuses, the reasons they count under in the metrics, and
:class:`Refused`, which carries them."""
import re

STREAM_ID = re.compile(r"[A-Za-z0-9_.\-]{1,64}")

# WebSocket close codes (RFC 6455 section 7.4, and 4000-4999 for this application);
# picows sends 1002, 1007 (a close frame's reason that is not UTF-8) and 1009 itself
PROTOCOL_ERROR, UNSUPPORTED, INVALID, POLICY, TOO_BIG = 1002, 1003, 1007, 1008, 1009
INTERNAL, RESTART, TRY_LATER = 1011, 1012, 1013
UNAUTHORIZED, FORBIDDEN = 4401, 4403   # no token where one is needed; a wrong one
NOT_FOUND, CONFLICT, GONE = 4404, 4409, 4410
CLOSE_WAIT = 5.0   # seconds a client has to answer the server's close frame

# every reason a refusal counts under in fastln_serve_rejections_total (the
# serving guide's table says which refusal counts under which)
REASON_NAMES = ("bad_frame", "frame_too_large", "bad_request", "body_too_large",
                "no_token", "wrong_token", "no_admin_token", "wrong_admin_token",
                "not_found", "conflict", "gone", "bad_state", "table_full", "queue_full",
                "too_many_connections", "too_many_streams", "draining", "store_down",
                "lease_lapsed")
# the reason of a close code that has one meaning; a refusal with another
# code (1012, 1013: several meanings) names its reason. The closes of a
# restart (1012) and a move (4410) to connections that hold a stream, and a
# failed step (1011), are not refusals and count nowhere.
REASONS = {PROTOCOL_ERROR: "bad_frame", UNSUPPORTED: "bad_frame", INVALID: "bad_frame",
           POLICY: "bad_request", TOO_BIG: "frame_too_large", UNAUTHORIZED: "no_token",
           FORBIDDEN: "wrong_token", NOT_FOUND: "not_found", CONFLICT: "conflict"}


class Refused(Exception):
    """A request the server refuses: a WebSocket close code (None for a
    refusal of HTTP alone) and an HTTP status, why, the reason it counts
    under in the metrics (one of REASON_NAMES; by default that of the code,
    REASONS), and headers for the HTTP answer."""

    def __init__(self, code, status, message, reason=None, headers=None):
        super().__init__(message)
        self.code, self.status, self.message, self.headers = code, status, message, headers
        self.reason = reason or REASONS[code]


def check_stream_id(stream_id):
    """stream_id, or Refused (1008, HTTP 422) when it is not a string of 1 to
    64 letters, digits, '_', '.' and '-'."""
    if isinstance(stream_id, str) and STREAM_ID.fullmatch(stream_id):
        return stream_id
    if not isinstance(stream_id, str):
        got = f"a {type(stream_id).__name__}"
    else:   # repr escapes what is not printable, a lone surrogate included
        got = f"{len(stream_id)} characters" if len(stream_id) > 20 else repr(stream_id)
    raise Refused(POLICY, 422, f"a stream id is 1 to 64 letters, digits, '_', '.' or '-', "
                               f"got {got}")
