"""Who may change a server's state: the admin credential (`--admin-api-key`), kept apart from the client key.

A router's `POST /workers` and `DELETE /workers` decide where every user's requests go, and which servers get
the router's `--worker-api-key` on their health checks: they are admin writes. An admin write needs the admin
key; the client key (`--api-key`) never opens one. A server started without an admin key has no admin writes
at all: each is a 403 `admin_api_disabled` that names the flag. Reading (`GET /workers`) stays a client route.

`server.middleware.AuthAndMetrics` applies this before the app sees the request, so before the body is read
or any address in it is looked at: a caller without the admin key learns nothing from an admin route but that
it is refused. The admin key also opens every client route, so an operator needs one key, not two.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenfront.core.errors import TokenfrontError
from tokenfront.server.errors import error_response
from tokenfront.server.responses import JSONBytesResponse

__all__ = ["ADMIN_KEY_ENV", "ADMIN_KEY_FLAG", "READ_METHODS", "AdminAccess"]

ADMIN_KEY_FLAG = "--admin-api-key"
ADMIN_KEY_ENV = "TOKENFRONT_ADMIN_API_KEY"
# What an admin path answers to anyone with the client key; every other method on it is a write.
READ_METHODS = frozenset({"GET", "HEAD"})


@dataclass(frozen=True)
class AdminAccess:
    """A server's admin paths, and the key that opens writes to them (`key` None: admin writes are off)."""

    paths: frozenset[str]
    key: str | None = None

    def __post_init__(self) -> None:
        if self.key is not None and not self.key.strip():
            raise TokenfrontError(
                f"{ADMIN_KEY_FLAG} (or ${ADMIN_KEY_ENV}) is empty: give a key, or unset it to keep the admin "
                "API off"
            )

    def guards(self, method: str, path: str) -> bool:
        """Whether a request is an admin write: a method other than GET or HEAD on an admin path (with or
        without a trailing `/`)."""
        return method not in READ_METHODS and (path.rstrip("/") or "/") in self.paths

    def refusal(self, method: str, path: str, *, admitted: bool) -> JSONBytesResponse | None:
        """The answer to an admin write (`guards` true) sent with the admin key (`admitted`) or not; None when
        it may go on."""
        if self.key is None:
            return error_response(
                403,
                f"{method} {path} changes this server's state, and its admin API is off: start it with "
                f"{ADMIN_KEY_FLAG} KEY (or ${ADMIN_KEY_ENV}) and send `Authorization: Bearer KEY`; the client "
                "key (--api-key) never opens admin writes",
                code="admin_api_disabled",
            )
        if admitted:
            return None
        return error_response(
            401,
            f"{method} {path} needs the admin key: send `Authorization: Bearer <key>` with the key of "
            f"{ADMIN_KEY_FLAG}; the client key (--api-key) does not open admin writes",
            code="invalid_admin_api_key",
        )
